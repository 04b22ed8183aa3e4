//! The cache view in the terminal: per step, what was written and read, the work with and
//! without the cache, the chosen layer's cache rows with the last query's weights per head, and
//! the chosen head's scores and K/V values.

use super::axis_label;
use super::cache::{CacheView, StepView};
use super::term::Colors;
use std::fmt::{Result, Write as _};

/// Positions of the cache grid and keys of the scores shown at most (the latest ones).
const ROWS: usize = 16;
const SCORE_QUERIES: usize = 6;
const SCORE_KEYS: usize = 8;

pub fn count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1} k", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2} M", n as f64 / 1e6),
        _ => format!("{:.2} G", n as f64 / 1e9),
    }
}

/// Bytes by the one rule every command uses ([`kvgpt_core::units::bytes`]).
pub fn bytes(n: u64) -> String {
    kvgpt_core::units::bytes(n as usize)
}

fn positions(a: usize, b: usize) -> String {
    match b - a {
        0 => "none".into(),
        1 => format!("position {a}"),
        _ => format!("positions {a}–{}", b - 1),
    }
}

/// What the step did, in one sentence.
pub fn summary(v: &CacheView, st: &StepView) -> String {
    let [a, b] = st.written;
    let toks = |i: usize| format!("“{}”", axis_label(&v.tokens[i]));
    match st.kind {
        "prefill" => format!(
            "step 0 — prefill: {} prompt token{} at {} computed together; their K,V written into the cache",
            b - a,
            if b - a == 1 { "" } else { "s" },
            positions(a, b)
        ),
        kind => format!(
            "step {} — {}: {} at position {a} reads K,V of {} from the cache, computes only its own q,k,v and \
             writes position {a}",
            st.step,
            if kind == "prompt" { "a prompt token fed alone" } else { "decode" },
            toks(a),
            positions(0, a)
        ),
    }
}

fn work_table(out: &mut String, st: &StepView) -> Result {
    let w = &st.work;
    writeln!(out, "  {:<16}{:>14}{:>16}{:>9}", "", "with cache", "without cache", "ratio")?;
    let rows = [
        ("positions run", w.with_cache.positions, w.without_cache.positions, None, false),
        ("multiply-adds", w.with_cache.macs, w.without_cache.macs, Some(w.ratio.macs), false),
        ("weight bytes", w.with_cache.weight_bytes, w.without_cache.weight_bytes, Some(w.ratio.weight_bytes), true),
        (
            "K/V bytes read",
            w.with_cache.kv_read_bytes,
            w.without_cache.kv_read_bytes,
            Some(w.ratio.kv_read_bytes),
            true,
        ),
    ];
    for (name, a, b, r, is_bytes) in rows {
        let f = |n: u64| if is_bytes { bytes(n) } else { count(n) };
        let r = r.map_or(String::new(), |r| format!("{r:.1}×"));
        writeln!(out, "  {name:<16}{:>14}{:>16}{r:>9}", f(a), f(b))?;
    }
    Ok(())
}

fn grid(out: &mut String, v: &CacheView, st: &StepView, colors: Option<Colors>) -> Result {
    let [a, b] = st.written;
    writeln!(
        out,
        "  layer {}: the cache after this step (K V: ■ written by this step, □ read from the cache) and the \
         last query's weight on each key, per head; without the cache every row is run again (↻)",
        v.layer
    )?;
    let heads: String = (0..v.n_head).map(|h| format!("{:>7}", format!("h{h}"))).collect();
    writeln!(out, "  {:>5}  {:<14}{:<5}{heads}", "pos", "token", "K V")?;
    let from = b.saturating_sub(ROWS);
    if from > 0 {
        writeln!(out, "  {:>5}  … {from} earlier position{}", "", if from == 1 { "" } else { "s" })?;
    }
    for pos in from..b {
        let mark = if pos >= a { "■ ■" } else { "□ □" };
        let cell = |w: f32| {
            let text = format!("{w:>7.4}");
            colors.map_or_else(|| text.clone(), |c| c.paint(w, &text))
        };
        let w: String = (0..v.n_head).map(|h| cell(st.weights[v.layer][h][pos])).collect();
        let tok: String = axis_label(&v.tokens[pos]).chars().take(13).collect();
        writeln!(out, "  {pos:>5}  {tok:<14}{mark:<5}{w}   ↻")?;
    }
    Ok(())
}

