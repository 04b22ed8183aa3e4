//! A sequence's events as the text a reader sees: each token's piece of text (UTF-8 safe, the
//! end-of-text token shown as nothing, held back while it could still become a stop sequence,
//! cut before one), with its token and logprob, then how the sequence ended, decided here and
//! nowhere else. A stop sequence is reported to the engine as a stop, not as a client that went
//! away, and the usage counts the tokens up to it.
//!
//! [`TextEvents::next`] waits without any runtime of its own (the engine's channels are
//! runtime-free): a server awaits it on its own runtime, a plain thread with [`block_on`].

use super::handle::EngineHandle;
use super::request::{CancelReason, Event, Events, SeqId, Usage};
use crate::logprobs::TokenLogprob;
use crate::sequence::FinishReason;
use crate::stop::TextStream;
use crate::tokenizer::Tokenizer;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake};

/// What a choice adds at one token: its text (possibly empty, while a stop sequence might be
/// starting), and the token with its logprob (None: text held back to the end).
#[derive(Clone, Debug, PartialEq)]
pub struct Delta {
    pub text: String,
    pub token: Option<(u32, Option<TokenLogprob>)>,
}

/// How a sequence ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Ended {
    pub finish: FinishReason,
    pub usage: Usage,
}

impl Ended {
    /// OpenAI's `finish_reason`: "stop" (end-of-text or a stop sequence) or "length".
    pub fn finish_reason(&self) -> &'static str {
        self.finish.openai()
    }
}

/// One step of a sequence's text.
#[derive(Clone, Debug, PartialEq)]
pub enum TextEvent {
    Delta(Delta),
    End(Ended),
}

/// One sequence's events turned into [`TextEvent`]s.
pub struct TextEvents<'t> {
    engine: EngineHandle,
    events: Events,
    text: TextStream<'t>,
    /// Tokens received.
    tokens: usize,
    /// The usage `Started` gave (what a stop answers with if the engine has gone), and whether
    /// it came.
    started: Usage,
    seen_start: bool,
    /// A stop sequence was reached after this many tokens: waiting for the engine's usage.
    stopped_at: Option<usize>,
    ready: VecDeque<TextEvent>,
    over: bool,
}

impl<'t> TextEvents<'t> {
    /// The text of `events` (submitted to `engine`), cut at the first of `stops`.
    pub fn new(tok: &'t Tokenizer, engine: &EngineHandle, events: Events, stops: Vec<String>) -> TextEvents<'t> {
        let eos = engine.model().config.eos_token_id;
        TextEvents {
            engine: engine.clone(),
            events,
            text: TextStream::new(tok, Some(eos), stops),
            tokens: 0,
            started: Usage::default(),
            seen_start: false,
            stopped_at: None,
            ready: VecDeque::new(),
            over: false,
        }
    }

    pub fn id(&self) -> SeqId {
        self.events.id
    }

    /// What the sequence has consumed so far, as far as its events say (for a client that left
    /// before the end): None before it started, else the start's usage and the tokens received.
    pub fn so_far(&self) -> Option<Usage> {
        self.seen_start.then(|| Usage { completion_tokens: self.tokens, ..self.started.clone() })
    }

    /// The next step of the text; None once it has ended. An error is the engine's (it failed
    /// the sequence, or stopped before it finished).
    pub async fn next(&mut self) -> Option<Result<TextEvent, String>> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Some(Ok(e));
            }
            if self.over {
                return None;
            }
            let ev = self.events.recv().await;
            if let Err(e) = self.take(ev) {
                self.over = true;
                return Some(Err(e));
            }
        }
    }

    /// Takes one event from the engine (None: it let go of the sequence).
    fn take(&mut self, ev: Option<Event>) -> Result<(), String> {
        if let Some(tokens) = self.stopped_at {
            // After a stop: only the engine's usage (draft counts, times) is still wanted.
            let usage = match ev {
                Some(Event::Done { usage, .. }) => usage,
                Some(Event::Token { .. } | Event::Started { .. }) => return Ok(()),
                Some(Event::Error(_)) | None => std::mem::take(&mut self.started),
            };
            // It may have made more tokens before it heard of the stop.
            let usage = Usage { completion_tokens: tokens, ..usage };
            self.end(FinishReason::Stop, usage);
            return Ok(());
        }
        match ev {
            Some(Event::Started { cached_tokens, queue, prompt_time, reuse }) => {
                self.started = Usage { cached_tokens, queue, prompt_time, reuse, ..Usage::default() };
                self.seen_start = true;
            }
            Some(Event::Token { id, logprob }) => {
                self.tokens += 1;
                let (text, stopped) = self.text.push(id);
                self.ready.push_back(TextEvent::Delta(Delta { text, token: Some((id, logprob)) }));
                if stopped {
                    self.engine.cancel(self.events.id, CancelReason::Stop { tokens: self.tokens });
                    self.stopped_at = Some(self.tokens);
                }
            }
            Some(Event::Done { finish, usage }) => {
                let tail = self.text.finish();
                if !tail.is_empty() {
                    self.ready.push_back(TextEvent::Delta(Delta { text: tail, token: None }));
                }
                self.end(finish, usage);
            }
            Some(Event::Error(e)) => return Err(e),
            None => return Err("the engine stopped before the request finished".into()),
        }
        Ok(())
    }

    fn end(&mut self, finish: FinishReason, usage: Usage) {
        self.ready.push_back(TextEvent::End(Ended { finish, usage }));
        self.over = true;
    }
}

/// Runs `f` to its end on this thread (parking it while `f` waits): how a plain thread, such as
/// the Python package's, waits on the engine's events.
pub fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}
