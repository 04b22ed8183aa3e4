//! [`Grid`]s as one SVG picture: panels in rows, each with its key labels above the columns
//! (turned upright), query (or head) labels at the left, cells in the scale's colours with their
//! value as a tooltip, masked cells grey, a divider above the rows decoded with the KV cache on,
//! and a colour bar with values.

use super::grid::{axis_label, hex, shade, truncate, xml_escape, Grid, Tick, MASKED};
use std::fmt::Write as _;

/// The colour of the dashed line above the rows decoded with the KV cache on: black, which is
/// neither on the scale nor a head's colour in the HTML viewer.
pub const DIVIDER: &str = "#000000";
const LABEL_CHARS: usize = 12;

/// Panel geometry, from the largest grid: cells as wide as the columns allow and as tall as the
/// rows allow (square for a query × key matrix; wide rows for one query over the heads).
struct Layout {
    cw: f64,
    ch: f64,
    /// Label font sizes across (keys) and down (rows); 0 when the cells are too small for
    /// labels, and then every few positions get their index only.
    col_font: f64,
    row_font: f64,
    label_w: f64,
    head_h: f64,
    panel_w: f64,
    panel_h: f64,
}

fn font_for(cell: f64) -> f64 {
    if cell >= 7.0 {
        cell.min(11.0) - 1.0
    } else {
        0.0
    }
}

impl Layout {
    fn new(grids: &[Grid]) -> Layout {
        let cols = grids.iter().map(|g| g.cols.len() + usize::from(g.before.is_some())).max().unwrap_or(1).max(1);
        let rows = grids.iter().map(|g| g.rows.len()).max().unwrap_or(1).max(1);
        // Up to 160 positions every label fits (a picture can be wide); beyond, cells shrink and
        // every few positions get their index.
        let side = |n: usize| (320.0 / n as f64).clamp(if n <= 160 { 7.0 } else { 3.0 }, 16.0);
        let (cw, ch) = (side(cols), side(rows));
        let (col_font, row_font) = (font_for(cw), font_for(ch));
        // The longest label drawn ("12 ·token"), across and upright.
        let longest = |ticks: &mut dyn Iterator<Item = &Tick>, font: f64| {
            let chars = ticks.map(|t| tick_text(t, font > 0.0).chars().count()).max().unwrap_or(0);
            chars.max(8) as f64 * font.max(8.0) * 0.62 + 6.0 // 8: "‹ before"
        };
        let label_w = longest(&mut grids.iter().flat_map(|g| &g.rows), row_font);
        let head_h = 18.0 + longest(&mut grids.iter().flat_map(|g| &g.cols), col_font);
        // A panel is at least as wide as its bold 12px title.
        let title_w = grids.iter().map(|g| g.title.chars().count()).max().unwrap_or(0) as f64 * 7.4 + 16.0;
        Layout {
            cw,
            ch,
            col_font,
            row_font,
            label_w,
            head_h,
            panel_w: (label_w + cw * cols as f64 + 24.0).max(title_w),
            panel_h: head_h + ch * rows as f64 + 24.0,
        }
    }
}

/// An axis label: the position (or head) and, when there is room, its token.
fn tick_text(t: &Tick, with_label: bool) -> String {
    if with_label && !t.label.is_empty() {
        format!("{} {}", t.index, truncate(&axis_label(&t.label), LABEL_CHARS))
    } else {
        t.index.to_string()
    }
}

