//! A [`Grid`] as terminal text: key labels written downwards above their columns, query (or head)
//! labels at the left, each weight printed in its cell over the scale's colour, a colour-scale
//! line with values, and a divider above the rows decoded with the KV cache on.

use super::{axis_label, dark, shade, truncate, Grid};
use std::fmt::Write as _;

/// How colours reach the terminal.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Colors {
    /// 24-bit colour: the scale's exact colours.
    Truecolor,
    /// The xterm 256-colour palette: the nearest of its colours.
    Ansi256,
}

impl Colors {
    /// What the terminal says it supports (`COLORTERM=truecolor` or `24bit`), else 256 colours.
    pub fn detect() -> Colors {
        match std::env::var("COLORTERM").as_deref() {
            Ok("truecolor" | "24bit") => Colors::Truecolor,
            _ => Colors::Ansi256,
        }
    }

    fn background(self, rgb: [u8; 3]) -> String {
        match self {
            Colors::Truecolor => format!("\x1b[48;2;{};{};{}m", rgb[0], rgb[1], rgb[2]),
            Colors::Ansi256 => format!("\x1b[48;5;{}m", ansi256(rgb)),
        }
    }
}

const RESET: &str = "\x1b[0m";
/// Terminal columns per key: a space and three characters (".43", "1.0").
pub const CELL: usize = 4;
/// Key labels are written downwards, at most this many characters each.
const LABEL_LINES: usize = 6;
/// Row labels are cut to this many characters.
const ROW_LABEL: usize = 12;

/// The nearest colour of the xterm 256-colour palette (its 6×6×6 cube or its grey ramp).
pub fn ansi256(rgb: [u8; 3]) -> u8 {
    const LEVELS: [i32; 6] = [0, 95, 135, 175, 215, 255];
    let near = |v: u8| (0..6).min_by_key(|&i| (LEVELS[i] - v as i32).abs()).unwrap();
    let cube = rgb.map(near);
    let cube_rgb = cube.map(|i| LEVELS[i]);
    let mean = rgb.iter().map(|&v| v as i32).sum::<i32>() / 3;
    let grey = ((mean - 8).max(0) / 10).min(23);
    let grey_v = 8 + 10 * grey;
    let dist = |c: [i32; 3]| -> i32 { (0..3).map(|i| (c[i] - rgb[i] as i32).pow(2)).sum() };
    if dist([grey_v; 3]) < dist(cube_rgb) {
        232 + grey as u8
    } else {
        16 + 36 * cube[0] as u8 + 6 * cube[1] as u8 + cube[2] as u8
    }
}

/// A weight in three characters: ".43", "1.0", ".00".
fn cell_text(w: f32) -> String {
    let r = (w * 100.0).round() / 100.0;
    if r >= 1.0 {
        "1.0".to_string()
    } else {
        format!(".{:02}", (r * 100.0).round() as u32)
    }
}

fn width(s: &str) -> usize {
    console::measure_text_width(s)
}

fn pad_left(s: &str, w: usize) -> String {
    format!("{}{s}", " ".repeat(w.saturating_sub(width(s))))
}

fn pad_right(s: &str, w: usize) -> String {
    format!("{s}{}", " ".repeat(w.saturating_sub(width(s))))
}

/// The width a row label takes in the heatmap.
pub fn row_label_width(label: &str) -> usize {
    width(&truncate(&axis_label(label), ROW_LABEL))
}

/// How many of the last `keys` key columns a heatmap `width` columns wide can show: all of
/// them if they fit, else the most that fit beside the ‹ column. `label_width(n)` is how wide
/// the row labels are when the last `n` are shown. At least one.
pub fn window_that_fits(width: usize, keys: usize, label_width: impl Fn(usize) -> usize) -> usize {
    let used = |n: usize, window: bool| 4 + 1 + label_width(n) + 2 + CELL * (n + usize::from(window));
    if used(keys, false) <= width {
        return keys;
    }
    (1..keys).rev().find(|&n| used(n, true) <= width).unwrap_or(1)
}

/// The colour-scale line: five swatches with their values, or how to get colours.
pub fn legend(colors: Option<Colors>) -> String {
    match colors {
        Some(c) => {
            let mut out = String::from("scale ");
            for w in [0.0, 0.25, 0.5, 0.75, 1.0] {
                let rgb = shade(w);
                let fg = if dark(rgb) { "\x1b[97m" } else { "\x1b[30m" };
                let _ = write!(out, "{}{fg} {:.2} {RESET}", c.background(rgb), w);
            }
            out.push_str(" (darker is more weight)");
            out
        }
        None => "the cells are the weights (colours: a terminal without NO_COLOR, or --color always)".to_string(),
    }
}

