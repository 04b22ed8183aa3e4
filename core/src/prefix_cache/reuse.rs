//! Where reuse stopped, and why: the diagnosis of a prompt-cache miss. A lookup knows the point
//! its descent left the tree; what the tree holds there (the token that differs, or nothing) is
//! the answer to "why did this request recompute its prompt?".

use super::PrefixCache;
use crate::store::TierReuse;
use serde::Serialize;

/// Tokens of the cached side shown after the stop, for context.
const CONTEXT: usize = 8;

/// Why reuse stopped at [`ReuseStop::reused`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The cache holds a different token at this position: the first differing token.
    Differs,
    /// The cache holds nothing past this prefix (an empty cache stops at 0 for this reason).
    CacheEnds,
    /// Every prompt token but the last was reused: the last is always computed, for its logits.
    LastToken,
}

impl StopReason {
    pub const ALL: [StopReason; 3] = [StopReason::Differs, StopReason::CacheEnds, StopReason::LastToken];

    /// Its name in JSON and in metrics labels.
    pub fn label(self) -> &'static str {
        match self {
            StopReason::Differs => "differs",
            StopReason::CacheEnds => "cache_ends",
            StopReason::LastToken => "last_token",
        }
    }
}

impl Serialize for StopReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.label())
    }
}

/// Where a lookup stopped reusing the cache for a prompt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReuseStop {
    /// Positions `0..reused` came from the cache; the prompt from here on was computed.
    pub reused: usize,
    pub reason: StopReason,
    /// The prompt's token at `reused` (none for an empty prompt).
    pub new_token: Option<u32>,
    /// The token the cache holds at `reused` after the same prefix (the most recently used
    /// continuation where there are several), if any.
    pub cached_token: Option<u32>,
    /// Up to eight tokens the cache holds after `cached_token` on that continuation.
    pub cached_after: Vec<u32>,
    /// Where the reused positions came from, when there are tiers under the prompt cache.
    pub tiers: Option<TierReuse>,
}

impl PrefixCache {
    /// The diagnosis of a lookup of `ids` that matched `len` tokens, ending in node `last` after
    /// `take` of its tokens (`(ROOT, 0)` when nothing matched).
    pub(super) fn stop_at(&self, ids: &[u32], len: usize, last: usize, take: usize) -> ReuseStop {
        let new_token = ids.get(len).copied();
        let mut cached = Vec::new();
        let (mut node, mut from) = (last, take);
        while cached.len() <= CONTEXT {
            let n = &self.nodes[node];
            if from < n.tokens.len() {
                let end = n.tokens.len().min(from + CONTEXT + 1 - cached.len());
                cached.extend_from_slice(&n.tokens[from..end]);
                from = end;
                continue;
            }
            // At the node's end: the child that continues with the prompt's token if one does
            // (the first step only), else the most recently used.
            let children = &n.children;
            let same =
                (cached.is_empty()).then(|| children.iter().find(|&&c| Some(self.nodes[c].tokens[0]) == new_token));
            let Some(&next) = same.flatten().or_else(|| children.iter().max_by_key(|&&c| self.nodes[c].last_used))
            else {
                break;
            };
            (node, from) = (next, 0);
        }
        let cached_token = cached.first().copied();
        let reason = match cached_token {
            None => StopReason::CacheEnds,
            Some(c) if Some(c) == new_token => StopReason::LastToken,
            Some(_) => StopReason::Differs,
        };
        let cached_after = cached.get(1..).map(<[u32]>::to_vec).unwrap_or_default();
        ReuseStop { reused: len, reason, new_token, cached_token, cached_after, tiers: None }
    }
}
