//! `inspect tokens`: ids, pieces, bytes and offsets.

use super::session::{Common, Session};
use crate::common::print_json;
use anyhow::Result;
use serde::Serialize;

/// The prompt's tokens, rendered as the table or as `--json`.
#[derive(Serialize)]
struct TokensView {
    ids: Vec<u32>,
    /// Each token's text, its bytes escaped where they are part of a UTF-8 character.
    tokens: Vec<String>,
    /// The vocabulary's spelling (`Ġcat`).
    pieces: Vec<String>,
    bytes: Vec<Vec<u8>>,
    /// Byte ranges `[start, end)` of the UTF-8 text.
    offsets: Vec<[usize; 2]>,
    partial_utf8: Vec<bool>,
}

impl TokensView {
    fn of(s: &Session) -> TokensView {
        let tok = &s.loaded.tokenizer;
        let bytes: Vec<Vec<u8>> = s.ids.iter().map(|&i| tok.token_bytes(i).to_vec()).collect();
        let mut at = 0usize;
        let offsets = bytes
            .iter()
            .map(|b| {
                at += b.len();
                [at - b.len(), at]
            })
            .collect();
        TokensView {
            ids: s.ids.clone(),
            tokens: s.labels(&s.ids),
            pieces: s.ids.iter().map(|&i| tok.piece(i)).collect(),
            bytes,
            offsets,
            partial_utf8: s.ids.iter().map(|&i| tok.is_partial(i)).collect(),
        }
    }

    fn print(&self) -> Result<()> {
        let total = self.offsets.last().map_or(0, |o| o[1]);
        outln!(
            "{}, {} (offsets are byte ranges of the UTF-8 text)",
            kvgpt_core::units::count(self.ids.len(), "token"),
            kvgpt_core::units::count(total, "byte")
        );
        outln!("{:>4} {:>6}  {:<10} {:<22} {:<16} bytes", "pos", "id", "offsets", "text", "piece");
        for (i, id) in self.ids.iter().enumerate() {
            let hex: Vec<String> = self.bytes[i].iter().map(|b| format!("{b:02x}")).collect();
            let partial = self.partial_utf8[i];
            let shown = if partial { self.tokens[i].clone() } else { format!("{:?}", self.tokens[i]) };
            outln!(
                "{i:>4} {id:>6}  {:<10} {:<22} {:<16} {}{}",
                format!("[{}, {})", self.offsets[i][0], self.offsets[i][1]),
                shown,
                self.pieces[i],
                hex.join(" "),
                if partial { "  (part of a UTF-8 character)" } else { "" }
            );
        }
        Ok(())
    }
}

pub(super) fn tokens(c: &Common) -> Result<()> {
    let view = TokensView::of(&Session::open(c)?);
    if c.io.json {
        print_json(&serde_json::to_value(&view)?)
    } else {
        view.print()
    }
}