/// The grid as text, `colors` or plain. Every line is as wide as the row labels plus
/// [`CELL`] per column.
pub fn heatmap(g: &Grid, colors: Option<Colors>) -> String {
    let row_labels: Vec<String> = g.rows.iter().map(|t| truncate(&axis_label(&t.label), ROW_LABEL)).collect();
    let lw = row_labels.iter().map(|l| width(l)).max().unwrap_or(0);
    let prefix = 4 + 1 + lw + 2;
    let col_labels: Vec<Vec<String>> = g
        .cols
        .iter()
        .map(|t| truncate(&axis_label(&t.label), LABEL_LINES).chars().map(String::from).collect())
        .collect();
    let lines = col_labels.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = String::new();
    // Key labels, downwards and bottom-aligned, then key positions.
    for i in 0..lines {
        out.push_str(&" ".repeat(prefix));
        if g.before.is_some() {
            out.push_str(&" ".repeat(CELL));
        }
        for chars in &col_labels {
            let skip = lines - chars.len();
            let c = if i >= skip { chars[i - skip].as_str() } else { "" };
            out.push_str(&pad_left(c, CELL));
        }
        out.push('\n');
    }
    let _ = write!(out, "{} │", pad_right(&format!("{:>4}", g.corner), 4 + 1 + lw));
    if g.before.is_some() {
        out.push_str(&pad_left("‹", CELL));
    }
    for t in &g.cols {
        out.push_str(&pad_left(&t.index.to_string(), CELL));
    }
    out.push('\n');
    let cells_w = CELL * (g.cols.len() + usize::from(g.before.is_some()));
    for (r, t) in g.rows.iter().enumerate() {
        if g.decoded_from == Some(r) {
            let text = "─ decoded with the KV cache on ";
            let _ =
                writeln!(out, "{}┼{text}{}", "─".repeat(prefix - 1), "─".repeat(cells_w.saturating_sub(width(text))));
        }
        let _ = write!(out, "{:>4} {} │", t.index, pad_right(&row_labels[r], lw));
        let mut cell = |w: Option<f32>| match (w, colors) {
            (None, _) => out.push_str(&" ".repeat(CELL)),
            (Some(w), None) => out.push_str(&pad_left(&cell_text(w), CELL)),
            (Some(w), Some(c)) => {
                let rgb = shade(w);
                let fg = if dark(rgb) { "\x1b[97m" } else { "\x1b[30m" };
                let _ = write!(out, "{}{fg}{}{RESET}", c.background(rgb), pad_left(&cell_text(w), CELL));
            }
        };
        if let Some(before) = &g.before {
            cell(Some(before[r]));
        }
        for c in 0..g.cols.len() {
            cell(g.cell(r, c));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_read_as_two_decimals() {
        assert_eq!(cell_text(0.0), ".00");
        assert_eq!(cell_text(0.434), ".43");
        assert_eq!(cell_text(0.996), "1.0");
        assert_eq!(cell_text(1.0), "1.0");
    }

    #[test]
    fn the_256_colour_fallback_is_the_nearest_palette_entry() {
        assert_eq!(ansi256([0, 0, 0]), 16);
        assert_eq!(ansi256([255, 255, 255]), 231);
        assert_eq!(ansi256([0x08, 0x30, 0x6b]), 16 + 6 + 1); // (0, 95, 95): the cube's nearest
        assert_eq!(ansi256([128, 128, 128]), 244); // grey 8 + 10·12
    }

    #[test]
    fn the_window_is_the_widest_that_fits_with_its_own_labels() {
        // 10 keys of 4 columns and labels 5 wide: 4+1+5+2 + 40 = 52 columns.
        assert_eq!(window_that_fits(52, 10, |_| 5), 10);
        // One column less: a window, with the ‹ column: 12 + 4·(n + 1) ≤ 51, so n = 8.
        assert_eq!(window_that_fits(51, 10, |_| 5), 8);
        // Labels that narrow as the window shrinks leave room for more keys.
        assert_eq!(window_that_fits(51, 10, |n| if n > 9 { 12 } else { 1 }), 9);
        assert_eq!(window_that_fits(10, 10, |_| 12), 1);
    }
}
