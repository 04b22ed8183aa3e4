//! Prometheus metrics through the `metrics` crate, recorded into a recorder the server owns (no
//! process-wide recorder is installed): the HTTP side records requests, the engine thread records
//! tokens, latencies, the running and waiting counts and the K/V memory.

use kvgpt::engine::{Ending, Gauges, Monitor, Usage};
use metrics::{counter, gauge, histogram, with_local_recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use std::sync::Arc;
use std::time::Duration;

const BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

#[derive(Clone)]
pub struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
}

impl Metrics {
    pub fn new() -> anyhow::Result<Metrics> {
        let recorder = PrometheusBuilder::new().set_buckets(BUCKETS)?.build_recorder();
        let handle = recorder.handle();
        let m = Metrics { recorder: Arc::new(recorder), handle };
        m.with(|| {
            metrics::describe_counter!("kvgpt_requests_total", "HTTP requests by endpoint and status");
            metrics::describe_counter!("kvgpt_prompt_tokens_total", "prompt tokens of finished sequences");
            metrics::describe_counter!(
                "kvgpt_prompt_cached_tokens_total",
                "prompt tokens whose K/V came from the prompt cache"
            );
            metrics::describe_counter!("kvgpt_generated_tokens_total", "tokens generated");
            metrics::describe_counter!("kvgpt_sequences_cancelled_total", "sequences whose client went away");
            metrics::describe_counter!(
                "kvgpt_sequences_finished_total",
                "sequences that left the engine, by reason: eos, length, stop (a stop sequence), cancelled, error"
            );
            for e in Ending::ALL {
                counter!("kvgpt_sequences_finished_total", "reason" => e.label()).absolute(0);
            }
            counter!("kvgpt_sequences_cancelled_total").absolute(0);
            metrics::describe_histogram!("kvgpt_time_to_first_token_seconds", "submission to the first token");
            metrics::describe_histogram!("kvgpt_inter_token_latency_seconds", "time between two tokens of a sequence");
            metrics::describe_histogram!("kvgpt_request_duration_seconds", "whole completion requests");
            metrics::describe_gauge!("kvgpt_requests_running", "sequences in the running batch");
            metrics::describe_gauge!("kvgpt_requests_waiting", "sequences waiting for a slot");
            metrics::describe_gauge!("kvgpt_kv_cache_bytes", "K/V bytes held by running sequences");
            metrics::describe_gauge!("kvgpt_kv_cache_limit_bytes", "K/V bytes all slots may hold");
            metrics::describe_gauge!("kvgpt_prompt_cache_bytes", "K/V bytes held by the prompt cache");
            metrics::describe_gauge!("kvgpt_prompt_cache_limit_bytes", "the prompt cache's budget (--cache-mb)");
            metrics::describe_gauge!("kvgpt_prompt_cache_tokens", "positions held by the prompt cache");
            metrics::describe_counter!("kvgpt_prompt_cache_evictions_total", "prompt cache entries evicted");
            metrics::describe_counter!("kvgpt_prompt_cache_lookups_total", "prompt cache lookups");
            metrics::describe_counter!("kvgpt_prompt_cache_hits_total", "lookups that reused at least one token");
            metrics::describe_gauge!("kvgpt_weights_bytes", "bytes of the weights as held");
        });
        Ok(m)
    }

    fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        with_local_recorder(self.recorder.as_ref(), f)
    }

    pub fn render(&self) -> String {
        self.handle.render()
    }

    pub fn limits(&self, weights: usize, kv: usize, cache: usize) {
        self.with(|| {
            gauge!("kvgpt_weights_bytes").set(weights as f64);
            gauge!("kvgpt_kv_cache_limit_bytes").set(kv as f64);
            gauge!("kvgpt_prompt_cache_limit_bytes").set(cache as f64);
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
        EngineMonitor(self.clone())
    }
}

pub struct EngineMonitor(Metrics);

impl Monitor for EngineMonitor {
    fn step(&mut self, g: &Gauges) {
        self.0.with(|| {
            gauge!("kvgpt_requests_running").set(g.running as f64);
            gauge!("kvgpt_requests_waiting").set(g.waiting as f64);
            gauge!("kvgpt_kv_cache_bytes").set(g.kv_bytes as f64);
            gauge!("kvgpt_prompt_cache_bytes").set(g.cache_bytes as f64);
            gauge!("kvgpt_prompt_cache_tokens").set(g.cache_tokens as f64);
            counter!("kvgpt_prompt_cache_evictions_total").absolute(g.stats.evicted_nodes);
            counter!("kvgpt_prompt_cache_lookups_total").absolute(g.stats.lookups);
            counter!("kvgpt_prompt_cache_hits_total").absolute(g.stats.hits);
        });
    }

    fn first_token(&mut self, ttft: Duration) {
        self.0.with(|| histogram!("kvgpt_time_to_first_token_seconds").record(ttft.as_secs_f64()));
    }

    fn token(&mut self, itl: Duration) {
        self.0.with(|| histogram!("kvgpt_inter_token_latency_seconds").record(itl.as_secs_f64()));
    }

    fn finished(&mut self, u: &Usage, ending: Ending) {
        self.0.with(|| {
            counter!("kvgpt_prompt_tokens_total").increment(u.prompt_tokens as u64);
            counter!("kvgpt_prompt_cached_tokens_total").increment(u.cached_tokens as u64);
            counter!("kvgpt_generated_tokens_total").increment(u.completion_tokens as u64);
            counter!("kvgpt_sequences_finished_total", "reason" => ending.label()).increment(1);
            if ending == Ending::Cancelled {
                counter!("kvgpt_sequences_cancelled_total").increment(1);
            }
        });
    }
}
