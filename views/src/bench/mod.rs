//! The benchmark behind `kvgpt bench`: prefill and decode throughput, cached against uncached
//! decoding, greedy against sampled decoding, per-token latency percentiles, time to first token,
//! peak memory and a read-bandwidth probe. Tokenization is excluded (ids are synthetic). A prefill
//! row times its forward pass; a decode step is timed as `generate` counts it: choosing the next
//! token (greedy's argmax, or the sampler on sampled rows) and the forward pass over it; with a
//! draft, a step also verifies the drafted tokens and drafts the next ones.

pub mod report;
pub mod roofline;

use kvgpt_core::error::{Error, Result};
use kvgpt_core::model::{Model, Scratch, CHUNK_ROWS};
use kvgpt_core::sampler::{Sampler, Sampling};
use kvgpt_core::sequence::Sequence;
use kvgpt_core::speculative::{DraftConfig, DraftStats};
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchSpec {
    /// Prompt lengths: each gives a prefill row and the context of the decode rows.
    pub prompts: Vec<usize>,
    /// Generation lengths of the decode rows.
    pub gens: Vec<usize>,
    /// Timed repetitions of every row (after one untimed warm-up run).
    pub reps: usize,
    /// Also measure uncached decoding (the whole sequence recomputed each step).
    pub uncached: bool,
    /// Sequences decoded together in one forward per step (batched rows; 1 adds none).
    pub batches: Vec<usize>,
    /// Also decode (cached) choosing the tokens with this sampler: a sampled row beside each
    /// greedy one, interleaved with it.
    pub sampling: Option<Sampling>,
    /// Also decode (cached, greedy) speculatively with this draft: a row beside each greedy one.
    pub draft: Option<DraftConfig>,
    /// llama-bench's depths: tokens already in the cache before each prefill row, and the
    /// contexts of the decode rows (instead of the prompt lengths); rows are named `… @ dN`.
    /// Empty: none given.
    pub depths: Vec<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// Prefill of `prompt` tokens after `depth` already in the cache.
    Prefill { prompt: usize, depth: usize },
    /// `gen` decode steps after a `prompt`-token prefill, cached or not; greedy, or with the
    /// spec's sampler.
    Decode { prompt: usize, gen: usize, cached: bool, sampled: bool },
    /// `gen` decode steps of `batch` sequences together (one forward over their rows per step),
    /// each after its own `prompt`-token prefill, cached.
    Batched { prompt: usize, gen: usize, batch: usize },
    /// `gen` tokens decoded speculatively (greedy, cached) with the spec's draft after a
    /// `prompt`-token prefill (the draft's prefill is not timed, as the target's is not): a
    /// step verifies the last drafts, drafts again and feeds them.
    Drafted { prompt: usize, gen: usize },
}

impl Test {
    /// The row's name as llama-bench writes it: `pp512`, `tg128`, and with depths (`at_depths`)
    /// `pp512 @ d128`, `tg128 @ d512` (a decode row's context is its depth).
    pub fn name(&self, at_depths: bool) -> String {
        let (name, depth) = match *self {
            Test::Prefill { prompt, depth } => (format!("pp{prompt}"), depth),
            Test::Decode { gen, prompt, .. } | Test::Drafted { gen, prompt } => (format!("tg{gen}"), prompt),
            Test::Batched { gen, batch, prompt } => (format!("tg{gen}x{batch}"), prompt),
        };
        if at_depths {
            format!("{name} @ d{depth}")
        } else {
            name
        }
    }

    /// Tokens before the timed part: the depth of a prefill row, the context of a decode row.
    pub fn context(&self) -> usize {
        match *self {
            Test::Prefill { depth, .. } => depth,
            Test::Decode { prompt, .. } | Test::Drafted { prompt, .. } | Test::Batched { prompt, .. } => prompt,
        }
    }
}

/// One measured row: every repetition's throughput and every step's latency.
#[derive(Clone, Debug)]
pub struct Row {
    pub test: Test,
    /// Tokens per second of each repetition.
    pub tok_s: Vec<f64>,
    /// Milliseconds of each timed forward call (one per prefill, one per decode step).
    pub step_ms: Vec<f64>,
    /// What drafting did, over every timed repetition (drafted rows).
    pub drafts: DraftStats,
}

