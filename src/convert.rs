//! `kvgpt convert MODEL OUT.gguf --type T`: a model folder, Hub id or GGUF written as the GGUF
//! llama.cpp's tools read (its converter's names, metadata and layouts; its quantizers' blocks).

use crate::common::Outcome;
use anyhow::Result;
use clap::Args;
use kvgpt_core::convert::{self, TYPES};
use kvgpt_core::units::{self, count};
use kvgpt_core::{Locate, WeightType};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args)]
pub struct ConvertArgs {
    /// A model folder (config.json, model.safetensors, tokenizer.json), a GGUF file or a Hugging
    /// Face Hub id.
    pub model: String,
    /// The GGUF file to write (replaced if it exists and is not one the model is read from).
    pub out: PathBuf,
    /// How the matrices are stored: f32, f16, bf16 (as llama.cpp's converter writes them) or
    /// q8_0, q4_0, q4_1, q5_0, q5_1 (the blocks of ggml's reference quantizers, as
    /// `llama-quantize --pure` writes them). Vectors and the position embedding stay f32.
    #[arg(long = "type", visible_alias = "outtype", value_name = "TYPE", value_parser = parse_type)]
    pub ty: WeightType,
    /// The model's name in the file's metadata (`general.name`; default: the folder's, file's
    /// or Hub repository's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Use only the local Hugging Face cache, never the network (also: HF_HUB_OFFLINE=1).
    #[arg(long)]
    pub offline: bool,
}

/// A type by llama.cpp's name, in either case (`q4_0`, `Q4_0`).
fn parse_type(s: &str) -> std::result::Result<WeightType, String> {
    let known = WeightType::ALL.iter().chain(&[WeightType::Q5K, WeightType::Q6K]);
    known.copied().find(|t| t.name().eq_ignore_ascii_case(s)).ok_or_else(|| {
        let names: Vec<&str> = TYPES.iter().map(|t| t.name()).collect();
        format!("`{s}` is not a type; a GGUF is written as one of {}", names.join(", "))
    })
}

pub fn run(a: &ConvertArgs) -> Result<Outcome> {
    let files = Locate::from_env(a.offline).resolve(&a.model)?;
    // Ctrl-C, SIGTERM or a closed terminal stop the run at the next row, which removes what it wrote.
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM, SIGHUP] {
        signal_hook::flag::register(signal, stop.clone())?;
    }
    let t0 = Instant::now();
    let to = convert::Target { path: &a.out, ty: a.ty, name: a.name.as_deref(), stop: &stop };
    let done = match convert::convert(&files, &to) {
        Err(e @ kvgpt_core::Error::Stopped(_)) => {
            errln!("{e}");
            std::process::exit(130);
        }
        done => done?,
    };
    if let Some((first, from)) = done.requantized.first() {
        errln!(
            "note: {} of {} in another block type ({first} as {}{}) are widened and quantized again as {}",
            count(done.requantized.len(), "tensor"),
            a.model,
            from.name(),
            if done.requantized.len() > 1 { ", …" } else { "" },
            a.ty.name()
        );
    }
    let types: Vec<String> = done.types.iter().map(|(t, n)| format!("{n} {t}")).collect();
    outln!(
        "wrote {} ({}, {}: {}) in {:.1} s",
        a.out.display(),
        units::bytes(done.file_bytes as usize),
        count(done.types.iter().map(|t| t.1).sum(), "tensor"),
        types.join(", "),
        t0.elapsed().as_secs_f64()
    );
    Ok(Outcome::Done)
}
