//! One choice of a completion: the engine's events for one sequence turned into text (UTF-8
//! safe, stop sequences cut out, end-of-text dropped) and logprobs.

use kvgpt::scheduler::{Event, TokenLogprob, Usage};
use kvgpt::stop::StopMatcher;
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
                    FinishReason::Eos | FinishReason::Stop => "stop",
                    FinishReason::Length => "length",
                };
                return Ok(Some(Ended { finish_reason, usage }));
            }
            Event::Error(e) => return Err(e),
        }
    }
    Err("the engine stopped before the request finished".into())
}