/// Mean and sample standard deviation.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = if v.len() > 1 { v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64 } else { 0.0 };
    (m, var.sqrt())
}

/// The q-th percentile (0..=100) by nearest rank.
pub fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// Synthetic prompt ids, spread over the vocabulary.
fn prompt_ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

/// Everything a run needs, allocated once.
struct Runner<'a> {
    model: &'a Model,
    seq: Sequence,
    scratch: Scratch,
    /// The sequences of batched rows, made on first use.
    batch: Vec<Sequence>,
    /// The sampler of sampled rows (its stream goes on from row to row).
    sampler: Option<Sampler>,
    draft: Option<DraftConfig>,
}

/// One repetition: tokens per second, each timed call's milliseconds, and what drafting did.
type Rep = (f64, Vec<f64>, DraftStats);

impl Runner<'_> {
    /// Feeds the sequence's pending tokens (all of them, if `recompute`), timed from `start`.
    fn timed_feed(&mut self, start: Instant, recompute: bool) -> Result<Duration> {
        if recompute {
            self.seq.forget_cache();
        }
        self.seq.feed(self.model, &mut self.scratch)?;
        Ok(start.elapsed())
    }

    /// Runs one repetition of `test`.
    fn run(&mut self, test: Test) -> Result<Rep> {
        match test {
            Test::Prefill { prompt, depth } => self.prefill(prompt, depth),
            Test::Decode { prompt, gen, cached, sampled } => self.decode(prompt, gen, cached, sampled),
            Test::Drafted { prompt, gen } => self.drafted(prompt, gen),
            Test::Batched { prompt, gen, batch } => self.batched(prompt, gen, batch),
        }
    }

    /// A prompt of `prompt` tokens after `depth` in the cache, timed.
    fn prefill(&mut self, prompt: usize, depth: usize) -> Result<Rep> {
        let ids = prompt_ids(depth + prompt, self.model.config.vocab_size);
        self.seq.restart(&ids[..depth])?;
        if depth > 0 {
            self.seq.feed(self.model, &mut self.scratch)?;
        }
        self.seq.append_prompt(&ids[depth..])?;
        let d = self.timed_feed(Instant::now(), false)?;
        Ok((prompt as f64 / d.as_secs_f64(), vec![d.as_secs_f64() * 1e3], DraftStats::default()))
    }

    /// `gen` steps after a context of `prompt`, each choosing its token and feeding it (with the
    /// cache, or recomputing everything).
    fn decode(&mut self, prompt: usize, gen: usize, cached: bool, sampled: bool) -> Result<Rep> {
        // (A context of 0 starts after one token: there must be logits to choose from.)
        self.seq.restart(&prompt_ids(prompt.max(1), self.model.config.vocab_size))?;
        self.seq.feed(self.model, &mut self.scratch)?;
        let mut steps = Vec::with_capacity(gen);
        for _ in 0..gen {
            let start = Instant::now();
            match self.sampler.as_mut().filter(|_| sampled) {
                Some(s) => {
                    let id = s.sample_after(self.seq.logits(), self.seq.ids(), prompt);
                    self.seq.push(id)?;
                }
                None => {
                    self.seq.sample(); // greedy
                }
            }
            let d = self.timed_feed(start, !cached)?;
            steps.push(d.as_secs_f64() * 1e3);
        }
        let total: f64 = steps.iter().sum::<f64>() / 1e3;
        Ok((gen as f64 / total, steps, DraftStats::default()))
    }

    /// Greedy decoding of `gen` tokens after `prompt`, each step verifying the drafted tokens.
    fn drafted(&mut self, prompt: usize, gen: usize) -> Result<Rep> {
        let draft = self.draft.as_ref().ok_or_else(|| Error::Invalid("a drafted row needs a draft".into()))?;
        let seq = &mut self.seq;
        seq.restart(&prompt_ids(prompt.max(1), self.model.config.vocab_size))?;
        seq.speculate_with(draft); // a fresh draft: no state from the last run
        seq.feed(self.model, &mut self.scratch)?;
        seq.prefill_draft()?;
        let (mut steps, mut made) = (Vec::with_capacity(gen), 0);
        while made < gen {
            let start = Instant::now();
            seq.sample(); // greedy, verifying the drafts fed with the last token
            made += seq.new_tokens().len();
            seq.draft(1)?;
            seq.feed(self.model, &mut self.scratch)?;
            steps.push(start.elapsed().as_secs_f64() * 1e3);
        }
        let total: f64 = steps.iter().sum::<f64>() / 1e3;
        let stats = seq.speculation().map(|s| s.stats).unwrap_or_default();
        seq.stop_speculating();
        Ok((made as f64 / total, steps, stats))
    }

    /// `batch` sequences decoding together, one forward over all their rows per step.
    fn batched(&mut self, prompt: usize, gen: usize, batch: usize) -> Result<Rep> {
        let (v, full) = (self.model.config.vocab_size, self.model.config.n_positions); // every step is fed
        while self.batch.len() < batch {
            self.batch.push(Sequence::new(self.model, &[0], full, Sampling::GREEDY)?);
        }
        let seqs = &mut self.batch[..batch];
        for (i, s) in seqs.iter_mut().enumerate() {
            // Different prompts, so that no two sequences compute the same thing.
            s.restart(&prompt_ids(prompt.max(1) + i, v)[i..])?;
            s.feed(self.model, &mut self.scratch)?;
        }
        let mut steps = Vec::with_capacity(gen);
        for _ in 0..gen {
            let start = Instant::now();
            for s in seqs.iter_mut() {
                s.sample(); // greedy
            }
            let mut rows: Vec<_> = seqs.iter_mut().map(|s| s.rows(1)).collect();
            self.model.forward_batch(&mut rows, &mut self.scratch)?;
            steps.push(start.elapsed().as_secs_f64() * 1e3);
        }
        let total: f64 = steps.iter().sum::<f64>() / 1e3;
        Ok(((batch * gen) as f64 / total, steps, DraftStats::default()))
    }
}

