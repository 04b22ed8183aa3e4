//! `kvgpt bench`'s report: what the run was, one row per test as the table, JSON and CSV show
//! it, and the tables that compare rows (cached against uncached, sampled, drafted, batched).

mod csv;
mod llama_keys;

pub use csv::csv;

use super::{mean_sd, percentile, Row, Test};
use kvgpt_core::units::{bytes, count};
use kvgpt_core::{KvCache, Loaded};
use serde::Serialize;
use std::fmt::{Result, Write as _};

/// What the run was: printed above the table, and repeated in every JSON and CSV row.
#[derive(Clone)]
pub struct Header {
    pub model: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub dtype: &'static str,
    pub threads: usize,
    pub isa: &'static str,
    pub cpu_features: Vec<&'static str>,
    pub git: &'static str,
    pub load_ms: f64,
    pub weight_bytes: usize,
    pub parameters: usize,
    pub kv_cache_bytes: usize,
    pub kv_block_size: usize,   // --kv-block-size
    pub kv_dtype: &'static str, // --kv-dtype
    pub peak_rss_bytes: u64,
    pub read_bandwidth_gb_s: f64,
    /// Depths were given (-d): rows are named `… @ dN`.
    pub depths: bool,
}

impl Header {
    /// What a run over `loaded` was (its thread count is each group's own, set by [`Report::new`]).
    pub fn of(
        loaded: &Loaded,
        load_ms: f64,
        peak_rss_bytes: u64,
        bandwidth: f64,
        depths: bool,
        git: &'static str,
    ) -> Header {
        let (m, cfg) = (&loaded.model, &loaded.model.config);
        Header {
            model: loaded.files.name.clone(),
            n_layer: cfg.n_layer,
            n_embd: cfg.n_embd,
            n_head: cfg.n_head,
            dtype: m.weights_dtype(),
            threads: 0,
            isa: m.isa().name(),
            cpu_features: kvgpt_core::cpu_features(),
            git,
            load_ms,
            weight_bytes: m.weight_bytes(),
            parameters: kvgpt_core::weights::parameter_count(cfg),
            kv_cache_bytes: KvCache::bytes_per_position_as(cfg, m.kv().kv_type()) * cfg.n_positions,
            kv_block_size: m.kv().block(),
            kv_dtype: m.kv().kv_type().name(),
            peak_rss_bytes,
            read_bandwidth_gb_s: bandwidth,
            depths,
        }
    }
}

/// A whole run: per thread count, its header and its rows.
pub struct Report<'a> {
    groups: Vec<(Header, &'a [Row])>,
    sampler: &'a str,
    draft: &'a str,
}

impl<'a> Report<'a> {
    /// The run of `groups` (each thread count's rows), the sampled rows' sampler and the draft's name.
    pub fn new(header: Header, groups: &'a [(usize, Vec<Row>)], sampler: &'a str, draft: &'a str) -> Report<'a> {
        let groups =
            groups.iter().map(|(threads, rows)| (Header { threads: *threads, ..header.clone() }, &rows[..])).collect();
        Report { groups, sampler, draft }
    }

    /// Every row of every thread count, as JSON and CSV show them.
    pub fn rows(&self) -> Vec<RowReport<'_>> {
        self.groups
            .iter()
            .flat_map(|(h, rows)| rows.iter().map(move |r| RowReport::of(r, h, self.sampler, self.draft)))
            .collect()
    }

    /// The Markdown: one header and one table of every row at every thread count (as
    /// llama-bench prints `-t 1,2`), then each count's comparisons.
    pub fn markdown(&self) -> String {
        let threads: Vec<String> = self.groups.iter().map(|(h, _)| h.threads.to_string()).collect();
        let said = match &threads[..] {
            [_] => count(self.groups[0].0.threads, "thread"),
            all => format!("threads {}", all.join(", ")),
        };
        let all: Vec<RowReport> = self.rows();
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = md_header(&mut out, &self.groups[0].0, &said).and_then(|()| md_rows(&mut out, &all));
        for (h, rows) in &self.groups {
            let reports: Vec<RowReport> = rows.iter().map(|r| RowReport::of(r, h, self.sampler, self.draft)).collect();
            if self.groups.len() > 1 {
                out.push_str(&format!("\nAt {}:\n", count(h.threads, "thread")));
            }
            let _ = md_comparisons(&mut out, h, rows, &reports);
        }
        out
    }
}

