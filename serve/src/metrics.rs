//! Prometheus metrics through the `metrics` crate, recorded into a recorder the server owns (no
//! process-wide recorder is installed): the HTTP side records requests, the engine thread records
//! tokens, latencies, the running and waiting counts and the K/V memory.
//!
//! Beside kvgpt's own, the gauges that the Gateway API Inference Extension's endpoint picker
//! reads from a vLLM model server, under vLLM's names (`vllm:num_requests_waiting`,
//! `vllm:num_requests_running`, `vllm:kv_cache_usage_perc` as a fraction, `vllm:cache_config_info`,
//! `vllm:lora_requests_info`), so a picker routes to kvgpt replicas with its defaults.

use kvgpt_core::engine::{BlockEvent, Ending, Gauges, Monitor, StopReason, Usage};
use kvgpt_core::store::StoreCounts;
use metrics::{counter, gauge, histogram, with_local_recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Positions where reuse of the prompt cache stopped: 0 (nothing reused), then powers of two.
const REUSE_STOP: &str = "kvgpt_prompt_cache_reuse_stop_position";
const POSITION_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0];

/// Every counter and what it counts.
const COUNTERS: &[(&str, &str)] = &[
    ("kvgpt_requests_total", "HTTP requests by endpoint and status"),
    ("kvgpt_prompt_tokens_total", "prompt tokens of finished sequences"),
    ("kvgpt_prompt_cached_tokens_total", "prompt tokens whose K/V came from the prompt cache"),
    ("kvgpt_generated_tokens_total", "tokens generated"),
    ("kvgpt_sequences_cancelled_total", "sequences whose client went away"),
    (
        "kvgpt_sequences_finished_total",
        "sequences that left the engine, by reason: eos, length, stop (a stop sequence), cancelled, error",
    ),
    ("kvgpt_prompt_cache_evictions_total", "prompt cache entries evicted"),
    ("kvgpt_prompt_cache_lookups_total", "prompt cache lookups"),
    ("kvgpt_prompt_cache_hits_total", "lookups that reused at least one token"),
    (
        "kvgpt_prompt_cache_stops_total",
        "why reuse of the prompt cache stopped: differs (a token differs from the cached one), cache_ends \
                 (nothing cached past the prefix), last_token (all but the last token reused)",
    ),
    ("kvgpt_spec_decode_num_drafts_total", "verify steps of finished sequences that checked drafted tokens"),
    ("kvgpt_spec_decode_num_draft_tokens_total", "tokens drafted"),
    ("kvgpt_kv_event_batches_total", "KV-cache event batches published (--kv-events)"),
    (
        "vllm:num_preemptions_total",
        "sequences preempted for K/V memory: blocks dropped, recomputed later (vLLM's name)",
    ),
    ("kvgpt_kv_event_blocks_stored_total", "blocks announced as stored"),
    ("kvgpt_kv_store_written_blocks_total", "K/V blocks written to a tier under the pool (--kv-disk), by tier"),
    ("kvgpt_kv_store_skipped_blocks_total", "K/V blocks not written: the writer was behind, or the tier stopped"),
    ("kvgpt_kv_store_hit_blocks_total", "K/V blocks loaded back from a tier, by tier"),
    ("kvgpt_kv_verified_blocks_total", "loaded K/V blocks proved by recomputing them (--kv-verify)"),
    (
        "kvgpt_kv_verified_known_blocks_total",
        "loaded K/V blocks proved by being bytes this server computed or proved before (their BLAKE3 sum; --kv-verify)",
    ),
    (
        "kvgpt_kv_verify_failures_total",
        "loaded K/V blocks whose recomputed bits differed from the stored ones (removed, not used)",
    ),
    ("kvgpt_kv_store_read_bytes_total", "bytes of the K/V blocks loaded back, by tier"),
    (
        "kvgpt_kv_store_refused_blocks_total",
        "stored K/V blocks refused when read, by tier and reason (header, truncated, checksum, mismatch)",
    ),
    ("kvgpt_kv_event_blocks_removed_total", "blocks announced as removed"),
    (
        "kvgpt_spec_decode_num_accepted_tokens_total",
        "drafted tokens the model accepted (each one a token made without a step of its own)",
    ),
];

