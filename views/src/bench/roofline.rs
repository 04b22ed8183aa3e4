//! `kvgpt bench --roofline`: each of the model's matrix shapes at a few rows (a batch of decode
//! steps, a verify of drafted tokens), timed, against its roof: the longer of reading its weights
//! once at the measured read bandwidth and doing its FLOPs at the measured FMA peak. A product
//! at 100% of its roof cannot be made faster without reading fewer bytes or doing fewer FLOPs.

use kvgpt_core::Model;
use kvgpt_kernels::{
    dot_ops_per_round, dot_peak, fma_flops_per_round, fma_peak, matmul_packed, read_all, Isa, PackedMatrix,
    QuantizedActs,
};
use serde::Serialize;
use std::time::Instant;

/// What this machine does at most, measured: FMA GFLOP/s and integer dot-product GOP/s (a byte
/// product and its addition count two, as a multiply and an add do) on every thread of the pool
/// at once, and read GB/s from memory.
#[derive(Clone, Copy, Serialize)]
pub struct Roof {
    pub peak_gflops: f64,
    pub peak_int_gops: f64,
    /// The memory roof (see [`roofline`]).
    pub read_gb_s: f64,
    /// What the read-bandwidth probe measured.
    pub probe_gb_s: f64,
}

/// One matrix at one row count.
#[derive(Serialize)]
pub struct RoofRow {
    pub matrix: &'static str,
    pub k: usize,
    pub n: usize,
    pub rows: usize,
    pub ms: f64,
    pub gflops: f64,
    /// The weights' bytes over the time: what a memory-bound product reads per second.
    pub weight_gb_s: f64,
    /// max(bytes / read bandwidth, FLOPs / peak).
    pub roof_ms: f64,
    /// `roof_ms / ms`: 1 is at the roof.
    pub of_roof: f64,
    /// Which roof is the higher: "memory", "FMA" (f32 arithmetic) or "int8" (integer dot
    /// products: W8A8 and llama.cpp's block types).
    pub bound: &'static str,
}

/// The roofs of `isa` on every thread of the current pool, with `read_gb_s` measured apart.
pub fn roof(isa: Isa, read_gb_s: f64) -> Roof {
    let fma = peak(fma_flops_per_round(isa), |c| fma_peak(isa, ROUNDS, 0.5 + c as f32 * 1e-3));
    let int = peak(dot_ops_per_round(isa), |_| dot_peak(isa, ROUNDS));
    Roof { peak_gflops: fma, peak_int_gops: int, read_gb_s, probe_gb_s: read_gb_s }
}

/// Rounds per probe: a few milliseconds.
const ROUNDS: usize = 2_000_000;

/// Billions of operations a second of `probe` (`per_round` each round) on every thread at once,
/// best of three.
fn peak(per_round: usize, probe: impl Fn(usize) -> f32 + Sync) -> f64 {
    let threads = rayon::current_num_threads();
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let sums = rayon::broadcast(|c| probe(c.index()));
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(sums);
        best = best.max((per_round * ROUNDS * threads) as f64 / secs / 1e9);
    }
    best
}