/// The scale as a bar of 100 steps, with ticks at 0, 0.25, 0.5, 0.75 and 1, at (x, y).
fn colour_bar(out: &mut String, x: f64, y: f64) {
    let _ = writeln!(out, r#"<g class="scale" transform="translate({x:.1},{y:.1})">"#);
    let _ = writeln!(out, r#"<text x="0" y="-4" font-size="10">attention weight (darker is more)</text>"#);
    for i in 0..100 {
        let w = (i as f32 + 0.5) / 100.0;
        let _ = writeln!(
            out,
            r#"<rect x="{}" y="0" width="2.2" height="10" fill="{}" data-w="{w:.3}"/>"#,
            2 * i,
            hex(shade(w))
        );
    }
    for t in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let _ = writeln!(
            out,
            r##"<line x1="{x:.0}" y1="10" x2="{x:.0}" y2="13" stroke="#333"/><text x="{x:.0}" y="22" font-size="9" text-anchor="middle">{t}</text>"##,
            x = 200.0 * t
        );
    }
    out.push_str("</g>\n");
}

/// Where a panel's cells are inside it: their left and top edges, and the columns (the keys,
/// and the ‹ column of a window's weight before it).
struct Cells {
    gx: f64,
    gy: f64,
    /// 1 when the first column is the ‹ column.
    offset: usize,
    ncols: usize,
}

/// Font size of a label (0: the labels are too many to write each).
fn size(font: f64) -> f64 {
    if font > 0.0 {
        font
    } else {
        8.0
    }
}

/// Every how many labels one is written.
fn every(font: f64, n: usize) -> usize {
    if font > 0.0 {
        1
    } else {
        n.div_ceil(16).max(1)
    }
}

fn panel(out: &mut String, g: &Grid, lay: &Layout, x0: f64, y0: f64) {
    let _ = writeln!(
        out,
        r#"<g class="grid" data-title="{t}" transform="translate({x0:.1},{y0:.1})">"#,
        t = xml_escape(&g.title)
    );
    let _ = writeln!(out, r#"<text x="0" y="12" font-size="12" font-weight="bold">{}</text>"#, xml_escape(&g.title));
    let offset = usize::from(g.before.is_some());
    let c = Cells { gx: lay.label_w, gy: lay.head_h, offset, ncols: g.cols.len() + offset };
    column_labels(out, g, lay, &c);
    // What the rows are, at the axes' corner.
    let _ = writeln!(
        out,
        r##"<text class="corner" x="{:.1}" y="{:.1}" font-size="9" text-anchor="end" fill="#555">{}</text>"##,
        c.gx - 3.0,
        c.gy - 3.0,
        xml_escape(g.corner)
    );
    let _ = writeln!(
        out,
        r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{MASKED}"/>"#,
        c.gx,
        c.gy,
        lay.cw * c.ncols as f64,
        lay.ch * g.rows.len() as f64
    );
    for r in 0..g.rows.len() {
        row(out, g, lay, &c, r);
    }
    if let Some(r) = g.decoded_from {
        let y = c.gy + r as f64 * lay.ch;
        let _ = writeln!(
            out,
            r#"<line class="divider" x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{DIVIDER}" stroke-width="1.5" stroke-dasharray="4 3"/>"#,
            c.gx - lay.label_w + 4.0,
            c.gx + lay.cw * c.ncols as f64 + 4.0,
        );
    }
    out.push_str("</g>\n");
}

/// Key labels, upright above each column.
fn column_labels(out: &mut String, g: &Grid, lay: &Layout, c: &Cells) {
    let col_every = every(lay.col_font, c.ncols);
    let mut col_label = |i: usize, text: &str| {
        let x = c.gx + (i as f64 + 0.7) * lay.cw;
        let _ = writeln!(
            out,
            r#"<text class="col" x="{x:.1}" y="{y:.1}" font-size="{:.0}" transform="rotate(-90 {x:.1} {y:.1})">{}</text>"#,
            size(lay.col_font),
            xml_escape(text),
            y = c.gy - 3.0,
        );
    };
    if g.before.is_some() {
        col_label(0, "‹ before");
    }
    for (i, t) in g.cols.iter().enumerate() {
        if (i + c.offset).is_multiple_of(col_every) {
            col_label(i + c.offset, &tick_text(t, lay.col_font > 0.0));
        }
    }
}

/// Row `r`: its label (if written) and its cells.
fn row(out: &mut String, g: &Grid, lay: &Layout, c: &Cells, r: usize) {
    let (cw, ch, t) = (lay.cw, lay.ch, &g.rows[r]);
    let y = c.gy + r as f64 * ch;
    if r.is_multiple_of(every(lay.row_font, g.rows.len())) {
        let _ = writeln!(
            out,
            r#"<text class="row" x="{:.1}" y="{:.1}" font-size="{:.0}" text-anchor="end">{}</text>"#,
            c.gx - 3.0,
            y + ch * 0.8,
            size(lay.row_font),
            xml_escape(&tick_text(t, lay.row_font > 0.0))
        );
    }
    let query = xml_escape(&format!("{} {}", t.index, axis_label(&t.label)));
    let mut cell = |i: usize, w: f32, key: &str| {
        let _ = writeln!(
            out,
            r#"<rect class="cell" x="{:.1}" y="{y:.1}" width="{cw:.1}" height="{ch:.1}" fill="{}" data-w="{w}"><title>{query} → {key}: {w:.4}</title></rect>"#,
            c.gx + i as f64 * cw,
            hex(shade(w)),
        );
    };
    if let Some(before) = &g.before {
        cell(0, before[r], "every key before the window");
    }
    for (i, k) in g.cols.iter().enumerate() {
        if let Some(w) = g.cell(r, i) {
            cell(i + c.offset, w, &xml_escape(&format!("{} {}", k.index, axis_label(&k.label))));
        }
    }
}

/// The grids as panels, `per_row` to a row, under `title` and the colour bar.
pub fn svg(grids: &[Grid], per_row: usize, title: &str) -> String {
    let lay = Layout::new(grids);
    let per_row = per_row.clamp(1, grids.len().max(1));
    let rows = grids.len().div_ceil(per_row);
    let top = 70.0;
    // As wide as the panels, the 14px title and the legend's notes (x = 240, 9px).
    let width = (20.0 + lay.panel_w * per_row as f64).max(20.0 + title.chars().count() as f64 * 8.6).max(700.0);
    let height = top + lay.panel_h * rows as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="monospace" font-size="9">"#
    );
    let _ = writeln!(out, r#"<title>{}</title>"#, xml_escape(title));
    let _ = writeln!(out, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    let _ = writeln!(out, r#"<text x="10" y="20" font-size="14">{}</text>"#, xml_escape(title));
    colour_bar(&mut out, 10.0, 42.0);
    let _ = writeln!(
        out,
        r#"<text x="240" y="46" font-size="9">grey: masked (a key after its query) · “·” is a space</text>"#
    );
    if grids.iter().any(|g| g.decoded_from.is_some()) {
        let _ = writeln!(
            out,
            r#"<text x="240" y="58" font-size="9" fill="{DIVIDER}">dashed line: the rows below it were decoded one at a time with the KV cache on</text>"#
        );
    }
    for (i, g) in grids.iter().enumerate() {
        panel(&mut out, g, &lay, 10.0 + (i % per_row) as f64 * lay.panel_w, top + (i / per_row) as f64 * lay.panel_h);
    }
    out.push_str("</svg>\n");
    out
}
