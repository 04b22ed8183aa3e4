//! Stop sequences: text that ends a completion where it first appears (OpenAI's `stop`), cut
//! before it. Used by `kvgpt generate --stop` and the server alike.

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