/// One row of the report, as the table, JSON and CSV show it.
#[derive(Serialize, Clone)]
pub struct RowReport<'a> {
    /// What llama-bench's rows say of the model: its name, the bytes of its weights as held, its
    /// parameters, and where it runs.
    model: &'a str,
    model_size_bytes: usize,
    model_params: usize,
    backend: &'static str,
    test: String,
    mode: &'static str,
    prompt_tokens: usize,
    /// Tokens in the cache before the timed part (llama-bench's n_depth): a prefill row's depth,
    /// a decode row's context.
    n_depth: usize,
    gen_tokens: usize,
    dtype: &'static str,
    threads: usize,
    reps: usize,
    tok_s_avg: f64,
    tok_s_sd: f64,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    /// Prefill rows: the mean time of one prefill.
    #[serde(skip_serializing_if = "Option::is_none")]
    ttft_ms: Option<f64>,
    /// Cached decode rows: weight bytes read per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    weight_gb_s: Option<f64>,
    peak_rss_mb: f64,
    load_ms: f64,
    read_bandwidth_gb_s: f64,
    kv_block_size: usize,
    kv_dtype: &'static str,
    isa: &'static str,
    cpu_features: &'a [&'static str],
    git: &'static str,
    batch: usize,
    /// How each decode step chose its token: "greedy", or the sampler's settings.
    sampler: &'a str,
    /// Drafted rows: the draft, the share of drafted tokens accepted, and tokens per verify step.
    #[serde(skip_serializing_if = "Option::is_none")]
    draft: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    acceptance: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens_per_step: Option<f64>,
    /// llama-bench's names for the same row.
    #[serde(flatten)]
    llama: llama_keys::LlamaBenchKeys<'a>,
}

