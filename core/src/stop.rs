//! Stop sequences: text that ends a completion where it first appears (OpenAI's `stop`), cut
//! before it; and [`TextStream`], a sequence's tokens turned into the text a user sees. Used by
//! `kvgpt generate` and the server alike.

use crate::tokenizer::{StreamDecoder, Tokenizer};

/// A sequence's tokens turned into text as they come: whole UTF-8 characters only, the
/// end-of-text token (when given) shown as nothing, and cut before the first stop sequence.
pub struct TextStream<'a> {
    tok: &'a Tokenizer,
    eos: Option<u32>,
    decoder: StreamDecoder,
    stops: StopMatcher,
}

impl<'a> TextStream<'a> {
    pub fn new(tok: &'a Tokenizer, eos: Option<u32>, stops: Vec<String>) -> TextStream<'a> {
        TextStream { tok, eos, decoder: StreamDecoder::default(), stops: StopMatcher::new(stops) }
    }

    /// Adds a token: the text that can be shown now, and whether a stop sequence ended the text.
    pub fn push(&mut self, id: u32) -> (String, bool) {
        let piece =
            if Some(id) == self.eos { self.decoder.finish() } else { self.decoder.push(self.tok.token_bytes(id)) };
        self.stops.push(&piece)
    }

    /// The end (no stop sequence was reached): whatever was held back.
    pub fn finish(&mut self) -> String {
        let (mut text, _) = self.stops.push(&self.decoder.finish());
        text.push_str(&self.stops.finish());
        text
    }
}

/// Holds back text that may be the start of a stop sequence; cuts at the first one found.
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher { stops, held: String::new() }
    }

    /// Adds text; returns what can be shown now, and whether a stop sequence was reached (the
    /// text is then cut before it).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // Keep the longest tail that is a proper prefix of some stop sequence.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
            .filter(|p| self.held.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// The end: whatever was held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_sequences_are_cut_and_held_back_across_pieces() {
        let mut s = StopMatcher::new(vec!["\nUser:".into(), "END".into()]);
        assert_eq!(s.push("Hello"), ("Hello".into(), false));
        assert_eq!(s.push(" there\nUs"), (" there".into(), false));
        assert_eq!(s.push("er: hi"), ("".into(), true));
        let mut s = StopMatcher::new(vec!["END".into()]);
        assert_eq!(s.push("abcE"), ("abc".into(), false));
        assert_eq!(s.push("x"), ("Ex".into(), false));
        assert_eq!(s.push("E"), ("".into(), false));
        assert_eq!(s.finish(), "E");
    }
}
