//! What `kvgpt serve` is asked for, and the checks the options must pass before anything starts.

use super::kv_events::KvEventOptions;
use anyhow::{bail, Result};
use kvgpt_core::speculative::DraftSpec;
use kvgpt_core::LoadSpec;
use std::path::PathBuf;
use std::time::Duration;

/// `--parallel`'s default: the rows per step past which batching stopped paying much on the
/// machines measured (DESIGN.md, "A server default that batches").
pub const DEFAULT_PARALLEL: u16 = 16;

/// Everything `kvgpt serve` is asked for.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The model, and the threads that run it (None: one per core).
    pub load: LoadSpec,
    pub threads: Option<usize>,
    /// Decode speculatively with this draft.
    pub draft: Option<DraftSpec>,
    pub kv_events: KvEventOptions,
    pub host: String,
    pub port: u16,
    /// Sequences decoded at once (at most; [`DEFAULT_PARALLEL`] unless the command line says).
    pub parallel: usize,
    /// Bytes of K/V the prompt cache may hold (0 turns it off).
    pub cache_bytes: usize,
    /// Bytes of the K/V pool (None: up to four slots at the full context and the prompt cache).
    pub kv_bytes: Option<usize>,
    /// The disk tier under the pool: its directory and the bytes it may hold.
    pub kv_disk: Option<(PathBuf, u64)>,
    /// The shared tier: a Redis server's URL.
    pub kv_redis: Option<String>,
    /// The share of blocks loaded back from those tiers that are proved by recomputing them.
    pub kv_verify: f64,
    /// Sequences that may wait for a slot.
    pub max_queue: usize,
    /// The key every endpoint but /health requires.
    pub api_key: Option<String>,
    /// Rows per forward step.
    pub batch_tokens: usize,
    /// The model's name in `/v1/models` and in responses (None: from `load.model`).
    pub served_model_name: Option<String>,
    pub max_body_bytes: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub shutdown_timeout: Duration,
    /// `Host` (and `Origin`) names answered beside the loopback ones.
    pub allowed_hosts: Vec<String>,
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl ServeOptions {
    /// Refuses options the server cannot run with (the command line's own ranges keep them out;
    /// a library caller is told here).
    pub fn check(&self) -> Result<()> {
        if let Some(key) = &self.api_key {
            crate::access::check_api_key(key).map_err(anyhow::Error::msg)?;
        }
        crate::hosts::Hosts::new(&self.host, &self.allowed_hosts).map_err(anyhow::Error::msg)?;
        if self.parallel == 0 || self.batch_tokens == 0 {
            bail!("the server needs at least one slot (--parallel) and one row per step (--batch-tokens)");
        }
        if self.kv_events.replay.is_some() && self.kv_events.endpoint.is_none() {
            bail!("--kv-events-replay answers replays of the events --kv-events publishes: give --kv-events too");
        }
        if (self.kv_disk.is_some() || self.kv_redis.is_some()) && self.cache_bytes == 0 {
            bail!("--kv-disk and --kv-redis keep what the prompt cache holds, but --cache-mb 0 turns it off");
        }
        if self.kv_events.endpoint.is_some() && self.cache_bytes == 0 {
            bail!("--kv-events publishes what the prompt cache holds, but --cache-mb 0 turns it off");
        }
        Ok(())
    }
}
