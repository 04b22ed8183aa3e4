//! The cache growing, as one SVG picture: a column per step, a row per position. With the cache
//! (left), each column holds the positions cached so far, shaded by the step's query weight on
//! them, and the rows the step wrote are outlined; without it (right), every position up to the
//! step's is run again. Under each column, how many times more multiply-adds the step needs
//! without the cache.

use super::cache::CacheView;
use super::grid::{shade, xml_escape, WRITTEN};
use std::fmt::Write as _;

const CELL: f64 = 12.0;
const LABEL_W: f64 = 150.0;
const TOP: f64 = 56.0;

pub fn svg(v: &CacheView) -> String {
    let steps = v.steps.len();
    let n = v.steps.last().map_or(0, |s| s.written[1]);
    let panel_w = steps as f64 * CELL;
    let gap = 40.0;
    let width = (LABEL_W + 2.0 * panel_w + gap + 20.0).max(720.0);
    let height = TOP + n as f64 * CELL + 60.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="monospace" font-size="10">"#
    );
    out.push_str(r##"<rect width="100%" height="100%" fill="#fff"/>"##);
    let _ = writeln!(
        out,
        r#"<text x="4" y="14" font-size="13">{}</text>"#,
        xml_escape(&format!("The KV cache of {}, layer {} head {}, step by step", v.model, v.layer, v.head))
    );
    let _ = writeln!(
        out,
        r#"<text x="{LABEL_W}" y="34">with the cache: shade = the step's query weight; outlined = written by the step</text>"#
    );
    let x_un = LABEL_W + panel_w + gap;
    let _ = writeln!(
        out,
        r#"<text x="{LABEL_W}" y="48">without the cache (right): every position up to the step's runs again</text>"#
    );
    for (pos, t) in v.tokens.iter().enumerate().take(n) {
        let y = TOP + pos as f64 * CELL;
        let label: String = format!("{pos} {}", super::axis_label(t)).chars().take(20).collect();
        let _ = writeln!(out, r#"<text x="4" y="{:.1}">{}</text>"#, y + 9.0, xml_escape(&label));
    }
    for (s, st) in v.steps.iter().enumerate() {
        let [a, b] = st.written;
        let x = LABEL_W + s as f64 * CELL;
        let weights = &st.weights[v.layer][v.head];
        for (pos, &w) in weights.iter().enumerate().take(b) {
            let y = TOP + pos as f64 * CELL;
            let [r, g, bl] = shade(w);
            let _ = write!(
                out,
                r#"<rect class="w" x="{x:.1}" y="{y:.1}" width="{CELL}" height="{CELL}" fill="rgb({r},{g},{bl})" data-step="{s}" data-pos="{pos}" data-w="{w}"/>"#
            );
            if pos >= a {
                let _ = write!(
                    out,
                    r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="{WRITTEN}" stroke-width="2"/>"#,
                    x + 1.0,
                    y + 1.0,
                    CELL - 2.0,
                    CELL - 2.0
                );
            }
            let xu = x_un + s as f64 * CELL;
            let _ = write!(
                out,
                r##"<rect class="recomputed" x="{xu:.1}" y="{y:.1}" width="{CELL}" height="{CELL}" fill="{WRITTEN}" stroke="#fff" stroke-width="0.5" data-step="{s}" data-pos="{pos}"/>"##
            );
        }
        out.push('\n');
        let y = TOP + n as f64 * CELL + 14.0;
        let ratio = st.work.ratio.macs;
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{y:.1}" transform="rotate(90 {:.1} {y:.1})" data-step="{s}">{ratio:.1}×</text>"#,
            x + 3.0,
            x + 3.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="4" y="{:.1}">×: multiply-adds without ÷ with the cache</text>"#,
        TOP + n as f64 * CELL + 50.0
    );
    out.push_str("</svg>\n");
    out
}
