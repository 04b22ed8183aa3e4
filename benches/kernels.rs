//! Kernel throughput at DistilGPT-2 shapes: matmul over packed weights (f32, f16, int8) for
//! decode (T=1, reported as weight bytes/s) and prefill (T=128, reported as FLOP/s as
//! "elements"), the tied vocabulary projection, and attention over a 512-position cache (decode;
//! prefill over contiguous and block-table K/V).
//! Run: `cargo bench -p kvgpt-kernels --bench kernels` (single thread unless RAYON_NUM_THREADS is
//! set; the sgemm yardsticks always one thread).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvgpt_kernels::*;
use std::hint::black_box;

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32 - 0.5) * 0.04
        })
        .collect()
}

fn matmuls(c: &mut Criterion) {
    let isa = std::env::var("KVGPT_ISA").ok().and_then(|n| Isa::by_name(&n)).unwrap_or_else(Isa::detect);
    for (k, n, name) in [(768, 2304, "c_attn"), (768, 3072, "c_fc"), (3072, 768, "mlp.c_proj")] {
        let w = data(k * n, 1);
        let bias = data(n, 2);
        for ty in [WeightType::F32, WeightType::F16, WeightType::Q8, WeightType::W8A8] {
            let packed = PackedMatrix::pack(&w, k, n, ty);
            let mut acts = QuantizedActs::default();
            let mut g = c.benchmark_group(format!("matmul_{name}_{k}x{n}_{}", ty.name()));
            for t in [1usize, 8, 128, 512] {
                let inp = data(t * k, 3);
                let mut out = vec![0.0; t * n];
                if t == 1 {
                    g.throughput(Throughput::Bytes(packed.bytes() as u64));
                } else {
                    g.throughput(Throughput::Elements((2 * t * k * n) as u64)); // FLOPs
                }
                g.bench_with_input(BenchmarkId::new("T", t), &t, |b, &t| {
                    b.iter(|| matmul_packed(isa, black_box(&mut out), black_box(&inp), &packed, &bias, t, &mut acts))
                });
            }
            g.finish();
        }
    }
}

fn vocab_projection(c: &mut Criterion) {
    let isa = Isa::detect();
    let (v, k) = (50257, 768);
    let w = data(k * v, 4); // wteᵀ [C, V], as the model holds it
    let x = data(k, 5);
    let zero = vec![0.0; v];
    let mut g = c.benchmark_group("lm_head_768x50257");
    for ty in [WeightType::F32, WeightType::F16, WeightType::Q8, WeightType::W8A8] {
        let wte_t = PackedMatrix::pack(&w, k, v, ty);
        let mut acts = QuantizedActs::default();
        let mut out = vec![0.0; v];
        g.throughput(Throughput::Bytes(wte_t.bytes() as u64));
        g.bench_function(ty.name(), |b| {
            b.iter(|| matmul_packed(isa, black_box(&mut out), black_box(&x), &wte_t, &zero, 1, &mut acts))
        });
    }
    g.finish();
}

fn attention_decode(c: &mut Criterion) {
    let isa = Isa::detect();
    let (nh, hs, t_max, p) = (12, 64, 1024, 511);
    let q = data(3 * nh * hs, 6);
    let (kc, vc) = (data(nh * t_max * hs, 7), data(nh * t_max * hs, 8));
    let mut out = vec![0.0; nh * hs];
    let mut scratch = vec![0.0; 2 * nh * t_max];
    let dims = AttnDims { t: 1, p, nh, hs, t_max, scale: 0.125 };
    c.bench_function("attention_decode_512_positions", |b| {
        b.iter(|| attention(isa, black_box(&mut out), None, &q, 3 * nh * hs, &kc, &vc, &mut scratch, dims))
    });
}

/// K/V of one layer in blocks of `b` positions, each block allocated on its own and as large as a
/// whole DistilGPT-2 block (6 layers), as the engine's pool holds them; layer 0 is read.
struct Scattered {
    blocks: Vec<Vec<f32>>,
    b: usize,
    nh: usize,
    hs: usize,
}

impl Scattered {
    fn of(k: &[f32], v: &[f32], nh: usize, hs: usize, t_max: usize, b: usize) -> Scattered {
        let blocks = (0..t_max.div_ceil(b))
            .map(|j| {
                let mut block = vec![0.0; 6 * 2 * nh * b * hs];
                for (part, src) in [k, v].into_iter().enumerate() {
                    for h in 0..nh {
                        for r in 0..b.min(t_max - j * b) {
                            let dst = ((part * nh + h) * b + r) * hs;
                            block[dst..dst + hs].copy_from_slice(&src[(h * t_max + j * b + r) * hs..][..hs]);
                        }
                    }
                }
                block
            })
            .collect();
        Scattered { blocks, b, nh, hs }
    }
}

impl KvBlocks for Scattered {
    fn block(&self) -> usize {
        self.b
    }
    fn k(&self, j: usize, h: usize) -> &[f32] {
        &self.blocks[j][h * self.b * self.hs..][..self.b * self.hs]
    }
    fn v(&self, j: usize, h: usize) -> &[f32] {
        &self.blocks[j][(self.nh + h) * self.b * self.hs..][..self.b * self.hs]
    }
}

/// The contiguous cache read in blocks of `b` positions: the blocks' loop without their placement.
struct Chunked<'a> {
    k: &'a [f32],
    v: &'a [f32],
    t_max: usize,
    b: usize,
    hs: usize,
}

