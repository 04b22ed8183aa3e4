//! Every compiled path against the scalar reference (bit for bit) and against a naive f64
//! computation (within float tolerance), on awkward shapes; plus the invariants the engine relies
//! on: a row's result does not depend on how many rows are computed with it, nor on threads.

use kvgpt_kernels::*;

mod common;
use common::{bits, close, Gen};

const AWKWARD: [usize; 6] = [0, 1, 7, 17, 63, 257];

fn matmul_ref(inp: &[f32], w: &[f32], bias: &[f32], t: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; t * n];
    for r in 0..t {
        for c in 0..n {
            let mut s = bias[c] as f64;
            for i in 0..k {
                s += inp[r * k + i] as f64 * w[i * n + c] as f64;
            }
            out[r * n + c] = s;
        }
    }
    out
}

fn run_matmul(isa: Isa, t: usize, k: usize, n: usize, g: &mut Gen) -> (Vec<f32>, Vec<f64>) {
    let inp = g.vec(t * k);
    let w = g.vec(k * n);
    let bias = g.vec(n);
    let mut out = vec![f32::NAN; t * n];
    matmul(isa, &mut out, &inp, &w, &bias, t, k, n);
    (out, matmul_ref(&inp, &w, &bias, t, k, n))
}

#[test]
fn matmul_every_path_on_awkward_shapes() {
    for &t in &[1usize, 3, 4, 5, 9, 17, 64, 65] {
        for &k in &AWKWARD {
            for &n in &AWKWARD {
                let reference = run_matmul(Isa::scalar(), t, k, n, &mut Gen(7)).0;
                for isa in Isa::available() {
                    let (out, want) = run_matmul(isa, t, k, n, &mut Gen(7));
                    assert_eq!(bits(&out), bits(&reference), "{} t={t} k={k} n={n}", isa.name());
                    close(&out, &want, 1e-5 * (k as f64).sqrt().max(1.0), "matmul");
                }
            }
        }
    }
}

#[test]
fn matmul_gpt2_shapes() {
    for &(k, n) in &[(768usize, 2304usize), (768, 3072), (3072, 768), (768, 768)] {
        for &t in &[1usize, 6] {
            let reference = run_matmul(Isa::scalar(), t, k, n, &mut Gen(11)).0;
            for isa in Isa::available() {
                let (out, want) = run_matmul(isa, t, k, n, &mut Gen(11));
                assert_eq!(bits(&out), bits(&reference), "{} {k}x{n}", isa.name());
                close(&out, &want, 1e-4, "matmul");
            }
        }
    }
}

#[test]
fn a_row_is_the_same_alone_or_with_others_and_on_any_thread_count() {
    let (t, k, n) = (9, 257, 300);
    let mut g = Gen(5);
    let inp = g.vec(t * k);
    let w = g.vec(k * n);
    let bias = g.vec(n);
    let isa = Isa::detect();
    let mut all = vec![0.0; t * n];
    matmul(isa, &mut all, &inp, &w, &bias, t, k, n);
    for r in 0..t {
        let mut one = vec![0.0; n];
        matmul(isa, &mut one, &inp[r * k..(r + 1) * k], &w, &bias, 1, k, n);
        assert_eq!(bits(&one), bits(&all[r * n..(r + 1) * n]), "matmul row {r}");
    }
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let (big_t, big_k, big_n) = (33, 768, 2304);
        let mut g = Gen(9);
        let (inp, w, bias) = (g.vec(big_t * big_k), g.vec(big_k * big_n), g.vec(big_n));
        let mut out = vec![0.0; big_t * big_n];
        pool.install(|| matmul(isa, &mut out, &inp, &w, &bias, big_t, big_k, big_n));
        let mut serial = vec![0.0; big_t * big_n];
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| matmul(Isa::scalar(), &mut serial, &inp, &w, &bias, big_t, big_k, big_n));
        assert_eq!(bits(&out), bits(&serial), "{threads} threads");
    }
}