/// Every matrix of block 0 and the vocabulary projection at each of `rows`, the best of `reps`
/// (at least 5) single calls, each after every thread swept `evict` (larger than the caches):
/// the weights come from memory, as in a decode step, whose matrices together are larger than
/// the caches too. The memory roof is the faster of the probe and the fastest stream of
/// weights a product reached (a VM's bandwidth drifts; a probe run in a slow moment would put a
/// product above its roof); `roof.read_gb_s` is updated to it.
pub fn roofline(model: &Model, rows: &[usize], reps: usize, roof: &mut Roof, evict: &[f32]) -> Vec<RoofRow> {
    let b = &model.h[0];
    let matrices: [(&'static str, &PackedMatrix); 5] = [
        ("attn.c_attn", &b.c_attn.weight),
        ("attn.c_proj", &b.attn_c_proj.weight),
        ("mlp.c_fc", &b.c_fc.weight),
        ("mlp.c_proj", &b.mlp_c_proj.weight),
        ("vocabulary (wte)", &model.wte),
    ];
    let mut timed = Vec::new();
    for (matrix, w) in matrices {
        for &t in rows {
            timed.push((matrix, w, t, time_ms(model.isa(), w, t, reps.max(5), evict)));
        }
    }
    let fastest = timed.iter().map(|(_, w, _, ms)| w.bytes() as f64 / ms / 1e6).fold(0.0, f64::max);
    roof.read_gb_s = roof.read_gb_s.max(fastest);
    timed.into_iter().map(|(matrix, w, t, ms)| row(matrix, w, t, ms, roof)).collect()
}

/// One timed product against its roof.
fn row(matrix: &'static str, w: &PackedMatrix, t: usize, ms: f64, roof: &Roof) -> RoofRow {
    let (k, n) = (w.k(), w.n());
    let flops = 2.0 * (t * k * n) as f64;
    let bytes = w.bytes() as f64;
    let int = w.weight_type().is_integer();
    let (peak, unit) = if int { (roof.peak_int_gops, "int8") } else { (roof.peak_gflops, "FMA") };
    let (memory_ms, compute_ms) = (bytes / roof.read_gb_s / 1e6, flops / peak / 1e6);
    let roof_ms = memory_ms.max(compute_ms);
    RoofRow {
        matrix,
        k,
        n,
        rows: t,
        ms,
        gflops: flops / ms / 1e6,
        weight_gb_s: bytes / ms / 1e6,
        roof_ms,
        of_roof: roof_ms / ms,
        bound: if memory_ms >= compute_ms { "memory" } else { unit },
    }
}

/// The best time of `reps` calls of `w` at `t` rows, each after the caches were swept.
fn time_ms(isa: Isa, w: &PackedMatrix, t: usize, reps: usize, evict: &[f32]) -> f64 {
    use rayon::prelude::*;
    let (k, n) = (w.k(), w.n());
    let inp: Vec<f32> = (0..t * k).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3).collect();
    let (bias, mut y, mut acts) = (vec![0.0f32; n], vec![0.0f32; t * n], QuantizedActs::default());
    matmul_packed(isa, &mut y, &inp, w, &bias, t, &mut acts); // the output's and the activations' buffers
    let chunk = evict.len().div_ceil(rayon::current_num_threads()).max(1);
    let mut best = f64::MAX;
    for _ in 0..reps {
        let swept: f32 = evict.par_chunks(chunk).map(|c| read_all(isa, c)).sum();
        std::hint::black_box(swept);
        let t0 = Instant::now();
        matmul_packed(isa, &mut y, &inp, w, &bias, t, &mut acts);
        best = best.min(t0.elapsed().as_secs_f64() * 1e3);
    }
    best
}

/// The table, as Markdown: one line per matrix and row count.
pub fn markdown(rows: &[RoofRow], roof: Roof, isa: &str, threads: usize) -> String {
    let mut s = format!(
        "roofline: {isa}, {threads} threads | FMA peak {:.0} GFLOP/s | int8 dot products {:.0} GOP/s | read \
         bandwidth {:.1} GB/s (the probe {:.1})\n\n\
         | matrix | K × N | rows | ms | G(FL)OP/s | weights GB/s | roof ms | of roof | bound |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---|\n",
        roof.peak_gflops, roof.peak_int_gops, roof.read_gb_s, roof.probe_gb_s
    );
    for r in rows {
        s += &format!(
            "| {} | {} × {} | {} | {:.3} | {:.1} | {:.1} | {:.3} | {:.0}% | {} |\n",
            r.matrix,
            r.k,
            r.n,
            r.rows,
            r.ms,
            r.gflops,
            r.weight_gb_s,
            r.roof_ms,
            100.0 * r.of_roof,
            r.bound
        );
    }
    s
}
