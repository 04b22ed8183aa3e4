//! The one labelled heatmap every format draws, and the colour scale and labels they share.

/// One heatmap: `rows × cols` attention weights, each axis labelled with positions and tokens.
pub struct Grid {
    /// What the grid shows, e.g. "layer 1 head 2".
    pub title: String,
    /// What the rows are, at the axes' corner: `q\\k` (queries) or `head`.
    pub corner: &'static str,
    pub rows: Vec<Tick>,
    pub cols: Vec<Tick>,
    /// Row-major `rows × cols`; `None` where the key is after the query (causally masked).
    pub cells: Vec<Option<f32>>,
    /// When the columns start after key 0 (a window): each row's total weight on the keys
    /// before the first column, drawn as one more column marked `‹`.
    pub before: Option<Vec<f32>>,
    /// The first row decoded with the KV cache on (a divider is drawn above it), if any.
    pub decoded_from: Option<usize>,
}

/// A labelled place on an axis: a position (or a head) and its token (or name).
pub struct Tick {
    pub index: usize,
    pub label: String,
}

impl Grid {
    pub fn cell(&self, r: usize, c: usize) -> Option<f32> {
        self.cells[r * self.cols.len() + c]
    }
}

/// A masked cell (a key after its query), in every picture.
pub const MASKED: &str = "#d9d9d9";

/// The cache view's marks: a row the step wrote (or, without the cache, ran again), and a row
/// read from the cache.
pub const WRITTEN: &str = "#f28e2b";
pub const READ: &str = "#c9d6e3";

/// The colour scale every format uses: ColorBrewer's 9-step "Blues", from white (weight 0) to
/// dark blue (weight 1), interpolated linearly. The HTML viewer's script gets these same stops.
pub const PALETTE: [[u8; 3]; 9] = [
    [0xf7, 0xfb, 0xff],
    [0xde, 0xeb, 0xf7],
    [0xc6, 0xdb, 0xef],
    [0x9e, 0xca, 0xe1],
    [0x6b, 0xae, 0xd6],
    [0x42, 0x92, 0xc6],
    [0x21, 0x71, 0xb5],
    [0x08, 0x51, 0x9c],
    [0x08, 0x30, 0x6b],
];

/// The colour of weight `w` (clamped to 0..1; NaN reads as 0) on the scale.
pub fn shade(w: f32) -> [u8; 3] {
    let w = if w.is_nan() { 0.0 } else { f64::from(w).clamp(0.0, 1.0) };
    let x = w * (PALETTE.len() - 1) as f64;
    let i = (x.floor() as usize).min(PALETTE.len() - 2);
    let f = x - i as f64;
    let (a, b) = (PALETTE[i], PALETTE[i + 1]);
    std::array::from_fn(|c| (f64::from(a[c]) + (f64::from(b[c]) - f64::from(a[c])) * f).round() as u8)
}

/// Whether text on colour `rgb` reads better white than black.
pub fn dark(rgb: [u8; 3]) -> bool {
    let [r, g, b] = rgb.map(f64::from);
    0.299 * r + 0.587 * g + 0.114 * b < 140.0
}

/// `#rrggbb`.
pub fn hex(rgb: [u8; 3]) -> String {
    format!("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2])
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

/// A token as it reads on an axis, unquoted: a space shows as `·`, control characters escaped
/// (`\n`), so leading spaces and newlines stay visible in every format.
pub fn axis_label(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            ' ' => out.push('·'),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// `s` cut to `n` characters, the last one `…` when anything was cut.
pub fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// `s` with the five XML specials escaped, for SVG and HTML text and attributes.
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_runs_from_white_to_dark_blue_and_darkens_with_weight() {
        assert_eq!(shade(0.0), PALETTE[0]);
        assert_eq!(shade(1.0), PALETTE[8]);
        assert_eq!(shade(0.5), PALETTE[4]);
        assert_eq!(shade(-1.0), PALETTE[0]);
        assert_eq!(shade(2.0), PALETTE[8]);
        assert_eq!(shade(f32::NAN), PALETTE[0]);
        // Halfway between stops 0 and 1: each channel the rounded mean.
        assert_eq!(shade(1.0 / 16.0), [0xeb, 0xf3, 0xfb]);
        let luma = |c: [u8; 3]| 299 * c[0] as u32 + 587 * c[1] as u32 + 114 * c[2] as u32;
        for i in 0..100 {
            assert!(luma(shade(i as f32 / 100.0)) >= luma(shade((i + 1) as f32 / 100.0)), "{i}");
        }
        assert!(!dark(shade(0.0)) && dark(shade(1.0)));
    }

    #[test]
    fn axis_labels_show_spaces_and_control_characters() {
        assert_eq!(axis_label(" cat\n"), "·cat\\n");
        assert_eq!(axis_label("\u{1}x"), "\\x01x");
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
    }
}
