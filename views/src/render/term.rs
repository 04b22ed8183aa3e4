//! A [`Grid`] as terminal text: key labels written downwards above their columns, query (or head)
//! labels at the left, each weight printed in its cell over the scale's colour, a colour-scale
//! line with values, and a divider above the rows decoded with the KV cache on.

use super::grid::{axis_label, dark, shade, truncate, Grid};
use std::fmt::Write as _;

/// How colours reach the terminal.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Colors {
    /// 24-bit colour: the scale's exact colours.
    Truecolor,
    /// The xterm 256-colour palette: the scale in [`RAMP_256`]'s nine steps.
    Ansi256,
}

/// The scale in the xterm 256-colour palette: one entry near each of the nine stops, chosen so
/// that each is darker than the one before (the palette's nearest colours are not: a light
/// cyan sits between two greys).
pub const RAMP_256: [u8; 9] = [231, 195, 153, 117, 74, 68, 31, 25, 18];

/// A masked cell: grey with colours (the SVG's and the viewer's #d9d9d9; in 256 colours the grey
/// ramp's 253, #dadada), `-` without.
const MASKED_RGB: [u8; 3] = [0xd9, 0xd9, 0xd9];
const MASKED_256: u8 = 253;
const MASKED_TEXT: &str = "-";

/// The RGB of an xterm 256-colour palette entry from 16 up (its 6×6×6 cube and grey ramp).
pub fn xterm_rgb(i: u8) -> [u8; 3] {
    const LEVELS: [u8; 6] = [0, 95, 135, 175, 215, 255];
    match i {
        16..=231 => {
            let c = i - 16;
            [LEVELS[(c / 36) as usize], LEVELS[(c / 6 % 6) as usize], LEVELS[(c % 6) as usize]]
        }
        232..=255 => [8 + 10 * (i - 232); 3],
        _ => [0; 3], // the 16 system colours vary by terminal; the ramp uses none
    }
}

impl Colors {
    /// What the terminal says it supports (`COLORTERM=truecolor` or `24bit`), else 256 colours.
    pub fn detect() -> Colors {
        match std::env::var("COLORTERM").as_deref() {
            Ok("truecolor" | "24bit") => Colors::Truecolor,
            _ => Colors::Ansi256,
        }
    }

    /// The escape code that paints weight `w`'s background, and the colour it paints.
    fn background(self, w: f32) -> (String, [u8; 3]) {
        match self {
            Colors::Truecolor => {
                let rgb = shade(w);
                (format!("\x1b[48;2;{};{};{}m", rgb[0], rgb[1], rgb[2]), rgb)
            }
            Colors::Ansi256 => {
                let step = if w.is_nan() { 0 } else { (w.clamp(0.0, 1.0) * 8.0).round() as usize };
                let i = RAMP_256[step];
                (format!("\x1b[48;5;{i}m"), xterm_rgb(i))
            }
        }
    }

    /// `text` over the grey of a masked cell (the pictures' grey).
    fn masked(self, text: &str) -> String {
        match self {
            Colors::Truecolor => {
                let [r, g, b] = MASKED_RGB;
                format!("\x1b[48;2;{r};{g};{b}m\x1b[30m{text}\x1b[0m")
            }
            Colors::Ansi256 => format!("\x1b[48;5;{MASKED_256}m\x1b[30m{text}\x1b[0m"),
        }
    }

    /// Weight `w` as `text` over its colour, in black or white, whichever reads.
    pub fn paint(self, w: f32, text: &str) -> String {
        let (bg, rgb) = self.background(w);
        let fg = if dark(rgb) { "\x1b[97m" } else { "\x1b[30m" };
        format!("{bg}{fg}{text}{RESET}")
    }
}

const RESET: &str = "\x1b[0m";
/// Key labels are written downwards, at most this many characters each.
const LABEL_LINES: usize = 6;
/// Row labels are cut to this many characters.
const ROW_LABEL: usize = 12;

/// Terminal columns per key: a space and three characters (".43", "1.0"); one more where the
/// positions reach four digits, so they stay apart.
pub fn cell_width(last_index: usize) -> usize {
    if last_index >= 1000 {
        5
    } else {
        4
    }
}

