//! One choice of a completion: the engine's events for one sequence turned into text (UTF-8
//! safe, stop sequences cut out, end-of-text dropped) and logprobs. A stop sequence is reported
//! to the engine as a stop, not as a client that went away.

use kvgpt_core::engine::{CancelReason, EngineHandle, Event, Events, Usage};
use kvgpt_core::logprobs::TokenLogprob;
use kvgpt_core::stop::TextStream;
use kvgpt_core::{FinishReason, Tokenizer};

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
/// receiver went away). When the receiver goes away, or `gone` resolves (the client left while
/// the sequence still waits for a slot or its prompt), the sequence is cancelled by dropping
/// `events`. Errors are the engine's.
pub async fn drive(
    tok: &Tokenizer,
    eos: u32,
    engine: &EngineHandle,
    mut events: Events,
    stops: Vec<String>,
    gone: impl std::future::Future<Output = ()>,
    mut on_delta: impl FnMut(Delta) -> bool,
) -> Result<Option<Ended>, String> {
    let mut text = TextStream::new(tok, Some(eos), stops);
    let mut completion_tokens = 0;
    let mut started = None;
    tokio::pin!(gone);
    loop {
        let ev = tokio::select! {
            ev = events.recv() => ev,
            () = &mut gone => return Ok(None),
        };
        let Some(ev) = ev else { break };
        match ev {
            Event::Started { cached_tokens, queue, prompt_time, reuse } => {
                started = Some(Usage { cached_tokens, queue, prompt_time, reuse, ..Usage::default() })
            }
            Event::Token { id, logprob } => {
                completion_tokens += 1;
                let (t, stopped) = text.push(id);
                if !on_delta(Delta { text: t, token: Some((id, logprob)) }) {
                    return Ok(None);
                }
                if stopped {
                    engine.cancel(events.id, CancelReason::Stop { tokens: completion_tokens });
                    // The engine answers with its usage (draft counts, times) within a step.
                    let mut usage = loop {
                        match events.recv().await {
                            Some(Event::Done { usage, .. }) => break usage,
                            Some(Event::Token { .. } | Event::Started { .. }) => continue,
                            Some(Event::Error(_)) | None => break started.take().unwrap_or_default(),
                        }
                    };
                    usage.completion_tokens = completion_tokens; // it may have made more before the stop
                    return Ok(Some(Ended { finish_reason: "stop", usage }));
                }
            }
            Event::Done { finish, usage } => {
                let tail = text.finish();
                if !tail.is_empty() && !on_delta(Delta { text: tail, token: None }) {
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