impl KvBlocks for Chunked<'_> {
    fn block(&self) -> usize {
        self.b
    }
    fn k(&self, j: usize, h: usize) -> &[f32] {
        &self.k[(h * self.t_max + j * self.b) * self.hs..][..self.b * self.hs]
    }
    fn v(&self, j: usize, h: usize) -> &[f32] {
        &self.v[(h * self.t_max + j * self.b) * self.hs..][..self.b * self.hs]
    }
}

/// Prefill attention (512 queries after 512 cached positions, 12 heads of 64) over the contiguous
/// cache, over the same memory read in blocks of 16, and over blocks of 16 and 64 placed apart as
/// the pool places them (issue #34): what the block loop costs, and what the placement costs.
fn attention_blocks_prefill(c: &mut Criterion) {
    let isa = Isa::detect();
    let (nh, hs, t_max, p, t) = (12, 64, 1024, 512, 512);
    let q = data(t * 3 * nh * hs, 6);
    let (kc, vc) = (data(nh * t_max * hs, 7), data(nh * t_max * hs, 8));
    let mut out = vec![0.0; t * nh * hs];
    let mut scratch = vec![0.0; 2 * nh * t_max];
    let dims = AttnDims { t, p, nh, hs, t_max, scale: 0.125 };
    let mut g = c.benchmark_group("attention_prefill_512_after_512");
    g.sample_size(10);
    g.bench_function("contiguous", |b| {
        b.iter(|| attention(isa, black_box(&mut out), None, &q, 3 * nh * hs, &kc, &vc, &mut scratch, dims))
    });
    let chunked = Chunked { k: &kc, v: &vc, t_max, b: 16, hs };
    g.bench_function("contiguous_in_blocks_of_16", |b| {
        b.iter(|| attention_blocks(isa, black_box(&mut out), None, &q, 3 * nh * hs, &chunked, &mut scratch, dims))
    });
    for block in [16, 64] {
        let kv = Scattered::of(&kc, &vc, nh, hs, t_max, block);
        g.bench_function(format!("scattered_blocks_of_{block}"), |b| {
            b.iter(|| attention_blocks(isa, black_box(&mut out), None, &q, 3 * nh * hs, &kv, &mut scratch, dims))
        });
    }
    g.finish();
}

/// Our packed matmul beside two well-tuned Rust sgemms (yardsticks, issue #10) at the GPT-2
/// shapes, one thread each, f32, `out = inp @ W` (+ bias for ours, which costs one pass over the
/// output): `matrixmultiply` (BLIS-style, runtime-dispatched) and `gemm` (the one candle uses).
/// `out[t, n] = inp[t, k] @ w[k, n]` by matrixmultiply (row-major, no bias).
fn mm_sgemm(out: &mut [f32], inp: &[f32], w: &[f32], t: usize, k: usize, n: usize) {
    assert!(out.len() >= t * n && inp.len() >= t * k && w.len() >= k * n);
    let (ks, ns) = (k as isize, n as isize);
    // SAFETY: row-major [t, k] @ [k, n] -> [t, n]; the buffers hold those sizes (asserted above).
    unsafe { matrixmultiply::sgemm(t, k, n, 1.0, inp.as_ptr(), ks, 1, w.as_ptr(), ns, 1, 0.0, out.as_mut_ptr(), ns, 1) }
}

/// `KVGPT_ISA=avx2+fma` (any name `Isa::by_name` knows) runs ours on that path instead of the best.
fn sgemm_yardsticks(c: &mut Criterion) {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let isa = std::env::var("KVGPT_ISA").ok().and_then(|n| Isa::by_name(&n)).unwrap_or_else(Isa::detect);
    for (k, n, name) in [(768usize, 2304usize, "c_attn"), (768, 3072, "c_fc"), (3072, 768, "mlp.c_proj")] {
        let w = data(k * n, 1);
        let bias = vec![0.0; n];
        let packed = PackedMatrix::pack(&w, k, n, WeightType::F32);
        let mut acts = QuantizedActs::default();
        for t in [1usize, 8, 128, 512] {
            let inp = data(t * k, 3);
            let mut out = vec![0.0f32; t * n];
            // The yardsticks compute the same product (a benchmark of garbage would be worthless).
            let mut theirs = vec![0.0f32; t * n];
            pool.install(|| matmul_packed(isa, &mut out, &inp, &packed, &bias, t, &mut QuantizedActs::default()));
            mm_sgemm(&mut theirs, &inp, &w, t, k, n);
            let diff = out.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(diff < 1e-3, "{name} T={t}: kvgpt and matrixmultiply differ by {diff}");
            let mut g = c.benchmark_group(format!("sgemm_{name}_{k}x{n}_T{t}"));
            g.throughput(Throughput::Elements((2 * t * k * n) as u64)); // FLOPs
            g.bench_function("kvgpt_packed", |b| {
                pool.install(|| {
                    b.iter(|| matmul_packed(isa, black_box(&mut out), black_box(&inp), &packed, &bias, t, &mut acts))
                })
            });
            g.bench_function("matrixmultiply", |b| b.iter(|| mm_sgemm(black_box(&mut out), &inp, &w, t, k, n)));
            g.bench_function("gemm", |b| {
                b.iter(|| unsafe {
                    // SAFETY: as above; gemm takes (dst, src) pointers with column and row strides.
                    gemm::gemm(
                        t,
                        n,
                        k,
                        out.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        inp.as_ptr(),
                        1,
                        k as isize,
                        w.as_ptr(),
                        1,
                        n as isize,
                        0.0f32,
                        1.0f32,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                })
            });
            g.finish();
        }
    }
}

criterion_group!(benches, matmuls, vocab_projection, attention_decode, attention_blocks_prefill, sgemm_yardsticks);
criterion_main!(benches);