/// A weight in three characters: ".43", "1.0", ".00".
fn cell_text(w: f32) -> String {
    if w.is_nan() {
        return "nan".to_string();
    }
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

/// How many of the last `keys` key columns (the last at position `last_index`) a heatmap
/// `width` columns wide can show: all of them if they fit, else the most that fit beside the ‹
/// column. `label_width(n)` is how wide the row labels are when the last `n` are shown. At
/// least one.
pub fn window_that_fits(width: usize, keys: usize, last_index: usize, label_width: impl Fn(usize) -> usize) -> usize {
    let cell = cell_width(last_index);
    let used = |n: usize, window: bool| 4 + 1 + label_width(n) + 2 + cell * (n + usize::from(window));
    if used(keys, false) <= width {
        return keys;
    }
    (1..keys).rev().find(|&n| used(n, true) <= width).unwrap_or(1)
}

/// `text` broken at spaces into lines at most `limit` columns wide (a longer word stays whole);
/// without a limit, one line.
pub fn wrap(text: &str, limit: Option<usize>) -> String {
    let Some(w) = limit else { return text.to_string() };
    let mut out = String::new();
    let mut line = 0;
    for word in text.split(' ') {
        let n = width(word);
        if line > 0 && line + 1 + n > w {
            out.push('\n');
            line = 0;
        } else if line > 0 {
            out.push(' ');
            line += 1;
        }
        out.push_str(word);
        line += n;
    }
    out
}

/// The colour-scale line: five swatches with their values, or how to get colours.
pub fn legend(colors: Option<Colors>) -> String {
    match colors {
        Some(c) => {
            let mut out = String::from("scale ");
            for w in [0.0, 0.25, 0.5, 0.75, 1.0] {
                out.push_str(&c.paint(w, &format!(" {w:.2} ")));
            }
            out.push_str(" (darker is more weight); ");
            out.push_str(&c.masked(" grey "));
            out.push_str(" is masked (a key after its query)");
            out
        }
        None => format!(
            "the cells are the weights; {MASKED_TEXT} is masked (a key after its query); colours: a terminal \
             without NO_COLOR, or --color always"
        ),
    }
}

/// The grid as text, `colors` or plain. Every line is as wide as the row labels plus
/// [`cell_width`] per column.
pub fn heatmap(g: &Grid, colors: Option<Colors>) -> String {
    let cell = cell_width(g.cols.last().map_or(0, |t| t.index));
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
            out.push_str(&" ".repeat(cell));
        }
        for chars in &col_labels {
            let skip = lines - chars.len();
            let c = if i >= skip { chars[i - skip].as_str() } else { "" };
            out.push_str(&pad_left(c, cell));
        }
        out.push('\n');
    }
    let _ = write!(out, "{} │", pad_right(&format!("{:>4}", g.corner), 4 + 1 + lw));
    if g.before.is_some() {
        out.push_str(&pad_left("‹", cell));
    }
    for t in &g.cols {
        out.push_str(&pad_left(&t.index.to_string(), cell));
    }
    out.push('\n');
    let cells_w = cell * (g.cols.len() + usize::from(g.before.is_some()));
    for (r, t) in g.rows.iter().enumerate() {
        if g.decoded_from == Some(r) {
            // As wide as the cells: the longest label that fits, never the grid widened.
            let text = ["─ decoded with the KV cache on ", "─ decoded, KV cache on ", "─ decoded ", ""]
                .into_iter()
                .find(|t| t.chars().count() <= cells_w)
                .unwrap_or("");
            let rest = cells_w - text.chars().count();
            let _ = writeln!(out, "{}┼{text}{}", "─".repeat(prefix - 1), "─".repeat(rest));
        }
        let _ = write!(out, "{:>4} {} │", t.index, pad_right(&row_labels[r], lw));
        let mut put = |w: Option<f32>| match (w, colors) {
            (None, None) => out.push_str(&pad_left(MASKED_TEXT, cell)),
            (None, Some(c)) => out.push_str(&c.masked(&" ".repeat(cell))),
            (Some(w), None) => out.push_str(&pad_left(&cell_text(w), cell)),
            (Some(w), Some(c)) => out.push_str(&c.paint(w, &pad_left(&cell_text(w), cell))),
        };
        if let Some(before) = &g.before {
            put(Some(before[r]));
        }
        for c in 0..g.cols.len() {
            put(g.cell(r, c));
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
        assert_eq!(cell_text(f32::NAN), "nan");
    }

    #[test]
    fn the_256_colour_ramp_darkens_step_by_step_from_white() {
        let luma = |c: [u8; 3]| 299 * c[0] as u32 + 587 * c[1] as u32 + 114 * c[2] as u32;
        assert_eq!(xterm_rgb(RAMP_256[0]), [255; 3]);
        for w in RAMP_256.windows(2) {
            assert!(luma(xterm_rgb(w[1])) < luma(xterm_rgb(w[0])), "{w:?}");
        }
        assert_eq!(xterm_rgb(244), [128; 3]);
        assert_eq!(xterm_rgb(16 + 36 + 6 * 2 + 3), [95, 135, 175]);
    }

    #[test]
    fn the_window_is_the_widest_that_fits_with_its_own_labels() {
        // 10 keys of 4 columns and labels 5 wide: 4+1+5+2 + 40 = 52 columns.
        assert_eq!(window_that_fits(52, 10, 9, |_| 5), 10);
        // One column less: a window, with the ‹ column: 12 + 4·(n + 1) ≤ 51, so n = 8.
        assert_eq!(window_that_fits(51, 10, 9, |_| 5), 8);
        // Labels that narrow as the window shrinks leave room for more keys.
        assert_eq!(window_that_fits(51, 10, 9, |n| if n > 9 { 12 } else { 1 }), 9);
        assert_eq!(window_that_fits(10, 10, 9, |_| 12), 1);
        // Four-digit positions take five columns each.
        assert_eq!(window_that_fits(62, 10, 1009, |_| 5), 10);
        assert_eq!(window_that_fits(61, 10, 1009, |_| 5), 8);
    }

    #[test]
    fn prose_wraps_at_spaces() {
        assert_eq!(wrap("aa bb cc", Some(5)), "aa bb\ncc");
        assert_eq!(wrap("aaaaaaa bb", Some(5)), "aaaaaaa\nbb");
        assert_eq!(wrap("aa bb cc", None), "aa bb cc");
    }
}
