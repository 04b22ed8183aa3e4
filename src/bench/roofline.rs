//! `kvgpt bench --roofline`: the model's matrix shapes at a few rows against this machine's
//! measured roofs (`kvgpt_views::bench::roofline`).

use super::{BenchArgs, Format};
use crate::common::{in_pool, load, print_json, Outcome};
use anyhow::{bail, Result};
use kvgpt_views::bench::probe_read_bandwidth;
use kvgpt_views::bench::roofline::{markdown, roof, roofline};

pub fn run(a: &BenchArgs) -> Result<Outcome> {
    if a.model.threads.len() > 1 {
        bail!("--roofline runs at one thread count: give -t once");
    }
    if a.probe_mib == 0 {
        bail!("--roofline needs the read-bandwidth probe: give --probe-mib above 0");
    }
    // The rows' flags mean nothing here: refused rather than ignored.
    let sampled = !a.sampling.sampling()?.is_greedy();
    let rows_flags = a.prompts.is_some() || a.gens.is_some() || a.depths.is_some() || a.no_uncached;
    if rows_flags || sampled || a.draft.draft.is_some() || a.draft.draft_model.is_some() {
        bail!(
            "--roofline times matrices, not prefill and decode rows: it takes --batch, -t, -r, --isa, --dtype, \
             --probe-mib and -o md|json; drop -p, -n, -d, --no-uncached, --draft and the sampling flags"
        );
    }
    if a.output == Format::Csv {
        bail!("--roofline writes -o md or -o json, not csv");
    }
    let threads = a.model.threads.first().map(|&n| usize::from(n));
    let rows = if a.batches == [1] { vec![1, 2, 4, 8, 16] } else { a.batches.clone() };
    let loaded = in_pool(threads, || load(&a.model))?;
    let model = &loaded.model;
    let (roof, table, threads) = in_pool(threads, || {
        let bytes = (a.probe_mib as usize) << 20;
        let read_gb_s = probe_read_bandwidth(bytes, 3)?;
        let mut roof = roof(model.isa(), read_gb_s);
        // The sweep that empties the caches before each timed call: as large as the probe.
        let evict: Vec<f32> = (0..bytes / 4).map(|i| (i % 251) as f32).collect();
        let table = roofline(model, &rows, a.reps as usize, &mut roof, &evict);
        Ok((roof, table, rayon::current_num_threads()))
    })?;
    match a.output {
        Format::Json => print_json(&serde_json::json!({
            "isa": model.isa().name(), "threads": threads, "dtype": model.weights_dtype(), "roof": roof, "rows": table,
        }))?,
        Format::Md | Format::Csv => out!("{}", markdown(&table, roof, model.isa().name(), threads)),
    }
    Ok(Outcome::Done)
}