#[test]
fn layernorm_gelu_softmax_every_path() {
    for &c in &[1usize, 7, 17, 63, 64, 257, 768] {
        let t = 3;
        let mut g = Gen(c as u64);
        let inp: Vec<f32> = g.vec(t * c).iter().map(|x| x * 3.0 + 0.5).collect();
        let w = g.vec(c);
        let b = g.vec(c);
        let mut want = vec![0.0f64; t * c];
        for r in 0..t {
            let row = &inp[r * c..(r + 1) * c];
            let mean = row.iter().map(|&x| x as f64).sum::<f64>() / c as f64;
            let var = row.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / c as f64;
            for i in 0..c {
                want[r * c + i] = (row[i] as f64 - mean) / (var + 1e-5).sqrt() * w[i] as f64 + b[i] as f64;
            }
        }
        let mut reference = vec![0.0; t * c];
        layernorm(Isa::scalar(), &mut reference, &inp, &w, &b, t, c, 1e-5);
        let mut gel_ref = inp.clone();
        gelu_new(Isa::scalar(), &mut gel_ref);
        let mut sm_ref = inp.clone();
        softmax_inplace(Isa::scalar(), &mut sm_ref);
        let sm_want: Vec<f64> = {
            let m = inp.iter().fold(f64::MIN, |a, &x| a.max(x as f64));
            let e: Vec<f64> = inp.iter().map(|&x| (x as f64 - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.iter().map(|x| x / s).collect()
        };
        for isa in Isa::available() {
            let mut out = vec![0.0; t * c];
            layernorm(isa, &mut out, &inp, &w, &b, t, c, 1e-5);
            assert_eq!(bits(&out), bits(&reference), "layernorm {} c={c}", isa.name());
            close(&out, &want, 2e-5, "layernorm");
            let mut gel = inp.clone();
            gelu_new(isa, &mut gel);
            assert_eq!(bits(&gel), bits(&gel_ref), "gelu {} c={c}", isa.name());
            let mut sm = inp.clone();
            softmax_inplace(isa, &mut sm);
            assert_eq!(bits(&sm), bits(&sm_ref), "softmax {} c={c}", isa.name());
            close(&sm, &sm_want, 1e-6, "softmax");
        }
    }
}

#[test]
fn half_conversions_match_the_half_crate() {
    for h in 0..=u16::MAX {
        let want = half::f16::from_bits(h).to_f32();
        let got = f16_bits_to_f32(h);
        assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "f16 {h:#06x}");
        let want = half::bf16::from_bits(h).to_f32();
        let got = bf16_bits_to_f32(h);
        assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "bf16 {h:#06x}");
    }
    let mut g = Gen(21);
    let specials = [0.0f32, -0.0, 1.0, 65504.0, 65520.0, 1e-8, 6.1e-5, 5.96e-8, 2.98e-8, f32::INFINITY, -1e30];
    for x in g.vec(100_000).iter().map(|x| x * 70000.0).chain(g.vec(100_000).iter().map(|x| x * 1e-4)).chain(specials) {
        assert_eq!(f32_to_f16_bits(x), half::f16::from_f32(x).to_bits(), "f16 of {x:e}");
        assert_eq!(f32_to_bf16_bits(x), half::bf16::from_f32(x).to_bits(), "bf16 of {x:e}");
    }
}

