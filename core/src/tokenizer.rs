//! The GPT-2 byte-level BPE tokenizer: loading (`tokenizer.json`, or `vocab.json` + `merges.txt`),
//! encode/decode, and a streaming decoder that never emits a broken UTF-8 character.

use crate::error::{Error, Result};
use crate::hub::TokenizerFiles;
use std::path::Path;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

pub const ENDOFTEXT: &str = "<|endoftext|>";

/// A vocabulary as a GGUF's tokenizer metadata holds it ([`Tokenizer::gguf_vocab`]).
pub struct GgufVocab {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub merges: Vec<String>,
}

/// llama.cpp's converter's `does_token_look_special`: added tokens it makes CONTROL though the
/// tokenizer does not mark them special.
fn looks_special(t: &str) -> bool {
    let wrapped = |a: &str, b: &str| t.starts_with(a) && t.ends_with(b);
    ["<pad>", "<mask>", "<2mass>", "[@BOS@]"].contains(&t)
        || wrapped("<|", "|>")
        || wrapped("<\u{ff5c}", "\u{ff5c}>")
        || wrapped("<unused", ">")
}

#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The raw bytes of every id (byte-level BPE pieces mapped back through GPT-2's byte table).
    bytes: Vec<Vec<u8>>,
    /// The most bytes one token holds.
    longest: usize,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`, or `dir/vocab.json` + `dir/merges.txt` when there is no
    /// tokenizer.json.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let json = dir.join("tokenizer.json");
        if json.exists() {
            return Tokenizer::from_json_file(&json);
        }
        let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
        if vocab.exists() && merges.exists() {
            return Tokenizer::from_vocab_merges(&vocab, &merges);
        }
        Err(Error::MissingFile {
            path: json,
            hint: "a model folder needs tokenizer.json (or vocab.json + merges.txt)".into(),
        })
    }

    /// Loads the tokenizer files a model location names.
    pub fn from_files(files: &TokenizerFiles) -> Result<Tokenizer> {
        match files {
            TokenizerFiles::Json(p) => Tokenizer::from_json_file(p),
            TokenizerFiles::Gguf(p) => {
                let json = crate::weights::Gguf::open(p)?.tokenizer_json()?;
                Tokenizer::from_json_bytes(&json, &format!("{} (its tokenizer metadata)", p.display()))
            }
            TokenizerFiles::VocabMerges { vocab, merges } => Tokenizer::from_vocab_merges(vocab, merges),
        }
    }

    pub fn from_json_file(path: &Path) -> Result<Tokenizer> {
        // GPT-2's is 1.4 MB; the largest vocabularies' a few tens of MB.
        let bytes = crate::files::read(path, "a tokenizer.json", 256 << 20, crate::files::Kinds::RegularOnly)?;
        Tokenizer::from_json_bytes(&bytes, &path.display().to_string())
    }

    /// A tokenizer from the bytes of a `tokenizer.json` (`origin` names it in errors).
    ///
    /// The JSON is parsed here first: the tokenizers library panics on some syntax errors inside
    /// a component (found by fuzzing: a malformed `decoder`), which it cannot meet in a parsed
    /// value; any panic left in it is caught and reported as an error.
    pub fn from_json_bytes(bytes: &[u8], origin: &str) -> Result<Tokenizer> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| Error::Tokenizer(format!("{origin} is not valid JSON ({e})")))?;
        let inner = std::panic::catch_unwind(|| serde_json::from_value::<tokenizers::Tokenizer>(value))
            .map_err(|_| Error::Tokenizer(format!("{origin}: the tokenizers library failed on it (malformed)")))?
            .map_err(|e| Error::Tokenizer(format!("{origin}: {e}")))?;
        Tokenizer::new(inner)
    }

    pub fn from_vocab_merges(vocab: &Path, merges: &Path) -> Result<Tokenizer> {
        let to_str = |p: &Path| p.to_string_lossy().into_owned();
        let bpe = BPE::from_file(&to_str(vocab), &to_str(merges))
            .build()
            .map_err(|e| Error::Tokenizer(format!("{} / {}: {e}", vocab.display(), merges.display())))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
        inner.with_decoder(Some(ByteLevel::default()));
        inner
            .add_special_tokens(vec![AddedToken::from(ENDOFTEXT, true)])
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Tokenizer::new(inner)
    }

    fn new(inner: tokenizers::Tokenizer) -> Result<Tokenizer> {
        let n = inner.get_vocab_size(true);
        let table = byte_decoder();
        let mut bytes = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let piece = inner
                .id_to_token(id)
                .ok_or_else(|| Error::Tokenizer(format!("id {id} has no token; ids must be 0..{n}")))?;
            let b: Option<Vec<u8>> = piece.chars().map(|c| table.get(c as usize).copied().flatten()).collect();
            let b = b.ok_or_else(|| {
                Error::Tokenizer(format!(
                    "token {id} {piece:?} is not byte-level BPE; kvgpt needs GPT-2's byte-level tokenizer"
                ))
            })?;
            bytes.push(b);
        }
        let longest = bytes.iter().map(Vec::len).max().unwrap_or(1).max(1);
        Ok(Tokenizer { inner, bytes, longest })
    }

    pub fn vocab_size(&self) -> usize {
        self.bytes.len()
    }

    /// The fewest tokens `text` can be: no token holds more than the longest one's bytes. Known
    /// at once, where encoding a long word takes time that grows faster than its length.
    pub fn fewest_tokens(&self, text: &str) -> usize {
        text.len().div_ceil(self.longest)
    }

    /// The most bytes one token holds.
    pub fn longest_token(&self) -> usize {
        self.longest
    }

    /// Ids of `text`, with no BOS added (as GPT-2 does); `<|endoftext|>` in the text is the special id.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The raw bytes of one token (may be part of a UTF-8 character). Unknown ids give no bytes.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], |b| b.as_slice())
    }

    /// The vocabulary entry as stored (byte-level alphabet, e.g. `Ġthe`).
    pub fn piece(&self, id: u32) -> String {
        self.inner.id_to_token(id).unwrap_or_default()
    }

    /// The token as text: its bytes decoded, with U+FFFD where they are not whole UTF-8.
    pub fn token_text(&self, id: u32) -> String {
        String::from_utf8_lossy(self.token_bytes(id)).into_owned()
    }

    /// The token for display: its text when its bytes are whole UTF-8, else the bytes escaped
    /// (`\xe4\xbb`), so a piece of a split character is visible rather than U+FFFD.
    pub fn token_label(&self, id: u32) -> String {
        let b = self.token_bytes(id);
        match std::str::from_utf8(b) {
            Ok(s) => s.to_string(),
            Err(_) => b
                .iter()
                .map(|&c| {
                    if c.is_ascii() && !c.is_ascii_control() {
                        (c as char).to_string()
                    } else {
                        format!("\\x{c:02x}")
                    }
                })
                .collect(),
        }
    }

    /// Whether the token's bytes are not whole UTF-8 (part of a character split across tokens).
    pub fn is_partial(&self, id: u32) -> bool {
        std::str::from_utf8(self.token_bytes(id)).is_err()
    }

    /// `decode(ids)` as Hugging Face does it: all bytes joined, invalid UTF-8 replaced by U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| self.token_bytes(id).iter().copied()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The vocabulary as a GGUF holds it (`tokenizer.ggml.tokens`, `.token_type`, `.merges`): every
    /// id's piece, its type as llama.cpp's converter assigns it (an added token that is special or
    /// looks it 3 CONTROL, another added token 4 USER_DEFINED, the rest 1 NORMAL) and the merges
    /// by rank.
    pub fn gguf_vocab(&self) -> Result<GgufVocab> {
        let doc = serde_json::to_value(&self.inner).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let mut types = vec![1i32; self.vocab_size()];
        for t in doc["added_tokens"].as_array().into_iter().flatten() {
            if let Some(ty) = t["id"].as_u64().and_then(|id| types.get_mut(id as usize)) {
                let special =
                    t["special"].as_bool() == Some(true) || looks_special(t["content"].as_str().unwrap_or(""));
                *ty = if special { 3 } else { 4 };
            }
        }
        // Each merge as "a b", whether the JSON holds it so or as a pair.
        let merge = |m: &serde_json::Value| match m {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Array(p) if p.len() == 2 => Some(format!("{} {}", p[0].as_str()?, p[1].as_str()?)),
            _ => None,
        };
        let merges = doc["model"]["merges"].as_array().into_iter().flatten().map(merge).collect::<Option<Vec<_>>>();
        let merges = merges.ok_or_else(|| Error::Tokenizer("the BPE model's merges are not pairs of pieces".into()))?;
        let tokens = (0..self.vocab_size() as u32).map(|id| self.piece(id)).collect();
        Ok(GgufVocab { tokens, types, merges })
    }
}

/// GPT-2's `bytes_to_unicode` inverted: for each char code below 324, the byte it stands for.
fn byte_decoder() -> Vec<Option<u8>> {
    let mut table = vec![None; 324];
    let mut extra = 0usize;
    for b in 0u16..=255 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let code = if printable {
            b as usize
        } else {
            extra += 1;
            255 + extra
        };
        table[code] = Some(b as u8);
    }
    table
}

/// Turns a stream of token bytes into text, holding back an incomplete UTF-8 character until the
/// bytes that complete it arrive.
#[derive(Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// Adds bytes; returns the text that is complete now (possibly empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).expect("valid prefix"));
                    match e.error_len() {
                        // Invalid bytes that no later byte can fix: replace them now, as HF does.
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// At the end of the stream: whatever is held back, with U+FFFD for the broken character.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_a_bijection() {
        let t = byte_decoder();
        let mut seen = [false; 256];
        for b in t.iter().flatten() {
            assert!(!seen[*b as usize]);
            seen[*b as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
        assert_eq!(t['Ġ' as usize], Some(b' '));
        assert_eq!(t['Ċ' as usize], Some(b'\n'));
    }

    #[test]
    fn stream_decoder_holds_split_characters() {
        let mut d = StreamDecoder::default();
        let s = "今天".as_bytes();
        assert_eq!(d.push(&s[..2]), "");
        assert_eq!(d.push(&s[2..4]), "今");
        assert_eq!(d.push(&s[4..]), "天");
        assert_eq!(d.push(&[0xE4, 0xBB]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
        assert_eq!(d.push(&[b'a', 0xFF, b'b']), "a\u{FFFD}b");
    }

    /// The converter's rule, at each of its shapes (convert_hf_to_gguf.py, `does_token_look_special`).
    #[test]
    fn tokens_that_look_special_are_the_converters() {
        for t in ["<pad>", "<mask>", "<|user|>", "<\u{ff5c}begin\u{ff5c}>", "<unused7>", "[@BOS@]"] {
            assert!(looks_special(t), "{t}");
        }
        for t in ["[SEP]", "<user>", "|>", "<|", "hello", "<unused"] {
            assert!(!looks_special(t), "{t}");
        }
    }
}
