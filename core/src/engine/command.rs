//! The messages a handle sends to the engine thread.

use super::request::{CancelReason, Flushed, SeqId};
use super::slot::Waiting;

/// Messages to the engine thread.
pub(super) enum Command {
    Submit(Waiting),
    Cancel(SeqId, CancelReason),
    /// Finish the running and waiting sequences, then return.
    Drain,
    /// Evict every prompt-cache entry no sequence holds; answer the tokens evicted and those still held.
    FlushCache(tokio::sync::oneshot::Sender<Flushed>),
}