#[test]
fn packed_matmul_every_type_and_path_equals_the_reference_on_the_widened_matrix() {
    let types = [WeightType::F32, WeightType::F16, WeightType::Bf16, WeightType::Q8];
    let shapes: Vec<(usize, usize, usize)> = [1usize, 2, 5, 6, 7, 8, 13, 16, 17, 37, 131]
        .iter()
        .flat_map(|&t| {
            [(1usize, 1usize), (7, 17), (17, 63), (63, 257), (257, 7), (300, 16), (600, 40), (131, 100)]
                .map(move |(k, n)| (t, k, n))
        })
        .chain([(1, 768, 2304), (7, 768, 3072), (1, 3072, 768), (8, 768, 3072), (13, 3072, 768), (17, 768, 2304)])
        .collect();
    for &(t, k, n) in &shapes {
        let mut g = Gen((t * 1000 + k * 7 + n) as u64);
        let (inp, w, bias) = (g.vec(t * k), g.vec(k * n), g.vec(n));
        for ty in types {
            let packed = PackedMatrix::pack(&w, k, n, ty);
            let widened = packed.unpack();
            let mut want = vec![0.0; t * n];
            matmul(Isa::scalar(), &mut want, &inp, &widened, &bias, t, k, n);
            for isa in Isa::available() {
                let mut out = vec![f32::NAN; t * n];
                matmul_packed(isa, &mut out, &inp, &packed, &bias, t, &mut QuantizedActs::default());
                assert_eq!(bits(&out), bits(&want), "{ty:?} {} t={t} k={k} n={n}", isa.name());
            }
            // The widened weights are the stored ones: exact for f32, rounding-sized otherwise.
            let tol = match ty {
                WeightType::F32 => 0.0,
                WeightType::F16 => 1.0 / 2048.0,
                WeightType::Bf16 => 1.0 / 256.0,
                WeightType::Q8 => 1.0 / 254.0,
                _ => unreachable!("the integer types have their own tests"),
            };
            for i in 0..k {
                let amax = w[i * n..(i + 1) * n].iter().fold(0.0f32, |m, x| m.max(x.abs()));
                for c in 0..n {
                    let (a, b) = (w[i * n + c], widened[i * n + c]);
                    let scale = if ty == WeightType::Q8 { amax } else { a.abs() };
                    // Half a quantization step at most, plus a few ulps of the value for the f32
                    // rounding of w / step and q · step (a value half a step off lands either side).
                    let slack = 4.0 * f32::EPSILON * a.abs() + 1e-12;
                    assert!((a - b).abs() <= tol * scale + slack, "{ty:?} w[{i},{c}] {a} -> {b} (t={t} k={k} n={n})");
                }
            }
        }
    }
}

#[test]
fn packed_matmul_rows_and_threads_do_not_change_bits() {
    // t·k past PAR_MIN_WORK: W8A8's activations are quantized on both threads.
    let (t, k, n) = (86, 768, 768);
    let mut g = Gen(77);
    let (inp, w, bias) = (g.vec(t * k), g.vec(k * n), g.vec(n));
    for ty in [WeightType::F32, WeightType::Q8, WeightType::W8A8] {
        let packed = PackedMatrix::pack(&w, k, n, ty);
        let mut all = vec![0.0; t * n];
        rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap().install(|| {
            matmul_packed(Isa::detect(), &mut all, &inp, &packed, &bias, t, &mut QuantizedActs::default());
        });
        for r in 0..t {
            let mut one = vec![0.0; n];
            rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| {
                matmul_packed(
                    Isa::detect(),
                    &mut one,
                    &inp[r * k..(r + 1) * k],
                    &packed,
                    &bias,
                    1,
                    &mut QuantizedActs::default(),
                );
            });
            assert_eq!(bits(&one), bits(&all[r * n..(r + 1) * n]), "{ty:?} row {r}");
        }
    }
}

#[test]
fn vocabulary_projection_and_embedding_columns_every_type_and_path() {
    // wteᵀ [C, V] in panels: the projection against the reference on the widened matrix, a
    // column (a token's embedding) equal to the widened column, and a matrix streamed in column
    // blocks (as the loader does) equal to one packed at once.
    for &(t, k, n) in &[(1usize, 768usize, 50257usize), (3, 64, 50257), (2, 0, 40), (2, 0, 48), (9, 0, 100), (0, 7, 17)]
    {
        let mut g = Gen((t + k * 3 + n) as u64);
        let (inp, w) = (g.vec(t * k), g.vec(k * n));
        let zero = vec![0.0; n];
        for ty in [WeightType::F32, WeightType::F16, WeightType::Bf16, WeightType::Q8] {
            let packed = PackedMatrix::pack(&w, k, n, ty);
            let widened = packed.unpack();
            let mut want = vec![0.0; t * n];
            matmul(Isa::scalar(), &mut want, &inp, &widened, &zero, t, k, n);
            for isa in Isa::available() {
                let mut out = vec![f32::NAN; t * n];
                matmul_packed(isa, &mut out, &inp, &packed, &zero, t, &mut QuantizedActs::default());
                assert_eq!(bits(&out), bits(&want), "{ty:?} {} t={t} k={k} n={n}", isa.name());
            }
            for c in [0, n / 2, n - 1] {
                let col: Vec<f32> = (0..k).map(|i| widened[i * n + c]).collect();
                assert_eq!(bits(&packed.column(c)), bits(&col), "{ty:?} column {c}");
            }
            let streamed = streamed_by_columns(&w, k, n, ty);
            assert_eq!(bits(&streamed.unpack()), bits(&widened), "{ty:?} streamed k={k} n={n}");
        }
    }
}

