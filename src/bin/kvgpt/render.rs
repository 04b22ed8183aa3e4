//! Drawing attention matrices: a terminal heatmap, and an SVG / standalone HTML grid of every
//! layer × head (a bertviz-style model view).

use std::fmt::Write as _;

/// One attention matrix to draw: `[S, S]` weights of a layer and head.
pub struct Matrix<'a> {
    pub layer: usize,
    pub head: usize,
    pub weights: &'a [f32],
}

/// A probability as people read it: four decimals, or scientific notation where those would
/// show 0.
pub fn prob(p: f64) -> String {
    if p >= 1e-4 {
        format!("{p:.4}")
    } else {
        format!("{p:.1e}")
    }
}

/// A token label as it reads on one line: quoted, control characters escaped.
pub fn label(text: &str) -> String {
    format!("{text:?}")
}

/// The matrix `[query, key]` as text rows with token labels; with `color`, each cell gets a
/// background shade (256-colour palette) proportional to its weight.
pub fn heatmap(m: &Matrix, tokens: &[String], color: bool) -> String {
    let s = tokens.len();
    let labels: Vec<String> = tokens.iter().map(|t| truncate(&label(t), 14)).collect();
    let w = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    let _ = write!(out, "{:>4} {:<w$} │", "q\\k", "");
    for k in 0..s {
        let _ = write!(out, "{k:>5}");
    }
    out.push('\n');
    for (q, lab) in labels.iter().enumerate() {
        let _ = write!(out, "{q:>4} {lab:<w$} │");
        for k in 0..s {
            let a = m.weights[q * s + k];
            if k > q {
                out.push_str("     ");
            } else if color {
                // Grey ramp 232 (dark) .. 255 (light); dark text on light cells.
                let level = 232 + (a.clamp(0.0, 1.0) * 23.0).round() as u8;
                let fg = if level > 243 { 16 } else { 255 };
                let _ = write!(out, "\x1b[48;5;{level}m\x1b[38;5;{fg}m{a:>5.2}\x1b[0m");
            } else {
                let _ = write!(out, "{a:>5.2}");
            }
        }
        out.push('\n');
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// An SVG grid of heatmaps, one per matrix, laid out by layer (rows) and head (columns).
pub fn svg(matrices: &[Matrix], tokens: &[String], title: &str) -> String {
    let s = tokens.len().max(1);
    let cell = (240.0 / s as f64).clamp(2.0, 14.0);
    let side = cell * s as f64;
    let label_w = if s <= 40 { 90.0 } else { 0.0 };
    let pad = 28.0;
    let layers: Vec<usize> = dedup(matrices.iter().map(|m| m.layer));
    let heads: Vec<usize> = dedup(matrices.iter().map(|m| m.head));
    let panel_w = label_w + side + pad;
    let panel_h = side + pad + 16.0;
    let width = 20.0 + panel_w * heads.len() as f64;
    let height = 50.0 + panel_h * layers.len() as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="monospace" font-size="9">"#
    );
    let _ = writeln!(out, r#"<title>{}</title>"#, xml_escape(title));
    let _ = writeln!(out, r#"<text x="10" y="20" font-size="14">{}</text>"#, xml_escape(title));
    for m in matrices {
        let li = layers.iter().position(|&l| l == m.layer).unwrap_or(0);
        let hi = heads.iter().position(|&h| h == m.head).unwrap_or(0);
        let x0 = 10.0 + hi as f64 * panel_w + label_w;
        let y0 = 50.0 + li as f64 * panel_h;
        let _ = writeln!(
            out,
            r#"<g class="head" id="L{l}-H{h}" data-layer="{l}" data-head="{h}" transform="translate({x0:.1},{y0:.1})">"#,
            l = m.layer,
            h = m.head
        );
        let _ = writeln!(out, r#"<text x="0" y="-4" font-size="11">layer {} head {}</text>"#, m.layer, m.head);
        let _ =
            writeln!(out, r##"<rect x="0" y="0" width="{side:.1}" height="{side:.1}" fill="#fff" stroke="#999"/>"##);
        for q in 0..s {
            for k in 0..=q {
                let a = m.weights[q * s + k];
                if a < 0.005 {
                    continue;
                }
                let _ = writeln!(
                    out,
                    r##"<rect x="{:.1}" y="{:.1}" width="{cell:.1}" height="{cell:.1}" fill="#08306b" fill-opacity="{a:.2}"><title>{} → {}: {a:.4}</title></rect>"##,
                    k as f64 * cell,
                    q as f64 * cell,
                    xml_escape(&label(&tokens[q])),
                    xml_escape(&label(&tokens[k])),
                );
            }
        }
        if label_w > 0.0 {
            for (q, t) in tokens.iter().enumerate() {
                let _ = writeln!(
                    out,
                    r#"<text x="-3" y="{:.1}" text-anchor="end" font-size="{:.0}">{}</text>"#,
                    q as f64 * cell + cell * 0.8,
                    cell.clamp(5.0, 9.0),
                    xml_escape(&truncate(&label(t), 12))
                );
            }
        }
        out.push_str("</g>\n");
    }
    out.push_str("</svg>\n");
    out
}

/// A standalone HTML page around the SVG grid, with the tokens listed (tooltips show each weight).
pub fn html(matrices: &[Matrix], tokens: &[String], title: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>");
    let _ = writeln!(out, "<title>{}</title>", xml_escape(title));
    out.push_str(
        "<style>body{font-family:system-ui,sans-serif;margin:1.5em}code{background:#eef;padding:0 .2em}\
         .tok{display:inline-block;margin:.1em;padding:.1em .3em;border:1px solid #ccd;border-radius:3px;font-family:monospace}\
         svg rect:hover{stroke:#e6550d;stroke-width:1}</style>\n</head>\n<body>\n",
    );
    let _ = writeln!(out, "<h1>{}</h1>", xml_escape(title));
    out.push_str("<p>Rows are queries, columns keys; darker is more weight. Hover a cell for its value.</p>\n<p>");
    for (i, t) in tokens.iter().enumerate() {
        let _ = write!(out, "<span class=\"tok\">{i}: {}</span>", xml_escape(&label(t)));
    }
    out.push_str("</p>\n");
    out.push_str(&svg(matrices, tokens, title));
    out.push_str("</body>\n</html>\n");
    out
}

fn dedup(it: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut v: Vec<usize> = it.collect();
    v.sort_unstable();
    v.dedup();
    v
}
