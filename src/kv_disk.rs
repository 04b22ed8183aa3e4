//! `--kv-disk DIR` and `--kv-disk-gb N`, as every command that keeps K/V on disk takes them
//! (`serve`, `generate`): the flags, and the store they open for a loaded model.

use anyhow::{Context, Result};
use clap::Args;
use kvgpt_core::store::{DiskTier, Store, Tier};
use kvgpt_core::Model;
use std::path::PathBuf;

#[derive(Args, Clone, Debug)]
pub struct KvDiskArgs {
    /// A directory for K/V blocks, content-addressed and checksummed, shared by every command and
    /// server that names it: written through as they are computed, looked up before computing a
    /// prompt, so they outlive the process. Blocks of another model, --kv-dtype or
    /// --kv-block-size are never found.
    #[arg(long, value_name = "DIR")]
    pub kv_disk: Option<PathBuf>,
    /// Gigabytes (GiB, decimals allowed) the --kv-disk directory may hold; past that the least
    /// recently used blocks go.
    #[arg(long, value_name = "GB", default_value = "10", value_parser = parse_gb, requires = "kv_disk")]
    pub kv_disk_gb: f64,
}

fn parse_gb(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(gb) if gb.is_finite() && gb > 0.0 && gb <= 1e6 => Ok(gb),
        _ => Err(format!("'{s}' is not a size in gigabytes: give a number above 0, e.g. 10 or 0.5")),
    }
}

impl KvDiskArgs {
    /// The directory and its budget in bytes, if one was given.
    pub fn tier(&self) -> Option<(PathBuf, u64)> {
        self.kv_disk.clone().map(|dir| (dir, (self.kv_disk_gb * (1u64 << 30) as f64) as u64))
    }

    /// The store over the directory for `model`'s K/V (None without --kv-disk).
    pub fn open(&self, model: &Model) -> Result<Option<Store>> {
        let Some((dir, bytes)) = self.tier() else { return Ok(None) };
        let disk =
            DiskTier::open(&dir, bytes).with_context(|| format!("--kv-disk {}: cannot use it", dir.display()))?;
        Ok(Some(Store::for_model(model, vec![Box::new(disk) as Box<dyn Tier>])?))
    }
}
