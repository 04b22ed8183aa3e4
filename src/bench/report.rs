//! `kvgpt bench`'s report: what the run was, one row per test as the table, JSON and CSV show
//! it, and the tables that compare rows (cached against uncached, sampled, drafted, batched).

use anyhow::Result;
use kvgpt_views::bench::{mean_sd, percentile, Row, Test};
use serde::Serialize;

/// What the run was: printed above the table, and repeated in every JSON and CSV row.
#[derive(Clone)]
pub(super) struct Header {
    pub(super) model: String,
    pub(super) n_layer: usize,
    pub(super) n_embd: usize,
    pub(super) n_head: usize,
    pub(super) dtype: &'static str,
    pub(super) threads: usize,
    pub(super) isa: &'static str,
    pub(super) cpu_features: Vec<&'static str>,
    pub(super) git: &'static str,
    pub(super) load_ms: f64,
    pub(super) weight_bytes: usize,
    pub(super) parameters: usize,
    pub(super) kv_cache_bytes: usize,
    pub(super) peak_rss_bytes: u64,
    pub(super) read_bandwidth_gb_s: f64,
    /// Depths were given (-d): rows are named `… @ dN`.
    pub(super) depths: bool,
}

/// One row of the report, as the table, JSON and CSV show it.
#[derive(Serialize, Clone)]
pub(super) struct RowReport<'a> {
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
}