#[test]
fn every_instruction_set_the_cpu_reports_is_listed_and_so_tested() {
    let names: Vec<&str> = Isa::available().iter().map(|i| i.name()).collect();
    assert_eq!(names[0], "scalar", "the reference comes first");
    assert_eq!(Isa::detect().name(), *names.last().unwrap(), "detect picks the best listed");
    #[cfg(target_arch = "x86_64")]
    {
        use std::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma") && has!("f16c");
        assert_eq!(names.contains(&"avx2+fma"), avx2, "{names:?}");
        assert_eq!(names.contains(&"avx512"), avx2 && has!("avx512f"), "{names:?}");
    }
    for n in &names {
        assert_eq!(Isa::by_name(n).map(|i| i.name()), Some(*n));
    }
    assert!(Isa::by_name("sse9").is_none());
    eprintln!("instruction sets tested on this CPU: {}", names.join(", "));
}

/// W8A8 as its definition reads, written independently of the kernels: weights quantized per
/// column and block of 32 rows, activations per row and block (`round(x · (1/s))`, half to even,
/// within ±127, `s = max|x| / 127`), exact integer block sums, then
/// `acc = fma(sa * sw, sum, acc)` in block order and the bias.
fn w8a8_reference(inp: &[f32], w: &[f32], bias: &[f32], t: usize, k: usize, n: usize) -> Vec<f32> {
    let blocks = k.div_ceil(32);
    let quant = |v: &[f32]| -> (f32, Vec<i64>) {
        let s = v.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 127.0;
        let q = v
            .iter()
            .map(|&x| if s == 0.0 { 0 } else { (x * (1.0 / s)).round_ties_even().clamp(-127.0, 127.0) as i64 })
            .collect();
        (s, q)
    };
    let mut out = vec![0.0f32; t * n];
    for c in 0..n {
        let wq: Vec<(f32, Vec<i64>)> = (0..blocks)
            .map(|b| quant(&(b * 32..((b + 1) * 32).min(k)).map(|i| w[i * n + c]).collect::<Vec<_>>()))
            .collect();
        for r in 0..t {
            let mut acc = 0.0f32;
            for (b, (sw, qw)) in wq.iter().enumerate() {
                let (sa, qa) = quant(&inp[r * k + b * 32..r * k + ((b + 1) * 32).min(k)]);
                let sum: i64 = qa.iter().zip(qw).map(|(a, b)| a * b).sum();
                acc = (sa * sw).mul_add(sum as f32, acc);
            }
            out[r * n + c] = acc + bias[c];
        }
    }
    out
}

