//! A count of what one forward call does, as plain numbers ([`crate::model::Model::work`] fills
//! it from the shapes the forward pass runs): for views and reports that know nothing of the model.

/// The work of one forward call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Work {
    /// Positions whose q, k, v (and everything after) the call computes.
    pub positions: u64,
    pub macs: u64,
    pub weight_bytes: u64,
    /// Bytes of cached keys and values attention reads (each query reads every earlier one).
    pub kv_read_bytes: u64,
    /// Bytes of keys and values the call writes into the cache.
    pub kv_written_bytes: u64,
}