/// Every gauge and what it shows.
const GAUGES: &[(&str, &str)] = &[
    ("kvgpt_requests_running", "sequences in the running batch"),
    ("kvgpt_requests_waiting", "sequences waiting for a slot"),
    ("kvgpt_kv_cache_bytes", "K/V bytes of the blocks running sequences map (a shared block once)"),
    ("kvgpt_kv_cache_limit_bytes", "K/V bytes of the pool (--kv-mb)"),
    ("kvgpt_kv_blocks_used", "blocks of the K/V pool in use, by running sequences or the prompt cache"),
    ("kvgpt_kv_blocks_peak", "the most blocks of the K/V pool ever in use at once, however briefly"),
    (
        "kvgpt_kv_blocks_shared",
        "blocks a running sequence maps that another holder (a sequence, the prompt cache) holds too",
    ),
    ("kvgpt_prompt_cache_bytes", "K/V bytes held by the prompt cache"),
    ("kvgpt_kv_store_blocks", "K/V blocks a tier under the pool holds, by tier"),
    ("kvgpt_kv_store_up", "whether a tier under the pool answers (1) or is down (0: served without it), by tier"),
    ("kvgpt_kv_store_bytes", "bytes a tier under the pool holds, by tier"),
    ("kvgpt_prompt_cache_limit_bytes", "the prompt cache's budget (--cache-mb)"),
    ("kvgpt_prompt_cache_tokens", "positions held by the prompt cache"),
    ("kvgpt_weights_bytes", "bytes of the weights as held"),
    ("kvgpt_draft_weights_bytes", "bytes of the draft model's weights (--draft)"),
    ("kvgpt_draining", "1 after SIGTERM: new work is refused, /health answers 503"),
    ("vllm:num_requests_running", "sequences in the running batch (vLLM's name)"),
    ("vllm:num_requests_waiting", "sequences waiting for a slot (vLLM's name)"),
    ("vllm:kv_cache_usage_perc", "blocks of the K/V pool in use over all its blocks, 0 to 1 (vLLM's name)"),
    ("vllm:cache_config_info", "the K/V pool's block size and its number of blocks"),
    ("vllm:lora_requests_info", "LoRA adapters (none: kvgpt serves one model)"),
];

/// Every histogram and what it times or places.
const HISTOGRAMS: &[(&str, &str)] = &[
    ("kvgpt_time_to_first_token_seconds", "submission to the first token"),
    ("kvgpt_inter_token_latency_seconds", "time between two tokens of a sequence"),
    ("kvgpt_request_duration_seconds", "whole completion requests"),
    (
        REUSE_STOP,
        "the prompt position where reuse of the prompt cache stopped, one observation per sequence (each of a \
                 request's n choices looks the cache up on its own; 0: nothing reused)",
    ),
];

/// Counters present from the first scrape, at zero, so a rate() has a start.
const ZEROED_COUNTERS: &[&str] = &[
    "kvgpt_sequences_cancelled_total",
    "kvgpt_prompt_tokens_total",
    "kvgpt_prompt_cached_tokens_total",
    "kvgpt_generated_tokens_total",
    "kvgpt_prompt_cache_evictions_total",
    "kvgpt_prompt_cache_lookups_total",
    "kvgpt_prompt_cache_hits_total",
    "kvgpt_spec_decode_num_drafts_total",
    "kvgpt_spec_decode_num_draft_tokens_total",
    "kvgpt_spec_decode_num_accepted_tokens_total",
    "kvgpt_kv_event_batches_total",
    "kvgpt_kv_event_blocks_stored_total",
    "kvgpt_kv_event_blocks_removed_total",
    "vllm:num_preemptions_total",
];

/// Gauges present from the first scrape, at zero.
const ZEROED_GAUGES: &[&str] = &[
    "kvgpt_requests_running",
    "kvgpt_requests_waiting",
    "kvgpt_kv_cache_bytes",
    "kvgpt_kv_blocks_used",
    "kvgpt_kv_blocks_peak",
    "kvgpt_kv_blocks_shared",
    "kvgpt_prompt_cache_bytes",
    "kvgpt_prompt_cache_tokens",
    "kvgpt_draining",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
];

