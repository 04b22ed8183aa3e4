//! `kvgpt cache diff A B …`: prompt files sent in order through one prompt cache, as a server
//! would see them, offline: for each, where reuse stopped and why, the token on each side of the
//! stop with the text around it, how many positions were computed because of it, and the prefill
//! time with what was reused against from nothing. `kvgpt cache verify DIR`: a --kv-disk
//! directory checked offline, every block proved by recomputation.

use crate::common::{load, print_json, prompt_ids, read_prompt_file, ModelArgs, Outcome};
use crate::kv_disk::KvDiskArgs;
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use kvgpt_core::cache_report::Report;
use kvgpt_views::cache_replay::{replay, BlockKind, BlockRow};
use serde_json::json;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum CacheCmd {
    /// Send prompt files in order through one prompt cache: where reuse stopped for each, the
    /// first differing token on each side with the text around it, and what it cost.
    Diff(DiffArgs),
    /// Check a --kv-disk directory offline: every block of this model's K/V is read, checked
    /// and proved by recomputing it after the blocks before it; exit status 1 if any differs or
    /// is damaged (nothing is changed).
    Verify(VerifyArgs),
}

#[derive(Args)]
pub struct VerifyArgs {
    /// The directory `serve --kv-disk` or `generate --kv-disk` keeps.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct DiffArgs {
    /// Prompt files, in the order the requests arrive (at least two).
    #[arg(value_name = "FILE", num_args = 2.., required = true)]
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print the reports as JSON: one object per file.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub kv_disk: KvDiskArgs,
}

impl CacheCmd {
    pub fn model_args(&self) -> &ModelArgs {
        match self {
            CacheCmd::Diff(a) => &a.model,
            CacheCmd::Verify(a) => &a.model,
        }
    }
}

/// A block table as one line: a cell per block (▣ shared with the earlier prompts, ▤ loaded from
/// the disk tier, ◩ copied on write, □ its own), the counts, and logical → physical.
fn blocks_line(rows: &[BlockRow], block: usize) -> String {
    let cell = |r: &BlockRow| match r.kind {
        BlockKind::Shared => "▣",
        BlockKind::Disk => "▤",
        BlockKind::Copied => "◩",
        BlockKind::Own => "□",
    };
    let n = |k| rows.iter().filter(|r| r.kind == k).count();
    let map: Vec<String> = rows
        .iter()
        .map(|r| match r.copied_from {
            Some(f) => format!("{}→#{} (copy of #{f})", r.logical, r.physical),
            None => format!("{}→#{}", r.logical, r.physical),
        })
        .collect();
    let disk = match n(BlockKind::Disk) {
        0 => String::new(),
        d => format!(", {d} loaded from --kv-disk"),
    };
    format!(
        "blocks of {block}: {}  {} shared with earlier prompts (no copy){disk}, {} copied on write, {} its own | {}",
        rows.iter().map(cell).collect::<String>(),
        n(BlockKind::Shared),
        n(BlockKind::Copied),
        n(BlockKind::Own),
        map.join(" ")
    )
}

/// `reused` of `n` positions as a bar of 40 cells: ■ reused, □ computed.
fn bar(reused: usize, n: usize) -> String {
    const W: usize = 40;
    let r = (reused * W).div_ceil(n.max(1)).min(W);
    format!("{}{}", "■".repeat(r), "□".repeat(W - r))
}

pub fn run(cmd: &CacheCmd) -> Result<Outcome> {
    match cmd {
        CacheCmd::Diff(a) => diff(a),
        CacheCmd::Verify(a) => verify(a),
    }
}

