//! `kvgpt verify cache` and `kvgpt verify reference`.

use crate::common::Input as Common;
use crate::common::{load, print_json, prompt_ids, read_prompt, ModelArgs, Outcome};
use anyhow::Result;
use clap::Subcommand;
use kvgpt_views::verify::{against_reference, cache_vs_recompute, Comparison};
use serde_json::json;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum VerifyCmd {
    /// Greedy decode with the KV cache and, at every step, recompute the sequence without it;
    /// compare the logits. Exits 1 when they differ by more than the tolerance.
    Cache {
        #[command(flatten)]
        c: Common,
        /// Decode steps to compare.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
        steps: u32,
        /// Largest |Δlogit| accepted (default 0: the engine's cached and uncached logits are the same bits).
        #[arg(long, default_value_t = 0.0)]
        tolerance: f32,
    },
    /// Compare the engine's logits for the prompt with golden logits ([T, vocab], or the last R rows).
    /// Exits 1 when they differ by more than the tolerance.
    Reference {
        #[command(flatten)]
        c: Common,
        /// A .npy file, or a .safetensors file (name the tensor with --tensor if it holds several).
        #[arg(long, value_name = "FILE")]
        logits: PathBuf,
        /// The tensor to read from a safetensors file.
        #[arg(long)]
        tensor: Option<String>,
        /// Largest |Δlogit| accepted.
        #[arg(long, default_value_t = 1e-4)]
        tolerance: f32,
    },
}

impl VerifyCmd {
    fn common(&self) -> &Common {
        match self {
            VerifyCmd::Cache { c, .. } | VerifyCmd::Reference { c, .. } => c,
        }
    }

    pub fn model_args(&self) -> &ModelArgs {
        &self.common().model
    }
}

pub fn run(cmd: VerifyCmd) -> Result<Outcome> {
    let c = cmd.common();
    if let VerifyCmd::Reference { logits, .. } = &cmd {
        if logits.is_dir() {
            anyhow::bail!("--logits {}: is a directory; pass the .npy or .safetensors file", logits.display());
        }
        if !logits.is_file() {
            anyhow::bail!("--logits {}: no such file", logits.display());
        }
    }
    let tolerance = match &cmd {
        VerifyCmd::Cache { tolerance, .. } | VerifyCmd::Reference { tolerance, .. } => *tolerance,
    };
    if !(tolerance >= 0.0 && tolerance.is_finite()) {
        anyhow::bail!("--tolerance must be a number >= 0, got {tolerance}");
    }
    let text = read_prompt(&c.prompt)?;
    let loaded = load(&c.model)?;
    let ids = prompt_ids(&loaded, &text)?;
    let (what, cmp) = match &cmd {
        VerifyCmd::Cache { steps, .. } => {
            ("cached vs uncached decode", cache_vs_recompute(&loaded.model, &ids, *steps as usize, tolerance)?)
        }
        VerifyCmd::Reference { logits, tensor, .. } => {
            let (shape, data) = kvgpt_core::export::read(logits, tensor.as_deref())?;
            ("engine vs reference logits", against_reference(&loaded.model, &ids, &shape, &data, tolerance)?)
        }
    };
    report(c.json, what, &cmp, tolerance)?;
    Ok(if cmp.passes() { Outcome::Done } else { Outcome::CheckFailed })
}

fn report(as_json: bool, what: &str, c: &Comparison, tolerance: f32) -> Result<()> {
    if as_json {
        print_json(&json!({
            "steps": c.steps,
            "max_abs_diff": c.max_abs_diff,
            "top1_agreement": c.top1_agreement,
            "mean_kl": c.mean_kl,
            "first_divergent_step": c.first_divergent_step,
            "tolerance": tolerance,
            "pass": c.passes(),
        }))?;
    } else {
        let bits = if c.max_abs_diff == 0.0 { " (the same bits)" } else { "" };
        outln!("{what}: {} rows compared", c.steps);
        outln!("  max |Δlogit|         {}{bits}", number(c.max_abs_diff as f64));
        outln!("  top-1 agreement      {:.2}%", c.top1_agreement * 100.0);
        outln!("  mean KL              {} nats", number(c.mean_kl));
        match c.first_divergent_step {
            None => outln!("  first divergent row  none"),
            Some(s) => outln!("  first divergent row  {s}"),
        }
        if c.passes() {
            outln!("PASS: max |Δlogit| {} ≤ tolerance {}", number(c.max_abs_diff as f64), number(tolerance as f64));
        } else {
            outln!("FAIL: max |Δlogit| {} > tolerance {}", number(c.max_abs_diff as f64), number(tolerance as f64));
        }
    }
    if !c.passes() {
        errln!(
            "error: the logits differ by {}, more than the tolerance {}",
            number(c.max_abs_diff as f64),
            number(tolerance as f64)
        );
    }
    Ok(())
}

/// A number as people read it: 0 as 0, plain decimals from 0.001 to 10⁶ (four significant
/// digits), scientific notation with three outside them.
pub fn number(x: f64) -> String {
    let a = x.abs();
    if x == 0.0 {
        "0".into()
    } else if !x.is_finite() {
        format!("{x}")
    } else if (1e-3..1e6).contains(&a) {
        let decimals = (3 - a.log10().floor() as i32).max(0) as usize;
        format!("{x:.decimals$}")
    } else {
        format!("{x:.2e}")
    }
}
