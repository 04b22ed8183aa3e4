//! llama.cpp's block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) and W8A8's integer
//! path, against a decoder and a matmul written here from the formats' definitions, which are in
//! turn checked against gguf-py, llama.cpp's own Python reader and writer
//! (`tests/fixtures/ggml_blocks.json`, made by `scripts/fixtures/make_ggml_reference.py`).

mod common;

use common::*;
use half::f16;
use kvgpt_kernels::{matmul_packed, quantize_blocks, widen_blocks, Isa, PackedMatrix, QuantizedActs, WeightType};

const TYPES: [(&str, WeightType); 8] = [
    ("Q8_0", WeightType::Q8_0),
    ("Q4_0", WeightType::Q4_0),
    ("Q4_1", WeightType::Q4_1),
    ("Q5_0", WeightType::Q5_0),
    ("Q5_1", WeightType::Q5_1),
    ("Q4_K", WeightType::Q4K),
    ("Q5_K", WeightType::Q5K),
    ("Q6_K", WeightType::Q6K),
];

/// One column decoded: an integer per weight, and per sub-block of `sub` a scale and a minimum
/// (None for the types without one). The weight is `scale · q + min`.
struct Col {
    q: Vec<i64>,
    sub: usize,
    scale: Vec<f32>,
    min: Option<Vec<f32>>,
}

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The bits of element `e` of a block, by the formats' definitions (ggml-common.h's structs).
fn decode(name: &str, raw: &[u8]) -> Col {
    let (elems, size) = block_of(name);
    let mut c = Col { q: vec![], sub: if name == "Q6_K" { 16 } else { 32 }, scale: vec![], min: None };
    let mut mins = vec![];
    for b in raw.chunks(size) {
        for e in 0..elems {
            let nib = |qs: &[u8], i: usize| ((qs[i % 16] >> (4 * (i / 16))) & 15) as i64;
            let q = match name {
                "Q8_0" => b[2 + e] as i8 as i64,
                "Q4_0" => nib(&b[2..], e) - 8,
                "Q4_1" => nib(&b[4..], e),
                "Q5_0" | "Q5_1" => {
                    let at = if name == "Q5_0" { 2 } else { 4 };
                    let qh = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
                    let u = nib(&b[at + 4..], e) | (((qh >> e) & 1) as i64) << 4;
                    if name == "Q5_0" {
                        u - 16
                    } else {
                        u
                    }
                }
                "Q4_K" | "Q5_K" => {
                    let qs = if name == "Q4_K" { &b[16..] } else { &b[48..] };
                    let (j, l) = (e / 32, e % 32);
                    let lo = ((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15) as i64;
                    lo + if name == "Q5_K" { (((b[16 + l] >> j) & 1) as i64) << 4 } else { 0 }
                }
                _ => {
                    let (half, w) = (e / 128, e % 128);
                    let lo = ((b[half * 64 + w % 64] >> (4 * (w / 64))) & 15) as i64;
                    let hi = ((b[128 + half * 32 + w % 32] >> (2 * (w / 32))) & 3) as i64;
                    (lo | hi << 4) - 32
                }
            };
            c.q.push(q);
        }
        match name {
            "Q8_0" | "Q5_0" | "Q4_0" => c.scale.push(h(b, 0)),
            "Q4_1" | "Q5_1" => {
                c.scale.push(h(b, 0));
                mins.push(h(b, 2));
            }
            "Q4_K" | "Q5_K" => {
                let s = &b[4..16];
                for j in 0..8 {
                    // 6-bit scale and min: the low 6 bits of bytes 0–7, or nibbles of 8–11 with
                    // the top two bits of 0–7.
                    let (sc, m) = if j < 4 {
                        (s[j] & 63, s[j + 4] & 63)
                    } else {
                        ((s[j + 4] & 15) | (s[j - 4] >> 6) << 4, (s[j + 4] >> 4) | (s[j] >> 6) << 4)
                    };
                    c.scale.push(h(b, 0) * sc as f32);
                    mins.push(-(h(b, 2) * m as f32));
                }
            }
            _ => (0..16).for_each(|s| c.scale.push(h(b, 208) * b[192 + s] as i8 as f32)),
        }
    }
    if !mins.is_empty() {
        c.min = Some(mins);
    }
    c
}

fn block_of(name: &str) -> (usize, usize) {
    TYPES.iter().find(|t| t.0 == name).unwrap().1.ggml_block().unwrap()
}

fn widened(c: &Col) -> Vec<f32> {
    (0..c.q.len())
        .map(|i| {
            let v = c.scale[i / c.sub] * c.q[i] as f32;
            c.min.as_ref().map_or(v, |m| v + m[i / c.sub])
        })
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn fixture() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/ggml_blocks.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn blocks_decode_as_gguf_py_reads_them() {
    let doc = fixture();
    for (name, ty) in TYPES {
        let case = &doc["blocks"][name];
        let raw = unhex(case["bytes"].as_str().unwrap());
        let want = floats(&unhex(case["values"].as_str().unwrap()));
        // This test's decoder, then kvgpt's, against gguf-py (== also lets 0 equal -0).
        assert_eq!(widened(&decode(name, &raw)), want, "{name}: the test's decoder against gguf-py");
        let mut got = vec![f32::NAN; want.len()];
        widen_blocks(ty, &raw, &mut got).unwrap();
        assert_eq!(got, want, "{name}: widen_blocks against gguf-py");
        // Held in a matrix: each block row is one column of the [K, N] matrix.
        let (elems, size) = ty.ggml_block().unwrap();
        let k = 2 * elems;
        let n = raw.len() / size / 2;
        let mut m = PackedMatrix::zeros(k, n, ty);
        for c in 0..n {
            m.set_col_blocks(c, &raw[c * 2 * size..(c + 1) * 2 * size]).unwrap();
        }
        for c in 0..n {
            assert_eq!(m.column(c), want[c * k..(c + 1) * k], "{name}: column {c} held");
        }
    }
}

#[test]
fn quantizing_gives_the_blocks_gguf_py_writes() {
    let doc = fixture();
    for (name, ty) in TYPES.into_iter().filter(|t| doc["quantized"].get(t.0).is_some()) {
        let case = &doc["quantized"][name];
        let (rows, k) = (case["rows"].as_u64().unwrap() as usize, case["k"].as_u64().unwrap() as usize);
        let w = floats(&unhex(case["weights"].as_str().unwrap())); // [rows][k]: one column per row
        let raw = unhex(case["bytes"].as_str().unwrap());
        let want = widened(&decode(name, &raw));
        // As a [K, N] matrix with N = rows: element (i, c) = w[c][i].
        let t: Vec<f32> = (0..k).flat_map(|i| (0..rows).map(move |c| (i, c))).map(|(i, c)| w[c * k + i]).collect();
        let m = PackedMatrix::pack(&t, k, rows, ty);
        for c in 0..rows {
            assert_eq!(bits(&m.column(c)), bits(&want[c * k..(c + 1) * k]), "{name}: column {c} quantized");
        }
        // As a GGUF row (what `kvgpt convert` writes): gguf-py's bytes, byte for byte.
        let mut out = vec![0u8; raw.len()];
        quantize_blocks(ty, &w, &mut out).unwrap();
        assert_eq!(out, raw, "{name}: quantize_blocks against gguf-py's bytes");
    }
}

/// Activations quantized as the int8 module defines it: per row and block of 32, `s = max|x| /
/// 127`, `round(x · (1/s))` half to even within ±127.
fn quantize_acts(x: &[f32]) -> (Vec<f32>, Vec<i64>) {
    let (mut s, mut q) = (vec![], vec![]);
    for blk in x.chunks(32) {
        let sc = blk.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
        s.push(sc);
        for &v in blk {
            q.push(if sc == 0.0 { 0 } else { (v * (1.0 / sc)).round_ties_even().clamp(-127.0, 127.0) as i64 });
        }
    }
    (s, q)
}

/// The integer matmul as its definition reads: per sub-block, `acc = fma(sa · scale, Σ qa · q,
/// acc)` and, with minimums, `acc = fma(sa · min, Σ qa, acc)`; then the bias.
fn reference(inp: &[f32], cols: &[Col], bias: &[f32], t: usize, k: usize) -> Vec<f32> {
    let n = cols.len();
    let mut out = vec![0.0f32; t * n];
    for r in 0..t {
        let (sa, qa) = quantize_acts(&inp[r * k..(r + 1) * k]);
        for (c, col) in cols.iter().enumerate() {
            let mut acc = 0.0f32;
            for s in 0..k / col.sub {
                let rows = s * col.sub..(s + 1) * col.sub;
                let isum: i64 = rows.clone().map(|i| qa[i] * col.q[i]).sum();
                let asum: i64 = rows.clone().map(|i| qa[i]).sum();
                let a = sa[s * col.sub / 32];
                acc = (a * col.scale[s]).mul_add(isum as f32, acc);
                if let Some(m) = &col.min {
                    acc = (a * m[s]).mul_add(asum as f32, acc);
                }
            }
            out[r * n + c] = acc + bias[c];
        }
    }
    out
}

#[test]
fn block_types_every_path_equal_their_definition() {
    let doc = fixture();
    for (name, ty) in TYPES {
        let pool = unhex(doc["blocks"][name]["bytes"].as_str().unwrap());
        let (elems, size) = ty.ggml_block().unwrap();
        for (t, blocks, n) in [(1, 1, 1), (1, 3, 17), (2, 2, 33), (5, 1, 64), (9, 3, 40), (13, 2, 16), (1, 12, 48)] {
            let k = blocks * elems;
            // Column c takes the pool's blocks from an offset of its own.
            let col_raw = |c: usize| -> Vec<u8> {
                (0..blocks).flat_map(|b| pool[((c * 5 + b) % 24) * size..][..size].to_vec()).collect()
            };
            let cols: Vec<Col> = (0..n).map(|c| decode(name, &col_raw(c))).collect();
            let mut m = PackedMatrix::zeros(k, n, ty);
            for c in 0..n {
                m.set_col_blocks(c, &col_raw(c)).unwrap();
            }
            let mut g = Gen((t * 1000 + k + n) as u64);
            let (mut inp, bias) = (g.vec(t * k), g.vec(n));
            inp[..32].fill(0.0); // an all-zero block
            inp[t * k / 2] = 7.0; // an outlier
            let want = reference(&inp, &cols, &bias, t, k);
            for isa in Isa::available() {
                for threads in [1, 2] {
                    let mut out = vec![f32::NAN; t * n];
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap()
                        .install(|| matmul_packed(isa, &mut out, &inp, &m, &bias, t, &mut QuantizedActs::default()));
                    assert_eq!(bits(&out), bits(&want), "{name} {} t={t} k={k} n={n} threads={threads}", isa.name());
                }
            }
            // One row alone gives its row of the batch.
            if t > 1 {
                let mut one = vec![0.0; n];
                matmul_packed(Isa::detect(), &mut one, &inp[k..2 * k], &m, &bias, 1, &mut QuantizedActs::default());
                assert_eq!(bits(&one), bits(&want[n..2 * n]), "{name} row 1 alone");
            }
        }
    }
}

#[test]
fn quantized_types_every_path_equal_their_definition_on_awkward_shapes() {
    // Weights quantized by kvgpt (the --dtype path), shapes whose K is not a whole block.
    for ty in WeightType::ALL.into_iter().filter(|t| t.is_integer()) {
        for (t, k, n) in [(1, 1, 1), (3, 7, 17), (1, 33, 48), (4, 64, 257), (7, 300, 16), (2, 96, 40), (1, 768, 2304)] {
            let mut g = Gen((t * 31 + k * 7 + n) as u64);
            let (inp, w, bias) = (g.vec(t * k), g.vec(k * n), g.vec(n));
            let m = PackedMatrix::pack(&w, k, n, ty);
            // Every ISA gives the scalar path's bits (the definition itself is checked above on
            // the same kernels); and the result is near the exact product with the held weights.
            let kp = k.div_ceil(32) * 32;
            let mut want = vec![0.0f32; t * n];
            let widened = m.unpack();
            let mut exact = vec![0.0f64; t * n];
            for r in 0..t {
                for c in 0..n {
                    exact[r * n + c] =
                        bias[c] as f64 + (0..k).map(|i| inp[r * k + i] as f64 * widened[i * n + c] as f64).sum::<f64>();
                }
            }
            for isa in Isa::available() {
                let mut out = vec![f32::NAN; t * n];
                matmul_packed(isa, &mut out, &inp, &m, &bias, t, &mut QuantizedActs::default());
                if isa == Isa::scalar() {
                    want = out.clone();
                }
                assert_eq!(bits(&out), bits(&want), "{ty:?} {} t={t} k={k} n={n}", isa.name());
            }
            // Near the product with the held weights: activations lose at most half a step.
            for (i, (&o, &e)) in want.iter().zip(&exact).enumerate() {
                let bound = 0.02 * (kp as f64).sqrt() * 2.0 + 1e-3;
                assert!((o as f64 - e).abs() <= bound, "{ty:?} t={t} k={k} n={n} [{i}]: {o} vs {e}");
            }
        }
    }
}

#[test]
fn blocks_no_ggml_quantizer_writes_are_refused() {
    // Q8_0 holding -128 (ggml rounds within ±127; AVX2's sign trick could not take it): widened
    // as ggml widens it, refused as held integers.
    let mut b = vec![0u8; 34];
    b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    b[9] = 0x80;
    let mut w = [1.0; 32];
    widen_blocks(WeightType::Q8_0, &b, &mut w).unwrap();
    assert!(w[7] == -64.0 && w.iter().enumerate().all(|(i, &x)| i == 7 || x == 0.0), "{w:?}");
    let mut m = PackedMatrix::zeros(32, 1, WeightType::Q8_0);
    assert!(m.set_col_blocks(0, &b).unwrap_err().contains("holds -128"));
    // A scale that is not a number, and blocks that do not make a column.
    let mut b = vec![0u8; 18];
    b[..2].copy_from_slice(&f16::INFINITY.to_le_bytes());
    let e = widen_blocks(WeightType::Q4_0, &b, &mut [0.0; 32]).unwrap_err();
    assert!(e.contains("scale is inf"), "{e}");
    let mut m = PackedMatrix::zeros(64, 1, WeightType::Q4_0);
    assert!(m.set_col_blocks(0, &[0u8; 18]).unwrap_err().contains("18 bytes of q4_0 blocks for a row of 64"));
}

/// K/V rows held as q8_0 are the blocks gguf-py's quantizer writes (the fixture's 64-value rows,
/// byte for byte); as f16 and bf16, the `half` crate's roundings to nearest even; and widening a
/// stored row gives its values exactly (`d · q`, the halves), so storing them again changes nothing.
#[test]
fn kv_rows_are_the_blocks_gguf_py_writes_and_half_s_halves() {
    use kvgpt_kernels::{kv_load, kv_store, KvType};
    let case = &fixture()["quantized"]["Q8_0"];
    let k = case["k"].as_u64().unwrap() as usize;
    let w = floats(&unhex(case["weights"].as_str().unwrap()));
    let raw = unhex(case["bytes"].as_str().unwrap());
    let per_row = KvType::Q8_0.row_bytes(k);
    assert_eq!((k, per_row, KvType::Q8_0.row_words(k)), (64, 68, 17));
    for (c, x) in w.chunks(k).enumerate() {
        let mut row = vec![0.0f32; KvType::Q8_0.row_words(k)];
        kv_store(KvType::Q8_0, &mut row, x);
        let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        assert_eq!(&bytes[..per_row], &raw[c * per_row..(c + 1) * per_row], "row {c} as q8_0");
        let mut wide = vec![0.0f32; k];
        kv_load(KvType::Q8_0, &mut wide, &row);
        let want: Vec<f32> =
            (0..k).map(|i| h(&bytes, i / 32 * 34) * bytes[i / 32 * 34 + 2 + i % 32] as i8 as f32).collect();
        assert_eq!(bits(&wide), bits(&want), "row {c} widened");
        let mut again = vec![0.0f32; row.len()];
        kv_store(KvType::Q8_0, &mut again, &wide);
        assert_eq!(bits(&again), bits(&row), "row {c}: storing the widened values again");
    }
    let mut g = Gen(5);
    let mut x = g.vec(37);
    x.extend([0.0, -0.0, 1e-8, 65504.0, 70000.0, -3.0e38, 1.5e-5]);
    for (ty, conv) in [
        (KvType::F16, (|v: f32| f16::from_f32(v).to_f32()) as fn(f32) -> f32),
        (KvType::Bf16, |v: f32| half::bf16::from_f32(v).to_f32()),
    ] {
        let mut row = vec![0.0f32; ty.row_words(x.len())];
        kv_store(ty, &mut row, &x);
        let mut wide = vec![0.0f32; x.len()];
        kv_load(ty, &mut wide, &row);
        let want: Vec<f32> = x.iter().map(|&v| conv(v)).collect();
        assert_eq!(bits(&wide), bits(&want), "{}", ty.name());
        let mut again = vec![0.0f32; row.len()];
        kv_store(ty, &mut again, &wide);
        assert_eq!(bits(&again), bits(&row), "{}: storing the widened values again", ty.name());
    }
}