/// The rows a spec asks for, in display order: a prefill row per prompt length (per depth), then
/// the decode rows per context (the prompt lengths, or the depths) and generation length. A
/// length of 0 asks for no row of its kind, as llama-bench's `-p 0` and `-n 0`.
pub fn tests(spec: &BenchSpec) -> Vec<Test> {
    let depths: &[usize] = if spec.depths.is_empty() { &[0] } else { &spec.depths };
    let mut t: Vec<Test> = depths
        .iter()
        .flat_map(|&depth| spec.prompts.iter().filter(|&&p| p > 0).map(move |&prompt| Test::Prefill { prompt, depth }))
        .collect();
    let contexts = if spec.depths.is_empty() { &spec.prompts } else { &spec.depths };
    for &prompt in contexts {
        for &gen in spec.gens.iter().filter(|&&g| g > 0) {
            t.push(Test::Decode { prompt, gen, cached: true, sampled: false });
            if spec.sampling.is_some() {
                t.push(Test::Decode { prompt, gen, cached: true, sampled: true });
            }
            if spec.draft.is_some() {
                t.push(Test::Drafted { prompt, gen });
            }
            if spec.uncached {
                t.push(Test::Decode { prompt, gen, cached: false, sampled: false });
            }
            for &batch in spec.batches.iter().filter(|&&b| b > 1) {
                t.push(Test::Batched { prompt, gen, batch });
            }
        }
    }
    t
}