/// Histograms present from the first scrape, empty.
const ZEROED_HISTOGRAMS: &[&str] = &[
    "kvgpt_time_to_first_token_seconds",
    "kvgpt_inter_token_latency_seconds",
    "kvgpt_request_duration_seconds",
    REUSE_STOP,
];

#[derive(Clone)]
pub struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    /// The engine's gauges after its last step (for `/get_load`).
    last: Arc<Mutex<Gauges>>,
}

impl Metrics {
    /// Metrics with every one of `endpoints` counted from the start with status 200.
    pub fn new(endpoints: impl IntoIterator<Item = &'static str>) -> anyhow::Result<Metrics> {
        let recorder = PrometheusBuilder::new()
            .set_buckets(BUCKETS)?
            .set_buckets_for_metric(metrics_exporter_prometheus::Matcher::Full(REUSE_STOP.into()), POSITION_BUCKETS)?
            .build_recorder();
        let handle = recorder.handle();
        let m = Metrics { recorder: Arc::new(recorder), handle, last: Arc::default() };
        m.with(|| {
            for &(name, help) in COUNTERS {
                metrics::describe_counter!(name, help);
            }
            for &(name, help) in GAUGES {
                metrics::describe_gauge!(name, help);
            }
            for &(name, help) in HISTOGRAMS {
                metrics::describe_histogram!(name, help);
            }
            for e in Ending::ALL {
                counter!("kvgpt_sequences_finished_total", "reason" => e.label()).absolute(0);
            }
            for reason in StopReason::ALL {
                counter!("kvgpt_prompt_cache_stops_total", "reason" => reason.label()).absolute(0);
            }
            for &name in ZEROED_COUNTERS {
                counter!(name).absolute(0);
            }
            for endpoint in endpoints {
                counter!("kvgpt_requests_total", "endpoint" => endpoint, "status" => "200").absolute(0);
            }
            for &name in ZEROED_GAUGES {
                gauge!(name).set(0.0);
            }
            for &name in ZEROED_HISTOGRAMS {
                let _ = histogram!(name);
            }
        });
        Ok(m)
    }

    fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        with_local_recorder(self.recorder.as_ref(), f)
    }

    /// The exposition text, in a stable order: families by name, and within a counter's or a
    /// gauge's family the label sets by their text (the exporter's own order follows a hash
    /// map and changes between scrapes). A histogram's lines keep their order (buckets by
    /// `le`, then sum and count); kvgpt's histograms have no labels, so that order is stable.
    pub fn render(&self) -> String {
        stable_order(&self.handle.render())
    }

    pub fn limits(&self, l: &Limits) {
        self.with(|| {
            gauge!("kvgpt_weights_bytes").set(l.weights as f64);
            gauge!("kvgpt_draft_weights_bytes").set(l.draft_weights as f64);
            gauge!("kvgpt_kv_cache_limit_bytes").set(l.kv as f64);
            gauge!("kvgpt_prompt_cache_limit_bytes").set(l.cache as f64);
            let (block_size, blocks) = (l.block_size.to_string(), l.kv_blocks.to_string());
            gauge!("vllm:cache_config_info", "block_size" => block_size, "num_gpu_blocks" => blocks).set(1.0);
            let none = || String::new();
            gauge!("vllm:lora_requests_info", "max_lora" => "0", "running_lora_adapters" => none(),
                "waiting_lora_adapters" => none())
            .set(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()));
        });
    }

    /// The engine's gauges after its last step.
    pub fn last_step(&self) -> Gauges {
        *self.last.lock().expect("the last gauges")
    }

    pub fn draining(&self) {
        self.with(|| gauge!("kvgpt_draining").set(1.0));
    }

    /// A batch of KV-cache events went out.
    pub fn kv_events(&self, events: &[BlockEvent]) {
        let blocks = |f: fn(&BlockEvent) -> usize| events.iter().map(f).sum::<usize>() as u64;
        let stored = blocks(|e| if let BlockEvent::Stored { hashes, .. } = e { hashes.len() } else { 0 });
        let removed = blocks(|e| if let BlockEvent::Removed { hashes } = e { hashes.len() } else { 0 });
        self.with(|| {
            counter!("kvgpt_kv_event_batches_total").increment(1);
            counter!("kvgpt_kv_event_blocks_stored_total").increment(stored);
            counter!("kvgpt_kv_event_blocks_removed_total").increment(removed);
        });
    }

    pub fn request(&self, endpoint: &str, status: u16) {
        let (endpoint, status) = (endpoint.to_string(), status.to_string());
        self.with(|| counter!("kvgpt_requests_total", "endpoint" => endpoint, "status" => status).increment(1));
    }

    pub fn request_seconds(&self, d: Duration) {
        self.with(|| histogram!("kvgpt_request_duration_seconds").record(d.as_secs_f64()));
    }

    /// The engine thread's observer.
    pub fn monitor(&self) -> EngineMonitor {
        EngineMonitor { metrics: self.clone() }
    }
}

