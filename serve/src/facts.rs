//! What this server is, computed once when the model is loaded: the startup line, `/server_info`
//! and the metrics' fixed gauges all say it from here.

use super::metrics::Limits;
use super::options::ServeOptions;
use kvgpt_core::engine::EngineConfig;
use kvgpt_core::openai::served_name;
use kvgpt_core::units::{bytes, count};
use kvgpt_core::Loaded;
use serde_json::{json, Value};
use std::net::SocketAddr;

pub struct Facts {
    /// The name `/v1/models` shows and responses carry.
    pub name: String,
    model_path: String,
    /// The folder's, file's or hub id's name, as the startup line says it.
    files_name: String,
    local: SocketAddr,
    n_positions: usize,
    parallel: usize,
    max_queue: usize,
    threads: usize,
    isa: &'static str,
    dtype: String,
    /// Bytes: the weights, the draft's weights, the draft model's caches at most (outside the
    /// pool), and the prompt cache's budget (inside it).
    weights: usize,
    draft_weights: usize,
    draft_kv: usize,
    cache_bytes: usize,
    /// The K/V pool: its blocks, their positions (also the KV events' block size) and bytes.
    pool_blocks: usize,
    block_size: usize,
    block_bytes: usize,
    kv_dtype: &'static str,
    /// The draft: its name, and the startup line's words on it.
    draft: Option<(String, String)>,
}

impl Facts {
    /// The facts of a server started with `o` on `local`, over `loaded` run by `threads` threads,
    /// with the draft named, if any.
    pub fn new(
        o: &ServeOptions,
        local: SocketAddr,
        loaded: &Loaded,
        cfg: &EngineConfig,
        (threads, draft): (usize, Option<&str>),
    ) -> Facts {
        let (model, (shape, blocks)) = (&loaded.model, cfg.kv_pool_size(&loaded.model));
        let draft = cfg.draft.as_ref().zip(draft).map(|(d, name)| {
            let words = format!(
                "up to {} tokens a step; measured: a verify row costs {:.2} and a drafted token {:.2} of a decode step",
                d.max_k, d.costs.row, d.costs.draft
            );
            (name.to_string(), words)
        });
        Facts {
            name: o.served_model_name.clone().unwrap_or_else(|| served_name(&o.load.model)),
            model_path: o.load.model.clone(),
            files_name: loaded.files.name.clone(),
            local,
            n_positions: model.config.n_positions,
            parallel: cfg.parallel,
            max_queue: cfg.max_queue,
            threads,
            isa: model.isa().name(),
            dtype: model.weights_dtype().to_string(),
            weights: model.weight_bytes(),
            draft_weights: cfg.draft.as_ref().map_or(0, |d| d.weight_bytes()),
            draft_kv: cfg.draft_kv_bytes(model),
            cache_bytes: cfg.cache_bytes,
            pool_blocks: blocks,
            block_size: shape.positions,
            block_bytes: shape.bytes(),
            kv_dtype: shape.ty.name(),
            draft,
        }
    }

    /// The metrics' fixed gauges.
    pub fn limits(&self) -> Limits {
        Limits {
            weights: self.weights,
            draft_weights: self.draft_weights,
            kv: self.pool_blocks * self.block_bytes,
            kv_blocks: self.pool_blocks,
            cache: self.cache_bytes,
            block_size: self.block_size,
        }
    }

    /// The startup line.
    pub fn banner(&self) -> String {
        let (draft, draft_memory) = match &self.draft {
            Some((name, words)) => (
                format!(" | draft {name} ({words})"),
                match self.draft_kv {
                    0 => format!(" + draft weights {} (its K/V in the pool)", bytes(self.draft_weights)),
                    kv => format!(" + draft weights {} + draft K/V ≤ {}", bytes(self.draft_weights), bytes(kv)),
                },
            ),
            None => (String::new(), String::new()),
        };
        let pool = self.pool_blocks * self.block_bytes;
        let total = self.weights + self.draft_weights + self.draft_kv + pool;
        format!(
            "{} ready on http://{} | {} positions | {}, {} kernels, {} weights{draft} | memory: weights {}{draft_memory} \
             + one K/V pool of {} blocks of {} positions ({}) = {} for {} (--parallel: sequences decoded in one step) and the prompt cache (≤ {} of it) = {}",
            self.files_name,
            self.local,
            self.n_positions,
            count(self.threads, "thread"),
            self.isa,
            self.dtype,
            bytes(self.weights),
            self.pool_blocks,
            self.block_size,
            self.kv_dtype,
            bytes(pool),
            count(self.parallel, "slot"),
            bytes(self.cache_bytes),
            bytes(total)
        )
    }

    /// `/server_info`: what routers read of this worker.
    pub fn server_info(&self) -> Value {
        json!({
            "model_id": self.name,
            "served_model_name": self.name,
            "model_path": self.model_path,
            "version": concat!("kvgpt ", env!("CARGO_PKG_VERSION")),
            "instance_id": format!("kvgpt@{}", self.local),
            "tp_size": 1,
            "dp_size": 1,
            "kv_block_size": self.block_size,
            "kv_cache_dtype": self.kv_dtype,
            "context_length": self.n_positions,
            "max_running_requests": self.parallel,
            "max_total_tokens": self.pool_blocks * self.block_size,
            "max_queued_requests": self.max_queue,
            "prompt_cache_bytes": self.cache_bytes,
            "dtype": self.dtype,
            "isa": self.isa,
            "threads": self.threads,
            "draft": self.draft.as_ref().map(|(name, _)| name),
        })
    }
}