fn scores(out: &mut String, v: &CacheView, st: &StepView) -> Result {
    let [a, b] = st.written;
    let hs = v.head_dim;
    writeln!(out, "  head {} scores before the softmax (q·k / √{hs}; −∞ is the causal mask):", v.head)?;
    let qs = st.scores.len();
    let (q0, k0) = (qs.saturating_sub(SCORE_QUERIES), b.saturating_sub(SCORE_KEYS));
    let keys: String = (k0..b).map(|k| format!("{k:>8}")).collect();
    writeln!(out, "  {:>7}{keys}", "q\\k")?;
    for (qi, row) in st.scores.iter().enumerate().skip(q0) {
        let cells: String =
            row[k0..].iter().map(|x| x.map_or_else(|| format!("{:>8}", "−∞"), |x| format!("{x:>8.3}"))).collect();
        writeln!(out, "  {:>7}{cells}", a + qi)?;
    }
    if q0 > 0 || k0 > 0 {
        writeln!(out, "  (the latest {} queries × {} keys; --json and --html have them all)", qs - q0, b - k0)?;
    }
    Ok(())
}

fn values(out: &mut String, v: &CacheView, st: &StepView, dims: usize) -> Result {
    let [a, b] = st.written;
    let d = dims.min(v.head_dim);
    writeln!(
        out,
        "  layer {} head {} K and V (the first {d} of {} numbers of each row):",
        v.layer, v.head, v.head_dim
    )?;
    let row = |r: &[f32]| r[..d].iter().map(|x| format!("{x:>8.4}")).collect::<String>();
    for pos in b.saturating_sub(ROWS)..b {
        let mark = if pos >= a { "■" } else { "□" };
        writeln!(out, "  {pos:>5} {mark}  K{}   V{}", row(&v.k[pos]), row(&v.v[pos]))?;
    }
    Ok(())
}

/// The steps as text (`only`: that step alone), each row's K and V cut to `dims` numbers.
pub fn steps_text(v: &CacheView, only: Option<usize>, dims: usize, colors: Option<Colors>) -> String {
    let mut out = String::new();
    let _ = write_steps(&mut out, v, only, dims, colors); // writing into a String cannot fail
    out
}

fn write_steps(out: &mut String, v: &CacheView, only: Option<usize>, dims: usize, colors: Option<Colors>) -> Result {
    writeln!(
        out,
        "KV cache of {} ({} weights): {} layers × (K, V), each [{} heads, positions, {}] {}, {} per position.",
        v.model,
        v.dtype,
        v.n_layer,
        v.n_head,
        v.head_dim,
        v.kv_dtype,
        bytes(v.bytes_per_position as u64)
    )?;
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    writeln!(
        out,
        "This run holds {} block{} of {} positions for its {} positions: {} (all {} of the model's positions would \
         take {}).",
        v.blocks,
        plural(v.blocks),
        v.block_size,
        v.positions_held,
        bytes(v.bytes_allocated as u64),
        v.n_positions,
        bytes((v.n_positions * v.bytes_per_position) as u64)
    )?;
    let table: Vec<String> = v
        .block_table
        .iter()
        .map(|e| {
            let by = if e.step == 0 { "prefill".into() } else { format!("step {}", e.step) };
            match &e.stored {
                Some(s) => format!("{}→#{} ({by}; --kv-disk: {})", e.logical, e.physical, s.words()),
                None => format!("{}→#{} ({by})", e.logical, e.physical),
            }
        })
        .collect();
    writeln!(out, "Block table (logical → the pool's block, taken by): {}", table.join(", "))?;
    if colors.is_some() {
        writeln!(out, "The grids' weights: {}", super::term::legend(colors))?;
    }
    for st in v.steps.iter().filter(|st| only.is_none_or(|o| o == st.step)) {
        writeln!(out, "\n{}", summary(v, st))?;
        let b = st.written[1];
        match st.recomputed_same_bits {
            None => writeln!(out, "  without the cache: the same computation (a prefill starts from an empty cache)")?,
            Some(same) => writeln!(
                out,
                "  without the cache: {} run again from the start ({}same bits as with it)",
                positions(0, b),
                if same { "" } else { "NOT the " }
            )?,
        }
        work_table(out, st)?;
        grid(out, v, st, colors)?;
        scores(out, v, st)?;
        values(out, v, st, dims)?;
    }
    Ok(())
}
