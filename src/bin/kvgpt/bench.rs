//! `kvgpt bench`: throughput and latency of prefill and decode, cached against uncached, greedy
//! against sampled, plain against speculative.

use crate::common::{load, print_json, sampler_words, ModelArgs, Outcome, SamplingArgs};
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use kvgpt::bench::{mean_sd, peak_rss_bytes, percentile, probe_read_bandwidth, BenchSpec, Row, Test};
use serde::Serialize;
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths (comma-separated): a prefill row each, and the contexts of the decode rows
    /// [default: 4,128,512, as fit the model's context]
    #[arg(short = 'p', long = "prompts", value_delimiter = ',')]
    pub prompts: Option<Vec<usize>>,
    /// Generation lengths (comma-separated) of the decode rows [default: 128, as fits]
    #[arg(short = 'n', long = "gen", value_delimiter = ',')]
    pub gens: Option<Vec<usize>>,
    /// Timed repetitions per row (after one warm-up).
    #[arg(short = 'r', long = "reps", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: u32,
    /// Skip the uncached decode rows (they recompute the whole sequence every step and are slow).
    #[arg(long)]
    pub no_uncached: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Md)]
    pub output: Format,
    /// Also decode this many sequences together (comma-separated batch sizes, e.g. 1,8,16): one
    /// forward over all their rows per step, as the server runs them.
    #[arg(long = "batch", value_delimiter = ',', default_value = "1")]
    pub batches: Vec<usize>,
    /// Size of the read-bandwidth probe in MiB, at most 65536 (0 skips it).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(0..=65536))]
    pub probe_mib: u32,
    /// Any sampling flag (as generate's) adds a sampled row beside each cached greedy decode
    /// row, interleaved with it, and their ratio.
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// --draft adds a speculative (greedy) row beside each cached greedy decode row, interleaved
    /// with it: its tok/s against plain decode, its acceptance and tokens per verify step.
    #[command(flatten)]
    pub draft: crate::draft::DraftArgs,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Md,
    Json,
    Csv,
}

const DEFAULT_PROMPTS: [usize; 3] = [4, 128, 512];
const DEFAULT_GEN: usize = 128;

/// The prompt and generation lengths: the ones given, each prompt with each length checked
/// against the model's `np` positions; or the defaults, clipped to fit with a note saying so.
fn lengths(a: &BenchArgs, np: usize) -> Result<(Vec<usize>, Vec<usize>)> {
    let (p, n) = (a.prompts.clone(), a.gens.clone());
    if p.iter().chain(&n).flatten().any(|&x| x == 0) {
        bail!("-p and -n take positive lengths, e.g. -p 4,128,512 -n 128");
    }
    let prompts = p.clone().unwrap_or_else(|| DEFAULT_PROMPTS.iter().copied().filter(|&x| x < np).collect());
    let longest = prompts.iter().copied().max().unwrap_or(0);
    let gens = n.clone().unwrap_or_else(|| vec![DEFAULT_GEN.min(np.saturating_sub(longest))]);
    let pairs = prompts.iter().flat_map(|&x| gens.iter().map(move |&y| (x, y)));
    if let Some((pl, nl)) = pairs.into_iter().find(|&(x, y)| x.saturating_add(y) > np) {
        let at_most = match np.checked_sub(pl) {
            Some(room) if room > 0 => format!(" (with -p {pl}, -n at most {room})"),
            _ => format!(" (-p at most {})", np - 1),
        };
        bail!(
            "-p {pl} with -n {nl} does not fit the model's {np} positions: lower -p or -n so that each prompt \
             length plus each generation length is at most {np}{at_most}"
        );
    }
    if p.is_none() || n.is_none() {
        let (dp, dn) = (DEFAULT_PROMPTS.map(|x| x.to_string()).join(","), DEFAULT_GEN);
        if p.is_none() && prompts != DEFAULT_PROMPTS || n.is_none() && gens != [DEFAULT_GEN] {
            let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
            errln!(
                "[kvgpt bench] the defaults (-p {dp} -n {dn}) clipped to the model's {np} positions: -p {} -n {} \
                 (choose with -p and -n)",
                list(&prompts),
                list(&gens)
            );
        }
    }
    Ok((prompts, gens))
}

