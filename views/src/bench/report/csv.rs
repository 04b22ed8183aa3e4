//! `kvgpt bench --output csv`: one line per row, the fields of the JSON rows.

use super::RowReport;
use std::fmt::{Result, Write as _};

/// The rows as CSV, a header line first.
pub fn csv(rows: &[RowReport]) -> String {
    let mut out = String::new();
    let _ = write_csv(&mut out, rows); // writing into a String cannot fail
    out
}

fn write_csv(out: &mut String, rows: &[RowReport]) -> Result {
    writeln!(
        out,
        "test,mode,prompt_tokens,gen_tokens,dtype,threads,reps,tok_s_avg,tok_s_sd,p50_ms,p90_ms,p99_ms,ttft_ms,\
         weight_gb_s,peak_rss_mb,git,batch,sampler,draft,acceptance,tokens_per_step,model,model_size_bytes,\
         model_params,backend,n_depth,kv_block_size,kv_dtype"
    )?;
    // The model's name may hold a comma or a quote: quoted as CSV quotes a field.
    let quoted = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let opt = |x: Option<f64>| x.map(|v| v.to_string()).unwrap_or_default();
    for r in rows {
        writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
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
            r.n_depth,
            r.kv_block_size,
            r.kv_dtype
        )?;
    }
    Ok(())
}
