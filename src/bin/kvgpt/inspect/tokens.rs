//! `inspect tokens`: ids, pieces, bytes and offsets.

#[allow(unused_imports)]
use super::*;

pub(super) fn tokens(c: &Common) -> Result<()> {
    let s = Session::open(c)?;
    let tok = &s.loaded.tokenizer;
    let mut offsets = Vec::with_capacity(s.ids.len());
    let mut at = 0usize;
    for &id in &s.ids {
        let n = tok.token_bytes(id).len();
        offsets.push([at, at + n]);
        at += n;
    }
    let bytes: Vec<&[u8]> = s.ids.iter().map(|&i| tok.token_bytes(i)).collect();
    let partial: Vec<bool> = s.ids.iter().map(|&i| tok.is_partial(i)).collect();
    if c.io.json {
        print_json(&json!({
            "ids": s.ids,
            "tokens": s.labels(&s.ids),
            "pieces": s.ids.iter().map(|&i| tok.piece(i)).collect::<Vec<_>>(),
            "bytes": bytes,
            "offsets": offsets,
            "partial_utf8": partial,
        }))?;
    } else {
        outln!("{} tokens, {} bytes (offsets are byte ranges of the UTF-8 text)", s.ids.len(), at);
        outln!("{:>4} {:>6}  {:<10} {:<22} {:<16} bytes", "pos", "id", "offsets", "text", "piece");
        for (i, &id) in s.ids.iter().enumerate() {
            let hex: Vec<String> = bytes[i].iter().map(|b| format!("{b:02x}")).collect();
            let shown = if partial[i] { s.label(id) } else { format!("{:?}", s.label(id)) };
            outln!(
                "{i:>4} {id:>6}  {:<10} {:<22} {:<16} {}{}",
                format!("[{}, {})", offsets[i][0], offsets[i][1]),
                shown,
                tok.piece(id),
                hex.join(" "),
                if partial[i] { "  (part of a UTF-8 character)" } else { "" }
            );
        }
    }
    Ok(())
}
