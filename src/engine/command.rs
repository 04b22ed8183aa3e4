//! The messages a handle sends to the engine thread.

use super::request::{CancelReason, SeqId};
use super::slot::Waiting;

/// Messages to the engine thread.
pub(super) enum Command {
    Submit(Waiting),
    Cancel(SeqId, CancelReason),
    /// Finish the running and waiting sequences, then return.
    Drain,
}