impl<'a> RowReport<'a> {
    pub fn of(r: &Row, h: &'a Header, sampler: &'a str, draft: &'a str) -> RowReport<'a> {
        let (avg, sd) = mean_sd(&r.tok_s);
        let drafted = matches!(r.test, Test::Drafted { .. });
        let (prompt, gen, mode, batch) = match r.test {
            Test::Drafted { prompt, gen } => (prompt, gen, "drafted", 1),
            Test::Prefill { prompt, .. } => (prompt, 0, "cached", 1),
            Test::Decode { prompt, gen, sampled: true, .. } => (prompt, gen, "sampled", 1),
            Test::Decode { prompt, gen, cached, .. } => (prompt, gen, if cached { "cached" } else { "uncached" }, 1),
            Test::Batched { prompt, gen, batch } => (prompt, gen, "batched", batch),
        };
        RowReport {
            llama: llama_keys::LlamaBenchKeys::of(h, (prompt, gen, batch), &r.tok_s),
            model: &h.model,
            model_size_bytes: h.weight_bytes,
            model_params: h.parameters,
            backend: "CPU",
            test: r.test.name(h.depths),
            mode,
            prompt_tokens: prompt,
            n_depth: r.test.context(),
            gen_tokens: gen,
            dtype: h.dtype,
            threads: h.threads,
            reps: r.tok_s.len(),
            tok_s_avg: avg,
            tok_s_sd: sd,
            p50_ms: percentile(&r.step_ms, 50.0),
            p90_ms: percentile(&r.step_ms, 90.0),
            p99_ms: percentile(&r.step_ms, 99.0),
            ttft_ms: matches!(r.test, Test::Prefill { .. }).then(|| mean_sd(&r.step_ms).0),
            weight_gb_s: matches!(r.test, Test::Decode { cached: true, .. }).then(|| h.weight_bytes as f64 * avg / 1e9),
            peak_rss_mb: h.peak_rss_bytes as f64 / 1e6,
            load_ms: h.load_ms,
            read_bandwidth_gb_s: h.read_bandwidth_gb_s,
            kv_block_size: h.kv_block_size,
            kv_dtype: h.kv_dtype,
            isa: h.isa,
            cpu_features: &h.cpu_features,
            git: h.git,
            batch,
            sampler: if matches!(r.test, Test::Decode { sampled: true, .. }) { sampler } else { "greedy" },
            draft: drafted.then_some(draft),
            acceptance: drafted.then(|| r.drafts.acceptance()),
            tokens_per_step: drafted.then(|| (gen * r.tok_s.len()) as f64 / r.step_ms.len().max(1) as f64),
        }
    }
}

/// One thread count's run as Markdown: what it was, the table of every row, then the tables
/// that compare rows and the time to the first token.
/// The tables that compare one thread count's rows, and its time to the first token.
fn md_comparisons(out: &mut String, h: &Header, rows: &[Row], reports: &[RowReport]) -> Result {
    md_uncached(out, rows)
        .and_then(|()| md_sampled(out, rows, reports))
        .and_then(|()| md_drafted(out, rows, reports))
        .and_then(|()| md_batched(out, rows))
        .and_then(|()| md_first_token(out, h, rows))
}

/// What the run was; `threads` as said ("2 threads", or the list of `-t`).
fn md_header(out: &mut String, h: &Header, threads: &str) -> Result {
    let load_ms = h.load_ms;
    writeln!(
        out,
        "kvgpt bench — {} ({}, n_embd {}, {}) | dtype {} | {} | isa {} | cpu {} | git {}",
        h.model,
        count(h.n_layer, "layer"),
        h.n_embd,
        count(h.n_head, "head"),
        h.dtype,
        threads,
        h.isa,
        h.cpu_features.join(" "),
        h.git,
    )?;
    let (w, kv, rss) = (h.weight_bytes, h.kv_cache_bytes, h.peak_rss_bytes as usize);
    writeln!(
        out,
        "load {load_ms:.0} ms | weights {} | KV cache {} ({}, blocks of {}) | peak RSS {} ({:.2} × weights+KV) | read bandwidth probe {:.1} GB/s",
        bytes(w),
        bytes(kv),
        h.kv_dtype,
        h.kv_block_size,
        bytes(rss),
        rss as f64 / (w + kv) as f64,
        h.read_bandwidth_gb_s
    )?;
    writeln!(
        out,
        "A decode step is timed from choosing its token (greedy, or the sampler on sampled rows) through its \
         forward pass; a prefill row times its forward pass; tokenization is excluded (synthetic ids).\n"
    )
}

fn md_rows(out: &mut String, reports: &[RowReport]) -> Result {
    writeln!(
        out,
        "| model | size | params | backend | threads | test | prompt | mode | tok/s | ± sd | p50 ms | p90 ms | \
         p99 ms | TTFT ms | weights GB/s |"
    )?;
    writeln!(out, "|---|---:|---:|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")?;
    for r in reports {
        let opt = |x: Option<f64>| x.map(|v| format!("{v:.1}")).unwrap_or_default();
        // One repetition has no spread to show.
        let sd = if r.reps > 1 { format!("{:.1}", r.tok_s_sd) } else { "–".to_string() };
        writeln!(
            out,
            "| {} | {:.2} MiB | {:.2} M | {} | {} | {} | {} | {} | {:.1} | {sd} | {:.2} | {:.2} | {:.2} | {} | {} |",
            r.model,
            r.model_size_bytes as f64 / 1048576.0,
            r.model_params as f64 / 1e6,
            r.backend,
            r.threads,
            r.test,
            r.prompt_tokens,
            r.mode,
            r.tok_s_avg,
            r.p50_ms,
            r.p90_ms,
            r.p99_ms,
            opt(r.ttft_ms),
            opt(r.weight_gb_s),
        )?;
    }
    Ok(())
}

/// The cached greedy decode row of a context and generation length.
fn greedy(prompt: usize, gen: usize) -> Test {
    Test::Decode { prompt, gen, cached: true, sampled: false }
}

/// The mean of the row `test`'s tokens per second (0 without one).
fn tok_s_of(rows: &[Row], test: Test) -> f64 {
    rows.iter().find(|r| r.test == test).map_or(0.0, |r| mean_sd(&r.tok_s).0)
}

/// Cached against uncached decoding per context length.
fn md_uncached(out: &mut String, rows: &[Row]) -> Result {
    let decode: Vec<&Row> = rows.iter().filter(|r| matches!(r.test, Test::Decode { cached: false, .. })).collect();
    if decode.is_empty() {
        return Ok(());
    }
    writeln!(out, "\n| decode | context (prompt) | cached tok/s | uncached tok/s | speedup |")?;
    writeln!(out, "|---|---:|---:|---:|---:|")?;
    for u in decode {
        let Test::Decode { prompt, gen, .. } = u.test else { continue };
        let (ca, ua) = (tok_s_of(rows, greedy(prompt, gen)), mean_sd(&u.tok_s).0);
        writeln!(out, "| tg{gen} | {prompt} | {ca:.1} | {ua:.1} | {:.1}× |", ca / ua.max(1e-12))?;
    }
    Ok(())
}

/// Sampled decoding against greedy at the same context: time per token, sampling included.
fn md_sampled(out: &mut String, rows: &[Row], reports: &[RowReport]) -> Result {
    let sampled: Vec<&Row> = rows.iter().filter(|r| matches!(r.test, Test::Decode { sampled: true, .. })).collect();
    if sampled.is_empty() {
        return Ok(());
    }
    let sampler = reports.iter().find(|r| r.mode == "sampled").map_or("", |r| r.sampler);
    writeln!(out, "\n| decode | context (prompt) | greedy ms/token | sampled ms/token ({sampler}) | × greedy |")?;
    writeln!(out, "|---|---:|---:|---:|---:|")?;
    for s in sampled {
        let Test::Decode { prompt, gen, .. } = s.test else { continue };
        let g = rows.iter().find(|r| r.test == greedy(prompt, gen));
        let (gm, sm) = (g.map(|g| mean_sd(&g.step_ms).0).unwrap_or(0.0), mean_sd(&s.step_ms).0);
        writeln!(out, "| tg{gen} | {prompt} | {gm:.3} | {sm:.3} | {:.3}× |", sm / gm.max(1e-12))?;
    }
    Ok(())
}

/// Speculative decoding against plain greedy decoding at the same context.
fn md_drafted(out: &mut String, rows: &[Row], reports: &[RowReport]) -> Result {
    let drafted: Vec<(&Row, &RowReport)> =
        rows.iter().zip(reports).filter(|(r, _)| matches!(r.test, Test::Drafted { .. })).collect();
    let Some((_, first)) = drafted.first() else { return Ok(()) };
    let draft = first.draft.unwrap_or("");
    writeln!(
        out,
        "\n| decode | context (prompt) | plain tok/s | tok/s with draft {draft} | × plain | acceptance | tokens / verify step |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|")?;
    for (d, rep) in drafted {
        let Test::Drafted { prompt, gen } = d.test else { continue };
        let (plain, with) = (tok_s_of(rows, greedy(prompt, gen)), mean_sd(&d.tok_s).0);
        writeln!(
            out,
            "| tg{gen} | {prompt} | {plain:.1} | {with:.1} | {:.2}× | {:.0}% | {:.2} |",
            with / plain.max(1e-12),
            100.0 * rep.acceptance.unwrap_or(0.0),
            rep.tokens_per_step.unwrap_or(0.0)
        )?;
    }
    writeln!(
        out,
        "The answers are the same bits with and without the draft; the speed is not: it depends on how often \
         the draft guesses what the model says, here on synthetic prompts (random weights repeat themselves, \
         so their acceptance says nothing about real text)."
    )
}

/// Batched decoding against one sequence at the same context.
fn md_batched(out: &mut String, rows: &[Row]) -> Result {
    let batched: Vec<&Row> = rows.iter().filter(|r| matches!(r.test, Test::Batched { .. })).collect();
    if batched.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\n| batched decode | context (prompt) | sequences | tok/s (all) | tok/s per sequence | × one sequence |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|")?;
    for b in batched {
        let Test::Batched { prompt, gen, batch } = b.test else { continue };
        let (all, single) = (mean_sd(&b.tok_s).0, tok_s_of(rows, greedy(prompt, gen)));
        writeln!(
            out,
            "| tg{gen} | {prompt} | {batch} | {all:.1} | {:.1} | {:.2}× |",
            all / batch as f64,
            all / single.max(1e-12)
        )?;
    }
    Ok(())
}

/// The load and a 4-token prompt's prefill, and how many decode steps that is.
fn md_first_token(out: &mut String, h: &Header, rows: &[Row]) -> Result {
    let Some(pp4) = rows.iter().find(|r| r.test == Test::Prefill { prompt: 4, depth: 0 }) else { return Ok(()) };
    let ttft = h.load_ms + mean_sd(&pp4.step_ms).0;
    // In decode steps after the same prompt, when one was timed (not with -n 0, or -d).
    let steps = match rows.iter().find(|r| r.test == greedy(4, r_gen(r))) {
        Some(r) => {
            let step = percentile(&r.step_ms, 50.0);
            format!(" = {:.1} decode steps of {step:.2} ms", ttft / step.max(1e-9))
        }
        None => String::new(),
    };
    writeln!(out, "\nload to first token (4-token prompt): {ttft:.1} ms{steps}")
}

fn r_gen(r: &Row) -> usize {
    match r.test {
        Test::Decode { gen, .. } | Test::Batched { gen, .. } | Test::Drafted { gen, .. } => gen,
        Test::Prefill { .. } => 0,
    }
}
