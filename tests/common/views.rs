//! Reading the attention pictures back: the terminal heatmap's escapes and cells, the SVG's
//! cells, a pseudo-terminal run, HF's attention of a reference prompt.

use super::*;
use serde_json::Value;
use std::process::{Command, Output};

pub fn kvgpt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(args)
        .env("COLORTERM", "truecolor")
        .env_remove("NO_COLOR")
        .env_remove("COLUMNS")
        .output()
        .unwrap()
}

pub fn stdout(args: &[&str]) -> String {
    let out = kvgpt(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// HF's attention of a reference prompt: `w(layer, head, q, k)`.
pub struct HfAttention {
    pub t: usize,
    pub layers: Vec<Vec<f32>>,
}

impl HfAttention {
    pub fn of(key: &str) -> HfAttention {
        let r = Reference::load();
        let layers: Vec<Vec<f32>> = (0..2).map(|l| r.tensor(&format!("{key}.attn.{l}")).unwrap().1).collect();
        let t = r.prompts().iter().find(|p| p.key == key).unwrap().ids.len();
        HfAttention { t, layers }
    }

    pub fn w(&self, l: usize, h: usize, q: usize, k: usize) -> f32 {
        self.layers[l][(h * self.t + q) * self.t + k]
    }
}

/// The text without its escape sequences.
pub fn plain(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The coloured cells of a line: each background's RGB and the text on it.
pub fn coloured_cells(line: &str) -> Vec<([u8; 3], String)> {
    all_coloured(line).into_iter().filter(|c| c.0 != MASKED).collect()
}

/// The grey of a masked cell in the pictures (#d9d9d9).
pub const MASKED: [u8; 3] = [0xd9; 3];

/// The text of the line's cells painted the masked grey.
pub fn masked_cells(line: &str) -> Vec<String> {
    all_coloured(line).into_iter().filter(|c| c.0 == MASKED).map(|c| c.1).collect()
}

fn all_coloured(line: &str) -> Vec<([u8; 3], String)> {
    line.split("\x1b[0m")
        .filter_map(|piece| {
            let at = piece.find("\x1b[48;2;")?;
            let rest = &piece[at + 7..];
            let end = rest.find('m')?;
            let rgb: Vec<u8> = rest[..end].split(';').map(|x| x.parse().unwrap()).collect();
            Some(([rgb[0], rgb[1], rgb[2]], plain(&rest[end + 1..]).trim().to_string()))
        })
        .collect()
}

pub fn value(cell: &str) -> f32 {
    if cell == "1.0" {
        1.0
    } else {
        format!("0{cell}").parse().unwrap()
    }
}

pub fn luma(c: [u8; 3]) -> f64 {
    0.299 * c[0] as f64 + 0.587 * c[1] as f64 + 0.114 * c[2] as f64
}

/// The tokens as the axes show them (a space as `·`), via `inspect tokens`.
pub fn axis_tokens(text: &str, m: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(&stdout(&["inspect", "tokens", text, "--model", m, "--json"])).unwrap();
    v["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().replace(' ', "·")).collect()
}

pub fn console_width(s: &str) -> usize {
    s.chars().count()
}

/// `fill="#rrggbb"` and `data-w` of every cell of the SVG panel titled `title`.
pub fn svg_cells(doc: &roxmltree::Document, title: &str) -> Vec<([u8; 3], f32)> {
    let panel =
        doc.descendants().find(|n| n.attribute("data-title") == Some(title)).unwrap_or_else(|| panic!("{title}"));
    panel
        .descendants()
        .filter(|n| n.attribute("class") == Some("cell"))
        .map(|n| {
            let f = n.attribute("fill").unwrap();
            let hex = |i: usize| u8::from_str_radix(&f[1 + 2 * i..3 + 2 * i], 16).unwrap();
            ([hex(0), hex(1), hex(2)], n.attribute("data-w").unwrap().parse().unwrap())
        })
        .collect()
}

/// `inspect attention` on a pseudo-terminal of `cols` columns (util-linux `script`, as
/// tests/chat.rs uses), with `env` set.
pub fn on_terminal(cols: usize, args: &[&str], env: &[(&str, &str)]) -> String {
    let quoted: Vec<String> = args.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect();
    let cmd = format!("stty rows 40 cols {cols}; '{}' {}", env!("CARGO_BIN_EXE_kvgpt"), quoted.join(" "));
    let mut c = Command::new("script");
    c.args(["-qfec", &cmd, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .env_remove("NO_COLOR")
        .env_remove("COLUMNS");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("util-linux `script` runs a command on a pseudo-terminal");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8(out.stdout).unwrap().replace('\r', "")
}

/// An xterm 256-colour palette entry's RGB (cube 16..=231, grey ramp 232..=255), as xterm
/// defines them.
pub fn xterm(i: u8) -> [u8; 3] {
    let level = |v: u8| if v == 0 { 0 } else { 55 + 40 * v };
    match i {
        16..=231 => [level((i - 16) / 36), level((i - 16) / 6 % 6), level((i - 16) % 6)],
        232..=255 => [8 + 10 * (i - 232); 3],
        _ => panic!("a system colour {i}: its RGB depends on the terminal"),
    }
}
