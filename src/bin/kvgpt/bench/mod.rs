//! `kvgpt bench`: throughput and latency of prefill and decode, cached against uncached, greedy
//! against sampled, plain against speculative.

use crate::common::{load, print_json, sampler_words, ModelArgs, Outcome, SamplingArgs};
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use kvgpt::bench::{peak_rss_bytes, probe_read_bandwidth, BenchSpec};
use std::time::Instant;

mod report;
use report::{print_csv, print_md, Header, RowReport};

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
    // One run of every row per thread count of -t (llama-bench's list), each in its own pool.
    let counts: Vec<Option<usize>> =
        if a.model.threads.is_empty() { vec![None] } else { a.model.threads.iter().map(|&n| Some(n.into())).collect() };
    let total = kvgpt::bench::tests(&spec).len() * spec.reps * counts.len();
    let mut done = 0;
    // Progress on one line rewritten in place on a terminal; a log file gets one line at the end.
    let live = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let started = Instant::now();
    let mut groups = Vec::with_capacity(counts.len());
    for &count in &counts {
        let (threads, rows) = crate::common::in_pool(count, || {
            let rows = kvgpt::bench::run(m, &spec, &mut |t, rep| {
                done += 1;
                if live {
                    use std::io::Write as _;
                    let _ = write!(
                        std::io::stderr(),
                        "\r[kvgpt bench] {done}/{total} runs ({} rep {}, {})        ",
                        t.name(),
                        rep + 1,
                        crate::out::count(rayon::current_num_threads(), "thread")
                    );
                }
            })?;
            Ok((rayon::current_num_threads(), rows))
        })?;
        groups.push((threads, rows));
    }
    if live {
        errln!();
    } else {
        errln!("[kvgpt bench] {total} runs in {:.1} s", started.elapsed().as_secs_f64());
    }
    let rss = peak_rss_bytes().unwrap_or(0);
    let bw = if a.probe_mib > 0 { probe_read_bandwidth(probe_bytes, 3)? } else { 0.0 };
    let weight_bytes = m.weight_bytes();
    let kv_bytes = kvgpt::KvCache::new(cfg).bytes();
    let header = Header {
        model: loaded.files.name.clone(),
        n_layer: cfg.n_layer,
        n_embd: cfg.n_embd,
        n_head: cfg.n_head,
        dtype: m.weights_dtype(),
        threads: 0, // each group's own
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
    let headers: Vec<Header> = groups.iter().map(|&(threads, _)| Header { threads, ..header.clone() }).collect();
    let reports: Vec<Vec<RowReport>> = groups
        .iter()
        .zip(&headers)
        .map(|((_, rows), h)| rows.iter().map(|r| RowReport::of(r, h, &sampler, draft)).collect())
        .collect();
    match a.output {
        Format::Json => print_json(&serde_json::to_value(reports.concat())?)?,
        Format::Csv => print_csv(&reports.concat())?,
        Format::Md => {
            for (i, ((h, (_, rows)), reports)) in headers.iter().zip(&groups).zip(&reports).enumerate() {
                if i > 0 {
                    outln!("");
                }
                print_md(h, rows, reports)?;
            }
        }
    }
    Ok(Outcome::Done)
}