impl<'a> RowReport<'a> {
    pub(super) fn of(r: &Row, h: &'a Header, sampler: &'a str, draft: &'a str) -> RowReport<'a> {
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

pub(super) fn print_csv(rows: &[RowReport]) -> Result<()> {
    outln!(
        "test,mode,prompt_tokens,gen_tokens,dtype,threads,reps,tok_s_avg,tok_s_sd,p50_ms,p90_ms,p99_ms,ttft_ms,\
         weight_gb_s,peak_rss_mb,git,batch,sampler,draft,acceptance,tokens_per_step,model,model_size_bytes,\
         model_params,backend,n_depth"
    );
    // The model's name may hold a comma or a quote: quoted as CSV quotes a field.
    let quoted = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let opt = |x: Option<f64>| x.map(|v| v.to_string()).unwrap_or_default();
    for r in rows {
        outln!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.test,
            r.mode,
            r.prompt_tokens,
            r.gen_tokens,
            r.dtype,
            r.threads,
            r.reps,
            r.tok_s_avg,
            r.tok_s_sd,
            r.p50_ms,
            r.p90_ms,
            r.p99_ms,
            opt(r.ttft_ms),
            opt(r.weight_gb_s),
            r.peak_rss_mb,
            r.git,
            r.batch,
            r.sampler,
            r.draft.unwrap_or(""),
            opt(r.acceptance),
            opt(r.tokens_per_step),
            quoted(r.model),
            r.model_size_bytes,
            r.model_params,
            r.backend,
            r.n_depth
        );
    }
    Ok(())
}

pub(super) fn print_md(h: &Header, rows: &[Row], reports: &[RowReport]) -> Result<()> {
    let load_ms = h.load_ms;
    outln!(
        "kvgpt bench — {} ({}, n_embd {}, {}) | dtype {} | {} | isa {} | cpu {} | git {}",
        h.model,
        kvgpt_core::units::count(h.n_layer, "layer"),
        h.n_embd,
        kvgpt_core::units::count(h.n_head, "head"),
        h.dtype,
        kvgpt_core::units::count(h.threads, "thread"),
        h.isa,
        h.cpu_features.join(" "),
        h.git,
    );
    let mb = |b: f64| b / 1e6;
    let (w, kv, rss) = (mb(h.weight_bytes as f64), mb(h.kv_cache_bytes as f64), mb(h.peak_rss_bytes as f64));
    outln!(
        "load {load_ms:.0} ms | weights {w:.1} MB | KV cache {kv:.1} MB | peak RSS {rss:.1} MB ({:.2} × weights+KV) | read bandwidth probe {:.1} GB/s",
        rss / (w + kv),
        h.read_bandwidth_gb_s
    );
    outln!(
        "A decode step is timed from choosing its token (greedy, or the sampler on sampled rows) through its \
         forward pass; a prefill row times its forward pass; tokenization is excluded (synthetic ids).\n"
    );
    outln!(
        "| model | size | params | backend | threads | test | prompt | mode | tok/s | ± sd | p50 ms | p90 ms | \
         p99 ms | TTFT ms | weights GB/s |"
    );
    outln!("|---|---:|---:|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in reports {
        let opt = |x: Option<f64>| x.map(|v| format!("{v:.1}")).unwrap_or_default();
        // One repetition has no spread to show.
        let sd = if r.reps > 1 { format!("{:.1}", r.tok_s_sd) } else { "–".to_string() };
        outln!(
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
        );
    }
    // Cached against uncached decoding per context length.
    let greedy = |prompt, gen| Test::Decode { prompt, gen, cached: true, sampled: false };
    let decode: Vec<&Row> = rows.iter().filter(|r| matches!(r.test, Test::Decode { cached: false, .. })).collect();
    if !decode.is_empty() {
        outln!("\n| decode | context (prompt) | cached tok/s | uncached tok/s | speedup |");
        outln!("|---|---:|---:|---:|---:|");
        for u in decode {
            let Test::Decode { prompt, gen, .. } = u.test else { continue };
            let c = rows.iter().find(|r| r.test == greedy(prompt, gen));
            let (ca, ua) = (c.map(|c| mean_sd(&c.tok_s).0).unwrap_or(0.0), mean_sd(&u.tok_s).0);
            outln!("| tg{gen} | {prompt} | {ca:.1} | {ua:.1} | {:.1}× |", ca / ua.max(1e-12));
        }
    }
    // Sampled decoding against greedy at the same context: time per token, sampling included.
    let sampled: Vec<&Row> = rows.iter().filter(|r| matches!(r.test, Test::Decode { sampled: true, .. })).collect();
    if !sampled.is_empty() {
        let sampler = reports.iter().find(|r| r.mode == "sampled").map_or("", |r| r.sampler);
        outln!("\n| decode | context (prompt) | greedy ms/token | sampled ms/token ({sampler}) | × greedy |");
        outln!("|---|---:|---:|---:|---:|");
        for s in sampled {
            let Test::Decode { prompt, gen, .. } = s.test else { continue };
            let g = rows.iter().find(|r| r.test == greedy(prompt, gen));
            let (gm, sm) = (g.map(|g| mean_sd(&g.step_ms).0).unwrap_or(0.0), mean_sd(&s.step_ms).0);
            outln!("| tg{gen} | {prompt} | {gm:.3} | {sm:.3} | {:.3}× |", sm / gm.max(1e-12));
        }
    }
    // Speculative decoding against plain greedy decoding at the same context.
    let drafted: Vec<(&Row, &RowReport)> =
        rows.iter().zip(reports).filter(|(r, _)| matches!(r.test, Test::Drafted { .. })).collect();
    if let Some((_, first)) = drafted.first() {
        let draft = first.draft.unwrap_or("");
        outln!("\n| decode | context (prompt) | plain tok/s | tok/s with draft {draft} | × plain | acceptance | tokens / verify step |");
        outln!("|---|---:|---:|---:|---:|---:|---:|");
        for (d, rep) in drafted {
            let Test::Drafted { prompt, gen } = d.test else { continue };
            let plain = rows.iter().find(|r| r.test == greedy(prompt, gen)).map_or(0.0, |r| mean_sd(&r.tok_s).0);
            let with = mean_sd(&d.tok_s).0;
            outln!(
                "| tg{gen} | {prompt} | {plain:.1} | {with:.1} | {:.2}× | {:.0}% | {:.2} |",
                with / plain.max(1e-12),
                100.0 * rep.acceptance.unwrap_or(0.0),
                rep.tokens_per_step.unwrap_or(0.0)
            );
        }
        outln!(
            "The answers are the same bits with and without the draft; the speed is not: it depends on how often \
             the draft guesses what the model says, here on synthetic prompts (random weights repeat themselves, \
             so their acceptance says nothing about real text)."
        );
    }
    // Batched decoding against one sequence at the same context.
    let batched: Vec<&Row> = rows.iter().filter(|r| matches!(r.test, Test::Batched { .. })).collect();
    if !batched.is_empty() {
        outln!(
            "\n| batched decode | context (prompt) | sequences | tok/s (all) | tok/s per sequence | × one sequence |"
        );
        outln!("|---|---:|---:|---:|---:|---:|");
        for b in batched {
            let Test::Batched { prompt, gen, batch } = b.test else { continue };
            let one = rows.iter().find(|r| r.test == greedy(prompt, gen));
            let (all, single) = (mean_sd(&b.tok_s).0, one.map(|r| mean_sd(&r.tok_s).0).unwrap_or(0.0));
            outln!(
                "| tg{gen} | {prompt} | {batch} | {all:.1} | {:.1} | {:.2}× |",
                all / batch as f64,
                all / single.max(1e-12)
            );
        }
    }
    if let Some(pp4) = rows.iter().find(|r| r.test == Test::Prefill { prompt: 4, depth: 0 }) {
        let ttft = load_ms + mean_sd(&pp4.step_ms).0;
        // In decode steps after the same prompt, when one was timed (not with -n 0, or -d).
        let steps = match rows.iter().find(|r| r.test == greedy(4, r_gen(r))) {
            Some(r) => {
                let step = percentile(&r.step_ms, 50.0);
                format!(" = {:.1} decode steps of {step:.2} ms", ttft / step.max(1e-9))
            }
            None => String::new(),
        };
        outln!("\nload to first token (4-token prompt): {ttft:.1} ms{steps}");
    }
    Ok(())
}

fn r_gen(r: &Row) -> usize {
    match r.test {
        Test::Decode { gen, .. } | Test::Batched { gen, .. } | Test::Drafted { gen, .. } => gen,
        Test::Prefill { .. } => 0,
    }
}