/// `kvgpt cache verify DIR`.
fn verify(a: &VerifyArgs) -> Result<Outcome> {
    if !a.dir.is_dir() {
        bail!("{}: no such directory (give the one --kv-disk names)", a.dir.display());
    }
    let loaded = load(&a.model)?;
    let r = kvgpt_core::store::audit(&loaded.model, &a.dir)?;
    let hex = |k: &kvgpt_core::store::BlockKey| k.hex();
    if a.json {
        let damaged: Vec<_> = r.damaged.iter().map(|(k, why)| json!({"key": hex(k), "reason": why.as_str()})).collect();
        print_json(&json!({"dir": a.dir.display().to_string(), "proved": r.proved,
            "differ": r.differ.iter().map(hex).collect::<Vec<_>>(), "damaged": damaged,
            "other_models": r.others, "orphans": r.orphans}))?;
    } else {
        outln!("{}: {} blocks of this model proved by recomputation", a.dir.display(), r.proved);
        for k in &r.differ {
            outln!("  DIFFERS from what this model computes: {}", hex(k));
        }
        for (k, why) in &r.damaged {
            outln!("  DAMAGED ({}): {}", why.as_str(), hex(k));
        }
        outln!(
            "{} of other models, K/V types or block sizes left alone; {} whose chain is incomplete (not provable)",
            r.others,
            r.orphans
        );
    }
    Ok(if r.differ.is_empty() && r.damaged.is_empty() { Outcome::Done } else { Outcome::CheckFailed })
}

/// `kvgpt cache diff A B …`.
fn diff(a: &DiffArgs) -> Result<Outcome> {
    let texts: Vec<String> = a.files.iter().map(|f| read_prompt_file(f)).collect::<Result<_>>()?;
    let loaded = load(&a.model)?;
    let mut prompts = Vec::with_capacity(texts.len());
    for (f, t) in a.files.iter().zip(&texts) {
        let ids = prompt_ids(&loaded, t)?;
        let np = loaded.model.config.n_positions;
        if ids.len() > np {
            bail!("{} is {} tokens long; the model reads at most {np}: shorten it", f.display(), ids.len());
        }
        prompts.push(ids);
    }
    let store = a.kv_disk.open(&loaded.model)?;
    let replayed = replay(&loaded.model, &prompts, store.as_ref())?;
    drop(store); // waits for its writes
    let block = loaded.model.kv().block();
    let tok = &loaded.tokenizer;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let reports: Vec<Report> =
        prompts.iter().zip(&replayed).map(|(ids, r)| Report::new(tok, ids, &r.stop, true)).collect();
    if a.json {
        let v: Vec<_> = a
            .files
            .iter()
            .zip(reports.iter().zip(&replayed))
            .map(|(f, (rep, r))| {
                json!({"file": f.display().to_string(), "report": rep, "block_size": block, "blocks": r.blocks,
                       "prefill_ms": ms(r.prefill), "cold_prefill_ms": ms(r.cold_prefill), "load_ms": ms(r.load),
                       "same_bits_as_cold": r.same_bits})
            })
            .collect();
        print_json(&json!(v))?;
        return Ok(Outcome::Done);
    }
    outln!(
        "{} prompts sent in order through one prompt cache ({}): each is looked up in what the ones before it left.",
        prompts.len(),
        loaded.files.name
    );
    for ((f, rep), r) in a.files.iter().zip(&reports).zip(&replayed) {
        outln!("\n{}: {} tokens", f.display(), rep.prompt_tokens);
        outln!("  {}  reused {} · computed {}", bar(rep.reused, rep.prompt_tokens), rep.reused, rep.recomputed);
        if let Some(t) = rep.tiers.filter(|t| t.disk > 0) {
            outln!("  reused {} from the prompt cache in RAM, {} loaded from --kv-disk", t.ram, t.disk);
        }
        outln!("  {}", rep.sentence());
        outln!("  {}", blocks_line(&r.blocks, block));
        if let Some(c) = rep.context.as_ref().filter(|_| rep.cached_token.is_some()) {
            outln!("  cached: …{:?} ⟦ {:?} ⟧", c.before, c.cached_after);
            outln!("  this:   …{:?} ⟦ {:?} ⟧", c.before, c.new_after);
        }
        let bits = if r.same_bits { "the same" } else { "NOT the same" };
        let load = if rep.tiers.is_none_or(|t| t.disk == 0) {
            String::new()
        } else {
            format!("{:.1} ms loading from --kv-disk, ", ms(r.load))
        };
        if rep.reused == 0 {
            outln!("  {load}prefill {:.1} ms (nothing was reused: nothing to compare it with)", ms(r.prefill));
        } else {
            outln!(
                "  {load}prefill {:.1} ms with the reused prefix, {:.1} ms from nothing ({bits} bits)",
                ms(r.prefill),
                ms(r.cold_prefill)
            );
        }
    }
    Ok(Outcome::Done)
}