/// The sizes the server's fixed gauges report.
pub struct Limits {
    pub weights: usize,
    pub draft_weights: usize,
    /// Bytes of the K/V pool, and its blocks.
    pub kv: usize,
    pub kv_blocks: usize,
    pub cache: usize,
    /// The pool's block size (also the KV events'), which `vllm:cache_config_info` reports.
    pub block_size: usize,
}

/// The tiers under the pool, each under its `tier` label.
fn store_counts(c: &StoreCounts) {
    counter!("kvgpt_kv_verified_blocks_total").absolute(c.verified);
    counter!("kvgpt_kv_verified_known_blocks_total").absolute(c.verified_known);
    counter!("kvgpt_kv_verify_failures_total").absolute(c.verify_failures);
    for t in c.tiers.iter().flatten() {
        let tier = ("tier", t.name);
        counter!("kvgpt_kv_store_written_blocks_total", &[tier]).absolute(t.written);
        counter!("kvgpt_kv_store_skipped_blocks_total", &[tier]).absolute(t.skipped);
        counter!("kvgpt_kv_store_hit_blocks_total", &[tier]).absolute(t.hits);
        counter!("kvgpt_kv_store_read_bytes_total", &[tier]).absolute(t.bytes_read);
        for (reason, &n) in ["header", "truncated", "checksum", "mismatch"].iter().zip(&t.refused) {
            counter!("kvgpt_kv_store_refused_blocks_total", &[tier, ("reason", *reason)]).absolute(n);
        }
        gauge!("kvgpt_kv_store_up", &[tier]).set(if t.up { 1.0 } else { 0.0 });
        if let Some((blocks, bytes)) = t.held {
            gauge!("kvgpt_kv_store_blocks", &[tier]).set(blocks as f64);
            gauge!("kvgpt_kv_store_bytes", &[tier]).set(bytes as f64);
        }
    }
}

pub struct EngineMonitor {
    metrics: Metrics,
}

impl Monitor for EngineMonitor {
    fn step(&mut self, g: &Gauges) {
        // The pool's blocks in use (by running sequences or the prompt cache) over all of them.
        let usage = g.pool_used as f64 / g.pool_blocks.max(1) as f64;
        *self.metrics.last.lock().expect("the last gauges") = *g;
        self.metrics.with(|| {
            gauge!("kvgpt_requests_running").set(g.running as f64);
            gauge!("kvgpt_requests_waiting").set(g.waiting as f64);
            gauge!("vllm:num_requests_running").set(g.running as f64);
            gauge!("vllm:num_requests_waiting").set(g.waiting as f64);
            gauge!("vllm:kv_cache_usage_perc").set(usage);
            gauge!("kvgpt_kv_cache_bytes").set(g.kv_bytes as f64);
            gauge!("kvgpt_kv_blocks_used").set(g.pool_used as f64);
            gauge!("kvgpt_kv_blocks_peak").set(g.pool_peak as f64);
            gauge!("kvgpt_kv_blocks_shared").set(g.blocks_shared as f64);
            counter!("vllm:num_preemptions_total").absolute(g.preemptions);
            gauge!("kvgpt_prompt_cache_bytes").set(g.cache_bytes as f64);
            gauge!("kvgpt_prompt_cache_tokens").set(g.cache_tokens as f64);
            counter!("kvgpt_prompt_cache_evictions_total").absolute(g.stats.evicted_nodes);
            counter!("kvgpt_prompt_cache_lookups_total").absolute(g.stats.lookups);
            counter!("kvgpt_prompt_cache_hits_total").absolute(g.stats.hits);
            if let Some(c) = &g.store {
                store_counts(c);
            }
        });
    }