pub fn run(a: &BenchArgs) -> Result<Outcome> {
    if a.batches.iter().any(|&b| b == 0 || b > 256) {
        bail!("--batch takes batch sizes from 1 to 256, e.g. --batch 1,8,16");
    }
    let probe_bytes = (a.probe_mib as usize) << 20;
    kvgpt::bench::check_probe(probe_bytes)?;
    let t0 = Instant::now();
    let loaded = load(&a.model)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let m = &loaded.model;
    let cfg = &m.config;
    let (prompts, gens) = lengths(a, cfg.n_positions)?;
    let sampling = a.sampling.sampling()?;
    let drafting = a.draft.load(&a.model, &loaded)?;
    let spec = BenchSpec {
        prompts,
        gens,
        reps: a.reps as usize,
        uncached: !a.no_uncached,
        batches: a.batches.clone(),
        sampling: (!sampling.is_greedy() || sampling.penalizes()).then_some(sampling),
        draft: drafting.as_ref().map(|d| d.config.clone()),
    };
    let total = kvgpt::bench::tests(&spec).len() * spec.reps;
    let mut done = 0;
    // Progress on one line rewritten in place on a terminal; a log file gets one line at the end.
    let live = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let started = Instant::now();
    let rows = kvgpt::bench::run(m, &spec, &mut |t, rep| {
        done += 1;
        if live {
            use std::io::Write as _;
            let _ =
                write!(std::io::stderr(), "\r[kvgpt bench] {done}/{total} runs ({} rep {})        ", t.name(), rep + 1);
        }
    })?;
    if live {
        errln!();
    } else {
        errln!("[kvgpt bench] {total} runs in {:.1} s", started.elapsed().as_secs_f64());
    }
    let rss = peak_rss_bytes().unwrap_or(0);
    let bw = if a.probe_mib > 0 { probe_read_bandwidth(probe_bytes, 3)? } else { 0.0 };
    let threads = rayon::current_num_threads();
    let weight_bytes = m.weight_bytes();
    let kv_bytes = kvgpt::KvCache::new(cfg).bytes();
    let header = Header {
        model: loaded.files.name.clone(),
        n_layer: cfg.n_layer,
        n_embd: cfg.n_embd,
        n_head: cfg.n_head,
        dtype: m.weights_dtype(),
        threads,
        isa: m.isa().name(),
        cpu_features: kvgpt_kernels::cpu_features(),
        git: env!("KVGPT_GIT_REV"),
        load_ms,
        weight_bytes,
        parameters: kvgpt::info::parameters(cfg),
        kv_cache_bytes: kv_bytes,
        peak_rss_bytes: rss,
        read_bandwidth_gb_s: bw,
    };
    let sampler = sampler_words(&sampling);
    let draft = drafting.as_ref().map_or("", |d| d.name.as_str());
    let reports: Vec<RowReport> = rows.iter().map(|r| RowReport::of(r, &header, &sampler, draft)).collect();
    match a.output {
        Format::Json => print_json(&serde_json::to_value(&reports)?)?,
        Format::Csv => print_csv(&reports)?,
        Format::Md => print_md(&header, &rows, &reports)?,
    }
    Ok(Outcome::Done)
}

/// What the run was: printed above the table, and repeated in every JSON and CSV row.
struct Header {
    model: String,
    n_layer: usize,
    n_embd: usize,
    n_head: usize,
    dtype: &'static str,
    threads: usize,
    isa: &'static str,
    cpu_features: Vec<&'static str>,
    git: &'static str,
    load_ms: f64,
    weight_bytes: usize,
    parameters: usize,
    kv_cache_bytes: usize,
    peak_rss_bytes: u64,
    read_bandwidth_gb_s: f64,
}

/// One row of the report, as the table, JSON and CSV show it.
#[derive(Serialize)]
struct RowReport<'a> {
    /// What llama-bench's rows say of the model: its name, the bytes of its weights as held, its
    /// parameters, and where it runs.
    model: &'a str,
    model_size_bytes: usize,
    model_params: usize,
    backend: &'static str,
    test: String,
    mode: &'static str,
    prompt_tokens: usize,
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
    fn of(r: &Row, h: &'a Header, sampler: &'a str, draft: &'a str) -> RowReport<'a> {
        let (avg, sd) = mean_sd(&r.tok_s);
        let drafted = matches!(r.test, Test::Drafted { .. });
        let (prompt, gen, mode, batch) = match r.test {
            Test::Drafted { prompt, gen } => (prompt, gen, "drafted", 1),
            Test::Prefill { prompt } => (prompt, 0, "cached", 1),
            Test::Decode { prompt, gen, sampled: true, .. } => (prompt, gen, "sampled", 1),
            Test::Decode { prompt, gen, cached, .. } => (prompt, gen, if cached { "cached" } else { "uncached" }, 1),
            Test::Batched { prompt, gen, batch } => (prompt, gen, "batched", batch),
        };
        RowReport {
            model: &h.model,
            model_size_bytes: h.weight_bytes,
            model_params: h.parameters,
            backend: "CPU",
            test: r.test.name(),
            mode,
            prompt_tokens: prompt,
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

fn print_csv(rows: &[RowReport]) -> Result<()> {
    outln!(
        "test,mode,prompt_tokens,gen_tokens,dtype,threads,reps,tok_s_avg,tok_s_sd,p50_ms,p90_ms,p99_ms,ttft_ms,\
         weight_gb_s,peak_rss_mb,git,batch,sampler,draft,acceptance,tokens_per_step,model,model_size_bytes,\
         model_params,backend"
    );
    // The model's name may hold a comma or a quote: quoted as CSV quotes a field.
    let quoted = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let opt = |x: Option<f64>| x.map(|v| v.to_string()).unwrap_or_default();
    for r in rows {
        outln!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
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
            r.backend
        );
    }
    Ok(())
}

fn print_md(h: &Header, rows: &[Row], reports: &[RowReport]) -> Result<()> {
    let load_ms = h.load_ms;
    outln!(
        "kvgpt bench — {} ({}, n_embd {}, {}) | dtype {} | {} | isa {} | cpu {} | git {}",
        h.model,
        crate::out::count(h.n_layer, "layer"),
        h.n_embd,
        crate::out::count(h.n_head, "head"),
        h.dtype,
        crate::out::count(h.threads, "thread"),
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
    if let Some(pp4) = rows.iter().find(|r| r.test == Test::Prefill { prompt: 4 }) {
        let ttft = mean_sd(&pp4.step_ms).0;
        let step =
            rows.iter().find(|r| r.test == greedy(4, r_gen(r))).map(|r| percentile(&r.step_ms, 50.0)).unwrap_or(0.0);
        outln!(
            "\nload to first token (4-token prompt): {:.1} ms = {:.1} decode steps of {step:.2} ms",
            load_ms + ttft,
            (load_ms + ttft) / step.max(1e-9)
        );
    }
    Ok(())
}

fn r_gen(r: &Row) -> usize {
    match r.test {
        Test::Decode { gen, .. } | Test::Batched { gen, .. } | Test::Drafted { gen, .. } => gen,
        Test::Prefill { .. } => 0,
    }
}