#[test]
fn w8a8_every_path_equals_its_definition_and_stays_close_to_f32() {
    let shapes: Vec<(usize, usize, usize)> = [1usize, 2, 3, 4, 5, 8, 13, 17, 37]
        .iter()
        .flat_map(|&t| {
            [(1usize, 1usize), (7, 17), (31, 63), (33, 48), (64, 257), (300, 16), (96, 40)].map(move |(k, n)| (t, k, n))
        })
        .chain([
            (1, 768, 2304),
            (7, 768, 3072),
            (1, 3072, 768),
            (8, 768, 3072),
            (13, 3072, 768),
            (96, 768, 96), // t·k past PAR_MIN_WORK: the activations quantized on every thread
            (85, 790, 33), // and with rows padded (K = 790 in 800)
            (2, 0, 40),
            (0, 7, 17),
        ])
        .collect();
    for &(t, k, n) in &shapes {
        let mut g = Gen((t * 1000 + k * 7 + n) as u64 ^ 0x88);
        let (mut inp, w, bias) = (g.vec(t * k), g.vec(k * n), g.vec(n));
        if t * k > 40 {
            inp[..32.min(k)].fill(0.0); // an all-zero block (scale 0)
            inp[t * k / 2] = 5.0; // an outlier
        }
        let want = w8a8_reference(&inp, &w, &bias, t, k, n);
        let packed = PackedMatrix::pack(&w, k, n, WeightType::W8A8);
        for isa in Isa::available() {
            let mut out = vec![f32::NAN; t * n];
            let mut acts = QuantizedActs::default();
            matmul_packed(isa, &mut out, &inp, &packed, &bias, t, &mut acts);
            assert_eq!(bits(&out), bits(&want), "W8A8 {} t={t} k={k} n={n}", isa.name());
        }
        // Close to the exact product: each factor within half a step of its block's max-abs/127.
        let exact = matmul_ref(&inp, &w, &bias, t, k, n);
        for (i, (g, e)) in want.iter().zip(&exact).enumerate() {
            let (r, c) = (i / n.max(1), i % n.max(1));
            let amax = |v: &mut dyn Iterator<Item = f32>| v.fold(0.0f32, |m, x| m.max(x.abs())) as f64;
            let bound: f64 = (0..k.div_ceil(32))
                .map(|b| {
                    let rows = b * 32..((b + 1) * 32).min(k);
                    let xa = amax(&mut rows.clone().map(|i| inp[r * k + i]));
                    let wa = amax(&mut rows.clone().map(|i| w[i * n + c]));
                    rows.len() as f64 * (xa * wa / 127.0 + xa * wa / 127.0 + xa * wa / (254.0 * 254.0))
                })
                .sum();
            assert!(
                (*g as f64 - e).abs() <= bound + 1e-5 * (1.0 + e.abs()),
                "W8A8 t={t} k={k} n={n} [{i}]: {g} vs {e}"
            );
        }
        // The stored weights, widened, are the quantized ones; streaming by columns (as the
        // loader does for wteᵀ) stores the same.
        let widened = packed.unpack();
        let streamed = streamed_by_columns(&w, k, n, WeightType::W8A8);
        assert_eq!(bits(&streamed.unpack()), bits(&widened), "W8A8 streamed k={k} n={n}");
        for c in (0..n).step_by(7) {
            let col: Vec<f32> = (0..k).map(|i| widened[i * n + c]).collect();
            assert_eq!(bits(&packed.column(c)), bits(&col), "W8A8 column {c}");
        }
    }
}

#[test]
fn w8a8_vocabulary_projection_every_path() {
    let (t, k, n) = (3usize, 768usize, 50257usize);
    let mut g = Gen(5);
    let (inp, w) = (g.vec(t * k), g.vec(k * n));
    let zero = vec![0.0; n];
    let want = w8a8_reference(&inp, &w, &zero, t, k, n);
    let packed = PackedMatrix::pack(&w, k, n, WeightType::W8A8);
    for isa in Isa::available() {
        for rows in [1, t] {
            let mut out = vec![f32::NAN; rows * n];
            matmul_packed(isa, &mut out, &inp, &packed, &zero, rows, &mut QuantizedActs::default());
            assert_eq!(bits(&out), bits(&want[..rows * n]), "W8A8 vocabulary {} rows={rows}", isa.name());
        }
    }
}

/// `w` (`[K, N]`) stored as the loader stores wteᵀ: in blocks of [`Q8_BLOCK`] columns.
fn streamed_by_columns(w: &[f32], k: usize, n: usize, ty: WeightType) -> PackedMatrix {
    let mut m = PackedMatrix::zeros(k, n, ty);
    for c0 in (0..n).step_by(Q8_BLOCK) {
        let cols: Vec<f32> =
            (c0..(c0 + Q8_BLOCK).min(n)).flat_map(|c| (0..k).map(move |i| (i, c))).map(|(i, c)| w[i * n + c]).collect();
        m.set_cols(c0, &cols);
    }
    m
}
