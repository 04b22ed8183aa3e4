//! `kvgpt bench`: throughput and latency of prefill and decode, cached against uncached, greedy
//! against sampled, plain against speculative.

mod roofline;

use crate::common::{load, print_json, sampler_words, ModelArgs, Outcome, SamplingArgs};
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use kvgpt_views::bench::report::{csv, Header, Report};
use kvgpt_views::bench::{peak_rss_bytes, probe_read_bandwidth, BenchSpec, Row};
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths (comma-separated): a prefill row each, and the contexts of the decode rows
    /// unless -d gives them; 0 runs no prefill row [default: 4,128,512, as fit the model's context]
    #[arg(short = 'p', long = "prompts", value_delimiter = ',')]
    pub prompts: Option<Vec<usize>>,
    /// Generation lengths (comma-separated) of the decode rows; 0 runs no decode row [default:
    /// 128, as fits]
    #[arg(short = 'n', long = "gen", value_delimiter = ',')]
    pub gens: Option<Vec<usize>>,
    /// Depths (comma-separated), as llama-bench's -d: tokens already in the cache before each
    /// prefill row, and the contexts of the decode rows; rows are named `pp512 @ d128`, `tg128 @
    /// d512`.
    #[arg(short = 'd', long = "depths", value_delimiter = ',')]
    pub depths: Option<Vec<usize>>,
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
    /// Instead of the rows above, time each matrix shape of the model at the --batch row counts
    /// (1,2,4,8,16 unless --batch gives others than 1) against its roof: reading the weights once
    /// at the measured read bandwidth, or the FLOPs at the measured FMA peak, whichever takes
    /// longer. Each call is timed after sweeping the probe's buffer (keep --probe-mib above the
    /// last-level cache).
    #[arg(long)]
    pub roofline: bool,
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
    let (p, n, d) = (a.prompts.clone(), a.gens.clone(), a.depths.clone().unwrap_or_default());
    let deepest = d.iter().copied().max().unwrap_or(0);
    let prompts = p
        .clone()
        .unwrap_or_else(|| DEFAULT_PROMPTS.iter().copied().filter(|&x| deepest.saturating_add(x) < np).collect());
    // The decode rows' contexts: the depths if given, else the prompt lengths; a context of 0
    // decodes after one token.
    let (contexts, flag) = if d.is_empty() { (&prompts, "-p") } else { (&d, "-d") };
    let longest = contexts.iter().copied().max().unwrap_or(0).max(1);
    let gens = n.clone().unwrap_or_else(|| vec![DEFAULT_GEN.min(np.saturating_sub(longest))]);
    if prompts.iter().all(|&x| x == 0) && gens.iter().all(|&x| x == 0) {
        bail!("-p 0 and -n 0 leave nothing to run: give a prompt length (-p) or a generation length (-n)");
    }
    // Each decode row's context (at least one token) plus its generation; each prefill row's
    // depth plus its prompt.
    let decode =
        contexts.iter().flat_map(|&x| gens.iter().filter(|&&y| y > 0).map(move |&y| (flag, x.max(1), "-n", y)));
    let depths = if d.is_empty() { vec![0] } else { d.clone() };
    let prefill = depths.iter().flat_map(|&x| prompts.iter().map(move |&y| ("-d", x, "-p", y)));
    if let Some((f1, x, f2, y)) = decode.chain(prefill).find(|&(_, x, _, y)| x.saturating_add(y) > np) {
        let at_most = match np.checked_sub(x) {
            Some(room) if room > 0 => format!(" (with {f1} {x}, {f2} at most {room})"),
            _ => format!(" ({f1} at most {})", np - 1),
        };
        bail!(
            "{f1} {x} with {f2} {y} does not fit the model's {np} positions: lower {f1} or {f2} so that each \
             context plus what is timed after it is at most {np}{at_most}"
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
    if a.roofline {
        return roofline::run(a);
    }
    let probe_bytes = (a.probe_mib as usize) << 20;
    kvgpt_views::bench::check_probe(probe_bytes)?;
    // One run of every row per thread count of -t (llama-bench's list), each in its own pool;
    // the loads and the bandwidth probe in a pool of the largest.
    let counts: Vec<Option<usize>> =
        if a.model.threads.is_empty() { vec![None] } else { a.model.threads.iter().map(|&n| Some(n.into())).collect() };
    let widest = counts.iter().copied().max().flatten();
    let t0 = Instant::now();
    let loaded = crate::common::in_pool(widest, || load(&a.model))?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (prompts, gens) = lengths(a, loaded.model.config.n_positions)?;
    let sampling = a.sampling.sampling()?;
    let drafting = crate::common::in_pool(widest, || a.draft.load(&a.model, &loaded))?;
    let spec = BenchSpec {
        prompts,
        gens,
        reps: a.reps as usize,
        uncached: !a.no_uncached,
        batches: a.batches.clone(),
        sampling: (!sampling.is_greedy() || sampling.penalizes()).then_some(sampling),
        draft: drafting.as_ref().map(|d| d.config.clone()),
        depths: a.depths.clone().unwrap_or_default(),
    };
    let groups = measure(&loaded.model, &spec, &counts)?;
    let rss = peak_rss_bytes().unwrap_or(0);
    let bw = if a.probe_mib > 0 {
        crate::common::in_pool(widest, || Ok(probe_read_bandwidth(probe_bytes, 3)?))?
    } else {
        0.0
    };
    let header = Header::of(&loaded, load_ms, rss, bw, !spec.depths.is_empty(), env!("KVGPT_GIT_REV"));
    let sampler = sampler_words(&sampling);
    let draft = drafting.as_ref().map_or("", |d| d.name.as_str());
    let report = Report::new(header, &groups, &sampler, draft);
    match a.output {
        Format::Json => print_json(&serde_json::to_value(report.rows())?)?,
        Format::Csv => out!("{}", csv(&report.rows())),
        Format::Md => out!("{}", report.markdown()),
    }
    Ok(Outcome::Done)
}

/// Every row of `spec` at each thread count, with its progress on one line rewritten in place
/// on a terminal (a log file gets one line at the end).
fn measure(m: &kvgpt_core::Model, spec: &BenchSpec, counts: &[Option<usize>]) -> Result<Vec<(usize, Vec<Row>)>> {
    let total = kvgpt_views::bench::tests(spec).len() * spec.reps * counts.len();
    let mut done = 0;
    let live = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let started = Instant::now();
    let groups = kvgpt_views::bench::run_each(m, spec, counts, &mut |t, rep| {
        done += 1;
        if live {
            use std::io::Write as _;
            let _ = write!(
                std::io::stderr(),
                "\r[kvgpt bench] {done}/{total} runs ({} rep {}, {})        ",
                t.name(!spec.depths.is_empty()),
                rep + 1,
                kvgpt_core::units::count(rayon::current_num_threads(), "thread")
            );
        }
    })?;
    if live {
        errln!();
    } else {
        errln!("[kvgpt bench] {total} runs in {:.1} s", started.elapsed().as_secs_f64());
    }
    Ok(groups)
}