/// Runs every row `reps` times, interleaved (rep 1 of every row, then rep 2, …) so that drift in
/// the machine's speed spreads over all rows alike. `progress` is told each finished run.
pub fn run(model: &Model, spec: &BenchSpec, progress: &mut dyn FnMut(&Test, usize)) -> Result<Vec<Row>> {
    let cfg = &model.config;
    let tests = tests(spec);
    for t in &tests {
        if let Test::Decode { prompt, gen, .. } | Test::Batched { prompt, gen, .. } | Test::Drafted { prompt, gen } = t
        {
            kvgpt_core::sequence::check_fed(model, (*prompt).max(1), *gen)?;
        } else if let Test::Prefill { prompt, depth } = t {
            kvgpt_core::sequence::check_fed(model, prompt + depth, 0)?;
        }
    }
    let max_rows = tests
        .iter()
        .map(|t| match t {
            Test::Prefill { prompt, .. } => *prompt,
            Test::Decode { prompt, gen, cached: false, .. } => prompt + gen,
            Test::Decode { prompt, .. } => *prompt,
            Test::Drafted { prompt, .. } => (*prompt).max(1 + spec.draft.as_ref().map_or(0, |d| d.max_k)),
            Test::Batched { prompt, batch, .. } => (*prompt).max(*batch),
        })
        .max()
        .unwrap_or(1);
    let mut r = Runner {
        model,
        // One sequence with room for the whole context, restarted for every run: its cache's
        // pages are touched by the warm-up, not inside a timed run.
        seq: Sequence::new(model, &[0], cfg.n_positions, Sampling::GREEDY)?,
        scratch: Scratch::new(cfg, max_rows.min(CHUNK_ROWS)),
        batch: vec![],
        sampler: spec.sampling.map(|s| Sampler::with_isa(s, cfg.vocab_size, model.isa())),
        draft: spec.draft.clone(),
    };
    let mut rows: Vec<Row> =
        tests.iter().map(|&test| Row { test, tok_s: vec![], step_ms: vec![], drafts: DraftStats::default() }).collect();
    for t in &tests {
        r.run(*t)?; // warm-up
    }
    for rep in 0..spec.reps {
        for row in rows.iter_mut() {
            let (tok_s, steps, drafts) = r.run(row.test)?;
            row.tok_s.push(tok_s);
            row.step_ms.extend(steps);
            row.drafts.add(drafts);
            progress(&row.test, rep);
        }
    }
    Ok(rows)
}

/// [`run`] once per thread count, each in a pool of its own (None: one thread per core): the
/// pool's threads and its rows, per count.
pub fn run_each(
    model: &Model,
    spec: &BenchSpec,
    threads: &[Option<usize>],
    progress: &mut (dyn FnMut(&Test, usize) + Send),
) -> Result<Vec<(usize, Vec<Row>)>> {
    let mut groups = Vec::with_capacity(threads.len());
    for &n in threads {
        let pool = kvgpt_core::threads::pool(n, "kvgpt-kernel")?;
        let rows = pool.install(|| run(model, spec, progress))?;
        groups.push((pool.current_num_threads(), rows));
    }
    Ok(groups)
}

/// Peak resident memory of this process in bytes (Linux `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn probe_buffer(n: usize) -> Result<Vec<f32>> {
    let mut buf: Vec<f32> = Vec::new();
    buf.try_reserve_exact(n)
        .map_err(|e| Error::Invalid(format!("the bandwidth probe could not allocate {} MiB ({e})", n >> 18)))?;
    Ok(buf)
}

/// Whether a probe of `bytes` can be allocated, asked before a benchmark runs (the memory is
/// reserved, never touched, then freed), so a too-large probe fails before the work, not after.
pub fn check_probe(bytes: usize) -> Result<()> {
    probe_buffer(bytes / 4).map(drop)
}

/// Read bandwidth in GB/s over a buffer of `bytes` (larger than the caches), best of `passes`,
/// with the current rayon pool's threads each reading its own part.
/// Errors (instead of aborting) if the buffer cannot be allocated; [`check_probe`] asks first.
pub fn probe_read_bandwidth(bytes: usize, passes: usize) -> Result<f64> {
    use rayon::prelude::*;
    let n = bytes / 4;
    let mut buf = probe_buffer(n)?;
    buf.extend((0..n).map(|i| (i % 251) as f32));
    let threads = rayon::current_num_threads().max(1);
    let chunk = n.div_ceil(threads);
    let mut best = 0.0f64;
    for _ in 0..passes {
        let start = Instant::now();
        let s: f32 = buf.par_chunks(chunk).map(|c| kvgpt_kernels::read_all(kvgpt_kernels::Isa::detect(), c)).sum();
        let secs = start.elapsed().as_secs_f64();
        std::hint::black_box(s);
        best = best.max(bytes as f64 / secs / 1e9);
    }
    Ok(best)
}
