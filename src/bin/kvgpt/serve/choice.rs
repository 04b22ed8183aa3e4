//! One choice of a completion: the engine's events for one sequence turned into text (UTF-8
//! safe, stop sequences cut out, end-of-text dropped) and logprobs.

use kvgpt::scheduler::{Event, TokenLogprob, Usage};
use kvgpt::{FinishReason, StreamDecoder, Tokenizer};
use tokio::sync::mpsc::UnboundedReceiver;

/// What a choice adds at one token: its text (possibly empty, while a stop sequence might be
/// starting) and the token with its logprob.
pub struct Delta {
    pub text: String,
    pub token: Option<(u32, Option<TokenLogprob>)>,
}

/// How a choice ended.
pub struct Ended {
    /// "stop" (end-of-text or a stop sequence) or "length".
    pub finish_reason: &'static str,
    pub usage: Usage,
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

/// Drives one sequence's events to its end, handing each delta to `on_delta` (false: the
/// receiver went away; the sequence is then cancelled by dropping `rx`). Errors are the engine's.
pub async fn drive(
    tok: &Tokenizer,
    eos: u32,
    mut rx: UnboundedReceiver<Event>,
    stops: Vec<String>,
    mut on_delta: impl FnMut(Delta) -> bool,
) -> Result<Option<Ended>, String> {
    let mut decoder = StreamDecoder::default();
    let mut stop = StopMatcher::new(stops);
    let mut completion_tokens = 0;
    let mut started = None;
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Started { cached_tokens, queue, prompt_time } => started = Some((cached_tokens, queue, prompt_time)),
            Event::Token { id, logprob } => {
                completion_tokens += 1;
                let piece = if id == eos { decoder.finish() } else { decoder.push(tok.token_bytes(id)) };
                let (text, stopped) = stop.push(&piece);
                if !on_delta(Delta { text, token: Some((id, logprob)) }) {
                    return Ok(None);
                }
                if stopped {
                    // Cut at a stop sequence: the engine's sequence is cancelled when `rx` drops.
                    let (cached_tokens, queue, prompt_time) = started.unwrap_or_default();
                    let usage = Usage { cached_tokens, completion_tokens, queue, prompt_time, ..Usage::default() };
                    return Ok(Some(Ended { finish_reason: "stop", usage }));
                }
            }
            Event::Done { finish, usage } => {
                let tail = decoder.finish();
                let (mut text, _) = stop.push(&tail);
                text.push_str(&stop.finish());
                if !text.is_empty() && !on_delta(Delta { text, token: None }) {
                    return Ok(None);
                }
                let finish_reason = match finish {
                    FinishReason::Eos => "stop",
                    FinishReason::Length => "length",
                };
                return Ok(Some(Ended { finish_reason, usage }));
            }
            Event::Error(e) => return Err(e),
        }
    }
    Err("the engine stopped before the request finished".into())
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