    fn first_token(&mut self, ttft: Duration) {
        self.metrics.with(|| histogram!("kvgpt_time_to_first_token_seconds").record(ttft.as_secs_f64()));
    }

    fn token(&mut self, itl: Duration) {
        self.metrics.with(|| histogram!("kvgpt_inter_token_latency_seconds").record(itl.as_secs_f64()));
    }

    fn finished(&mut self, u: &Usage, ending: Ending) {
        self.metrics.with(|| {
            counter!("kvgpt_prompt_tokens_total").increment(u.prompt_tokens as u64);
            counter!("kvgpt_prompt_cached_tokens_total").increment(u.cached_tokens as u64);
            counter!("kvgpt_generated_tokens_total").increment(u.completion_tokens as u64);
            counter!("kvgpt_sequences_finished_total", "reason" => ending.label()).increment(1);
            counter!("kvgpt_spec_decode_num_drafts_total").increment(u.draft_steps as u64);
            counter!("kvgpt_spec_decode_num_draft_tokens_total").increment(u.drafted_tokens as u64);
            counter!("kvgpt_spec_decode_num_accepted_tokens_total").increment(u.accepted_tokens as u64);
            if ending == Ending::Cancelled {
                counter!("kvgpt_sequences_cancelled_total").increment(1);
            }
            if let Some(r) = &u.reuse {
                histogram!(REUSE_STOP).record(r.reused as f64);
                counter!("kvgpt_prompt_cache_stops_total", "reason" => r.reason.label()).increment(1);
            }
        });
    }
}

/// Sorts the exposition text's families (blocks separated by a blank line) by name, and the
/// sample lines of a counter or gauge family by their text.
fn stable_order(text: &str) -> String {
    let mut families: Vec<(String, Vec<&str>)> = text
        .split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let lines: Vec<&str> = block.lines().filter(|l| !l.is_empty()).collect();
            let name = lines
                .iter()
                .find_map(|l| l.strip_prefix("# TYPE ").or_else(|| (!l.starts_with('#')).then_some(*l)))
                .and_then(|l| l.split([' ', '{']).next())
                .unwrap_or("")
                .to_string();
            (name, lines)
        })
        .collect();
    families.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::with_capacity(text.len());
    for (_, mut lines) in families {
        let histogram =
            lines.iter().any(|l| l.starts_with("# TYPE ") && (l.ends_with(" histogram") || l.ends_with(" summary")));
        let first_sample = lines.iter().position(|l| !l.starts_with('#')).unwrap_or(lines.len());
        if !histogram {
            lines[first_sample..].sort_unstable();
        }
        for l in lines {
            out.push_str(l);
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn families_and_label_sets_come_in_one_order() {
        let a = "# HELP b_total B\n# TYPE b_total counter\nb_total{x=\"2\"} 1\nb_total{x=\"1\"} 3\n\n# TYPE a gauge\na 5\n\n";
        let b = "# TYPE a gauge\na 5\n\n# HELP b_total B\n# TYPE b_total counter\nb_total{x=\"1\"} 3\nb_total{x=\"2\"} 1\n\n";
        let want = "# TYPE a gauge\na 5\n\n# HELP b_total B\n# TYPE b_total counter\nb_total{x=\"1\"} 3\nb_total{x=\"2\"} 1\n\n";
        assert_eq!(super::stable_order(a), want);
        assert_eq!(super::stable_order(b), want);
        let h = "# TYPE h histogram\nh_bucket{le=\"0.5\"} 1\nh_bucket{le=\"10\"} 2\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n\n";
        assert_eq!(super::stable_order(h), h);
    }
}
