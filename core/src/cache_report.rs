//! A prompt-cache diagnosis in words and token texts: where reuse stopped for a prompt, the
//! token on each side at that point, how many positions were computed because of it, and (when
//! asked) the text around the stop and one sentence saying it. The server puts it in a
//! response's `usage`; `kvgpt cache diff` prints it for prompt files.

use crate::prefix_cache::{ReuseStop, StopReason};
use crate::store::TierReuse;
use crate::tokenizer::Tokenizer;
use serde::Serialize;

/// Tokens of context shown on each side of the stop.
const AROUND: usize = 8;

/// A token and its text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TokenRef {
    pub id: u32,
    pub text: String,
}

/// The text around the stop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Context {
    /// Up to eight prompt tokens before the stop (the reused end of the prefix).
    pub before: String,
    /// The prompt from the stop on (up to nine tokens).
    pub new_after: String,
    /// What the cache holds from the stop on (up to nine tokens), after the same prefix.
    pub cached_after: String,
    pub explanation: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    pub prompt_tokens: usize,
    /// Positions `0..reused` came from the cache.
    pub reused: usize,
    /// Positions computed: `prompt_tokens - reused`.
    pub recomputed: usize,
    pub reason: StopReason,
    pub new_token: Option<TokenRef>,
    pub cached_token: Option<TokenRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<Context>,
    /// Where the reused positions came from (with `--kv-disk` or `--kv-redis`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tiers: Option<TierReuse>,
}

impl Report {
    /// The report of `stop` for `prompt`; with `context`, the text around the stop too.
    pub fn new(tok: &Tokenizer, prompt: &[u32], stop: &ReuseStop, context: bool) -> Report {
        let token = |id: Option<u32>| id.map(|id| TokenRef { id, text: tok.decode(&[id]) });
        let (n, at) = (prompt.len(), stop.reused);
        let mut r = Report {
            prompt_tokens: n,
            reused: at,
            recomputed: n - at,
            reason: stop.reason,
            new_token: token(stop.new_token),
            cached_token: token(stop.cached_token),
            context: None,
            tiers: stop.tiers,
        };
        if context {
            let cached: Vec<u32> = stop.cached_token.into_iter().chain(stop.cached_after.iter().copied()).collect();
            r.context = Some(Context {
                before: tok.decode(&prompt[at.saturating_sub(AROUND)..at]),
                new_after: tok.decode(&prompt[at..(at + AROUND + 1).min(n)]),
                cached_after: tok.decode(&cached),
                explanation: r.sentence(),
            });
        }
        r
    }

    /// What happened, in one sentence.
    pub fn sentence(&self) -> String {
        let (n, at, re) = (self.prompt_tokens, self.reused, self.recomputed);
        let text = |t: &Option<TokenRef>| t.as_ref().map_or(String::new(), |t| format!("{:?} (id {})", t.text, t.id));
        let computed = if re == 1 { "1 position was".to_string() } else { format!("{re} positions were") };
        match self.reason {
            StopReason::Differs => format!(
                "reuse stopped at token {at} of {n}: the cache holds {} there, this prompt has {}; {computed} computed \
                 from there on",
                text(&self.cached_token),
                text(&self.new_token)
            ),
            StopReason::CacheEnds if at == 0 => {
                format!("the cache holds nothing that starts like this prompt; all {computed} computed")
            }
            StopReason::CacheEnds => format!(
                "the cache holds this prompt's first {at} tokens and nothing after them; {computed} computed from \
                 token {at} on"
            ),
            StopReason::LastToken => format!(
                "all {at} tokens before the last came from the cache; the last is always computed, for its logits"
            ),
        }
    }
}
