//! What goes into the engine and what comes out: a [`Request`] per sequence, a stream of
//! [`Event`]s back, and how a sequence ended.

use crate::error::Error;
use crate::logprobs::TokenLogprob;
use crate::prefix_cache::ReuseStop;
use crate::sampler::Sampling;
use crate::sequence::FinishReason;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// A sequence's number, unique within one engine.
pub type SeqId = u64;

/// One sequence to generate.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    pub stop_at_eos: bool,
    /// Report each token's log-probability and this many alternatives (None: no logprobs).
    pub logprobs: Option<usize>,
    /// Decode speculatively when the engine has a draft (the answer is the same either way).
    pub speculative: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Prefill finished: how much of the prompt came from the prompt cache.
    Started {
        cached_tokens: usize,
        queue: Duration,
        prompt_time: Duration,
        /// Where reuse of the prompt cache stopped, and why (None with the cache off).
        reuse: Option<ReuseStop>,
    },
    Token {
        id: u32,
        logprob: Option<TokenLogprob>,
    },
    Done {
        finish: FinishReason,
        usage: Usage,
    },
    Error(String),
}

/// What a finished sequence cost (llama.cpp's `timings` names: `cache_n` / `prompt_n`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from the prompt cache (`cache_n`).
    pub cached_tokens: usize,
    /// Prompt tokens computed (`prompt_n` = prompt_tokens - cached_tokens).
    pub prompt_computed: usize,
    pub completion_tokens: usize,
    /// Submission to admission.
    pub queue: Duration,
    /// Admission to the first token: restoring the cached prefix and computing the rest.
    pub prompt_time: Duration,
    /// First token to the last.
    pub decode_time: Duration,
    /// Speculative decoding: the verify steps that had drafts, the tokens drafted, and how many
    /// of them the model accepted (`llama-server`'s `draft_n` / `draft_n_accepted`).
    pub draft_steps: usize,
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
    /// Where reuse of the prompt cache stopped, and why (None with the cache off).
    pub reuse: Option<ReuseStop>,
}

/// What flushing the prompt cache did: tokens evicted, and tokens left because running
/// sequences hold them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flushed {
    pub evicted_tokens: u64,
    pub held_tokens: usize,
}

/// Why a front end ends a sequence early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelReason {
    /// The text reached a stop sequence after this many generated tokens: a normal finish.
    Stop { tokens: usize },
    /// Nobody wants the answer any more.
    Client,
}

/// How a sequence left the engine, as the metrics count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    Finished(FinishReason),
    Cancelled,
    Failed,
}

impl Ending {
    /// The metrics label: `eos`, `length`, `stop`, `cancelled` or `error`.
    pub fn label(self) -> &'static str {
        match self {
            Ending::Finished(FinishReason::Eos) => "eos",
            Ending::Finished(FinishReason::Length) => "length",
            Ending::Finished(FinishReason::Stop) => "stop",
            Ending::Cancelled => "cancelled",
            Ending::Failed => "error",
        }
    }

    pub const ALL: [Ending; 5] = [
        Ending::Finished(FinishReason::Eos),
        Ending::Finished(FinishReason::Length),
        Ending::Finished(FinishReason::Stop),
        Ending::Cancelled,
        Ending::Failed,
    ];
}

/// Why a submission was refused.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The queue holds `waiting` sequences and `limit` at most: retry shortly.
    #[error("the server is busy: {waiting} sequences are waiting (limit {limit}); retry shortly")]
    Busy { waiting: usize, limit: usize },
    /// The request has more sequences than the engine can ever hold at once.
    #[error(
        "this request needs {n} sequences (prompts × n), but the server runs at most {parallel} at once and \
         queues {max_queue} more; send fewer prompts or a smaller n, or start the server with a larger \
         --parallel or --max-queue"
    )]
    TooMany { n: usize, parallel: usize, max_queue: usize },
    /// One sequence of the request needs more K/V blocks than the whole pool holds.
    #[error(
        "this request needs {positions} positions of K/V ({need} blocks of {block}), but the server's K/V pool holds \
         {total} blocks ({}); lower max_tokens or shorten the prompt, or start the server with a larger \
         --kv-mb",
        crate::units::bytes(*.pool_bytes)
    )]
    TooBig { positions: usize, need: usize, block: usize, total: usize, pool_bytes: usize },
    /// The request can never run (its prompt or length does not fit the model).
    #[error(transparent)]
    Invalid(#[from] Error),
    #[error("the engine has stopped")]
    Stopped,
}

/// The events of one submitted sequence. Dropping it cancels the sequence.
pub struct Events {
    pub id: SeqId,
    pub(super) rx: UnboundedReceiver<Event>,
}

impl Events {
    /// The next event (None once the engine has let go of the sequence).
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// The next event, waiting on this thread (not from inside an async runtime).
    pub fn blocking_recv(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }
}

impl Iterator for Events {
    type Item = Event;
    fn next(&mut self) -> Option<Event> {
        self.blocking_recv()
    }
}
