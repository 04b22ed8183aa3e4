//! Attention on every compiled path against the scalar reference (bit for bit) and a naive f64
//! computation: the weighted sums, the weights, the scores before the softmax that the views show,
//! and a query alone over the cache (decode) against its row in the full call.

use kvgpt_kernels::*;

mod common;
use common::{bits, close, Gen};

#[test]
fn attention_every_path_and_cached_equals_full() {
    // Head sizes: 17 (no SIMD shortcut), 16 (four-key scores), 64 (GPT-2: register-held sums).
    for (nh, hs, t_max) in [(3usize, 17usize, 40usize), (2, 16, 40), (3, 64, 40)] {
        attention_case(nh, hs, t_max);
    }
}

fn attention_case(nh: usize, hs: usize, t_max: usize) {
    let c = nh * hs;
    for &total in &[1usize, 2, 3, 5, 7, 33] {
        let mut g = Gen(total as u64 + 100);
        let q = g.vec(total * 3 * c); // rows laid out like c_attn's [q | k | v]
        let k_cache = g.vec(nh * t_max * hs);
        let v_cache = g.vec(nh * t_max * hs);
        let scale = 1.0 / (hs as f32).sqrt();
        let dims = |t, p| AttnDims { t, p, nh, hs, t_max, scale };
        // Naive reference.
        let mut want = vec![0.0f64; total * c];
        let mut want_probs = vec![0.0f64; nh * total * total];
        let mut want_scores = vec![f64::NEG_INFINITY; nh * total * total];
        for h in 0..nh {
            for i in 0..total {
                let qi = &q[i * 3 * c + h * hs..][..hs];
                let s: Vec<f64> = (0..=i)
                    .map(|j| {
                        let kj = &k_cache[(h * t_max + j) * hs..][..hs];
                        qi.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for j in 0..=i {
                    want_scores[(h * total + i) * total + j] = s[j];
                    want_probs[(h * total + i) * total + j] = e[j] / z;
                    for d in 0..hs {
                        want[i * c + h * hs + d] += e[j] / z * v_cache[(h * t_max + j) * hs + d] as f64;
                    }
                }
            }
        }
        let mut scratch = vec![0.0; 2 * nh * t_max];
        let mut reference = vec![0.0; total * c];
        attention(Isa::scalar(), &mut reference, None, &q, 3 * c, &k_cache, &v_cache, &mut scratch, dims(total, 0));
        for isa in Isa::available() {
            let mut out = vec![0.0; total * c];
            let mut probs = vec![f32::NAN; nh * total * total];
            attention(isa, &mut out, Some(&mut probs), &q, 3 * c, &k_cache, &v_cache, &mut scratch, dims(total, 0));
            assert_eq!(bits(&out), bits(&reference), "attention {} T={total}", isa.name());
            close(&out, &want, 1e-5, "attention out");
            close(&probs, &want_probs, 1e-6, "attention probs");
            // The scores a view shows: −∞ where masked, and softmax of a row is the weights used.
            let mut sc = vec![f32::NAN; nh * total * total];
            attention_scores(isa, &mut sc, &q, 3 * c, &k_cache, dims(total, 0));
            let sc_full = sc.clone();
            for (i, (g, w)) in sc.iter().zip(&want_scores).enumerate() {
                let ok = if w.is_finite() {
                    (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs())
                } else {
                    *g == f32::NEG_INFINITY
                };
                assert!(ok, "attention scores {} [{i}]: {g} vs {w}", isa.name());
            }
            for (row, prow) in sc.chunks_mut(total).zip(probs.chunks(total)) {
                let n = row.iter().filter(|x| x.is_finite()).count();
                softmax_inplace(isa, &mut row[..n]);
                assert_eq!(bits(&row[..n]), bits(&prow[..n]), "softmax(scores) {} is the weights", isa.name());
            }
            // A query alone over the cache (decode) gives the same bits as its row in the full
            // call, whether that row was the first or the second of a pair there, or alone.
            for p in [0, 1, total / 2, total.saturating_sub(2), total - 1].into_iter().filter(|&p| p < total) {
                let mut one = vec![0.0; c];
                attention(isa, &mut one, None, &q[p * 3 * c..], 3 * c, &k_cache, &v_cache, &mut scratch, dims(1, p));
                assert_eq!(bits(&one), bits(&reference[p * c..(p + 1) * c]), "decode row {p} {}", isa.name());
                // Its scores over the cache, and a chunk of two queries after p cached positions,
                // are the rows of the full call's.
                let t = (total - p).min(2);
                let mut sc = vec![f32::NAN; nh * t * (p + t)];
                attention_scores(isa, &mut sc, &q[p * 3 * c..], 3 * c, &k_cache, dims(t, p));
                for h in 0..nh {
                    for i in 0..t {
                        let got = &sc[(h * t + i) * (p + t)..(h * t + i + 1) * (p + t)];
                        let full = &sc_full[(h * total + p + i) * total..][..p + t];
                        assert_eq!(bits(got), bits(full), "scores of query {} after {p} cached, {}", p + i, isa.name());
                    }
                }
            }
        }
    }
}

/// K/V in blocks of `b` positions at shuffled places in one buffer, held as `ty`: physical block
/// `table[j]` holds logical block `j` as `[K, V][NH][b][W]` words.
struct Paged {
    data: Vec<f32>,
    table: Vec<usize>,
    b: usize,
    nh: usize,
    w: usize,
    ty: KvType,
}

impl Paged {
    /// The contiguous `[NH, t_max, HS]` K and V, stored into blocks of `b` placed by `seed`.
    fn of(k: &[f32], v: &[f32], (nh, hs, t_max): (usize, usize, usize), b: usize, ty: KvType, seed: u64) -> Paged {
        let (n, w) = (t_max.div_ceil(b), ty.row_words(hs));
        let mut table: Vec<usize> = (0..n).collect();
        let mut g = Gen(seed);
        for i in (1..n).rev() {
            table.swap(i, ((g.next() + 1.0) / 2.0 * (i + 1) as f32) as usize % (i + 1));
        }
        let mut data = vec![f32::NAN; n * 2 * nh * b * w]; // unfilled rows are NaN
        for (j, &phys) in table.iter().enumerate() {
            for (part, src) in [k, v].into_iter().enumerate() {
                for h in 0..nh {
                    for r in 0..b.min(t_max - j * b) {
                        let dst = (((phys * 2 + part) * nh + h) * b + r) * w;
                        kv_store(ty, &mut data[dst..dst + w], &src[(h * t_max + j * b + r) * hs..][..hs]);
                    }
                }
            }
        }
        Paged { data, table, b, nh, w, ty }
    }

    fn rows(&self, j: usize, part: usize, h: usize) -> &[f32] {
        let n = self.b * self.w;
        &self.data[((self.table[j] * 2 + part) * self.nh + h) * n..][..n]
    }
}

impl KvBlocks for Paged {
    fn block(&self) -> usize {
        self.b
    }
    fn k(&self, j: usize, h: usize) -> &[f32] {
        self.rows(j, 0, h)
    }
    fn v(&self, j: usize, h: usize) -> &[f32] {
        self.rows(j, 1, h)
    }
    fn kv_type(&self) -> KvType {
        self.ty
    }
}

/// Each row of `x` (`[rows, HS]`) stored as `ty` and widened back: the values attention reads.
fn as_stored(ty: KvType, x: &[f32], hs: usize) -> Vec<f32> {
    let mut row = vec![0.0; ty.row_words(hs)];
    let mut out = vec![0.0; x.len()];
    for (o, r) in out.chunks_mut(hs).zip(x.chunks(hs)) {
        kv_store(ty, &mut row, r);
        kv_load(ty, o, &row);
    }
    out
}

/// Attention over K/V held as f16, bf16 or q8_0, in blocks anywhere, on every path: the bits of
/// the contiguous f32 attention over the stored values widened (widening is exact, the chains
/// are the same), for a prompt, a chunk after cached positions and a decode step.
#[test]
fn attention_over_typed_kv_is_the_f32_bits_of_the_stored_values_on_every_path() {
    for (nh, hs, t_max) in [(2usize, 32usize, 40usize), (3, 64, 40), (2, 16, 40), (2, 17, 40)] {
        let c = nh * hs;
        let mut g = Gen(11 + hs as u64);
        let (k, v) = (g.vec(nh * t_max * hs), g.vec(nh * t_max * hs));
        let q = g.vec(t_max * 3 * c);
        let scale = 1.0 / (hs as f32).sqrt();
        let mut scratch = vec![0.0; 2 * nh * t_max];
        let mut tiles = vec![0.0; ATTENTION_TILE * nh * t_max];
        for ty in [KvType::F16, KvType::Bf16, KvType::Q8_0] {
            let (kw, vw) = (as_stored(ty, &k, hs), as_stored(ty, &v, hs));
            for b in [1, 3, 16, t_max] {
                let paged = Paged::of(&k, &v, (nh, hs, t_max), b, ty, b as u64);
                for isa in Isa::available() {
                    for (t, p) in [(33, 0), (5, 7), (1, 16), (1, 39), (20, 11), (19, 0)] {
                        let d = AttnDims { t, p, nh, hs, t_max, scale };
                        let qs = &q[p * 3 * c..];
                        let (mut want, mut got) = (vec![0.0; t * c], vec![0.0; t * c]);
                        attention(Isa::scalar(), &mut want, None, qs, 3 * c, &kw, &vw, &mut scratch, d);
                        attention_blocks(isa, &mut got, None, qs, 3 * c, &paged, &mut tiles, d);
                        let what = format!("{} {} B={b} HS={hs} T={t} P={p}", ty.name(), isa.name());
                        assert_eq!(bits(&got), bits(&want), "outputs, {what}");
                        let (mut want_s, mut got_s) = (vec![0.0; nh * t * (p + t)], vec![0.0; nh * t * (p + t)]);
                        attention_scores(Isa::scalar(), &mut want_s, qs, 3 * c, &kw, d);
                        attention_scores_blocks(isa, &mut got_s, qs, 3 * c, &paged, d);
                        assert_eq!(bits(&got_s), bits(&want_s), "scores, {what}");
                    }
                }
            }
        }
    }
}

/// Attention over blocks — of 1, 2, 3, 16 positions and the whole context, placed anywhere — is
/// the contiguous cache's, bit for bit, on every path: outputs, weights and scores, for a whole
/// prompt, a chunk after cached positions, and a decode step.
#[test]
fn attention_over_blocks_is_the_contiguous_bits_whatever_the_block_size_and_placement() {
    for (nh, hs, t_max) in [(3usize, 17usize, 40usize), (2, 16, 40), (3, 64, 40)] {
        let c = nh * hs;
        let mut g = Gen(7 + hs as u64);
        let (k, v) = (g.vec(nh * t_max * hs), g.vec(nh * t_max * hs));
        let q = g.vec(t_max * 3 * c);
        let scale = 1.0 / (hs as f32).sqrt();
        let mut scratch = vec![0.0; 2 * nh * t_max];
        // Enough scratch for tiles of ATTENTION_TILE queries: the same bits as in pairs.
        let mut tiles = vec![0.0; ATTENTION_TILE * nh * t_max];
        for b in [1, 2, 3, 16, t_max] {
            let paged = Paged::of(&k, &v, (nh, hs, t_max), b, KvType::F32, b as u64);
            for isa in Isa::available() {
                // (19, 0) and (35, 2) end in a tile of three: a pair, then a lone query.
                for (t, p) in [(33, 0), (5, 7), (2, 15), (1, 16), (1, 31), (7, 33), (17, 3), (40, 0), (19, 0), (35, 2)]
                {
                    let d = AttnDims { t, p, nh, hs, t_max, scale };
                    let qs = &q[p * 3 * c..];
                    let (mut want, mut got) = (vec![0.0; t * c], vec![0.0; t * c]);
                    let (mut want_p, mut got_p) = (vec![0.0; nh * t * (p + t)], vec![0.0; nh * t * (p + t)]);
                    attention(isa, &mut want, Some(&mut want_p), qs, 3 * c, &k, &v, &mut scratch, d);
                    attention_blocks(isa, &mut got, Some(&mut got_p), qs, 3 * c, &paged, &mut tiles, d);
                    let what = format!("{} B={b} HS={hs} T={t} P={p}", isa.name());
                    // The tiles against the scalar reference as well as against this ISA's pairs.
                    let mut reference = vec![0.0; t * c];
                    attention(Isa::scalar(), &mut reference, None, qs, 3 * c, &k, &v, &mut scratch, d);
                    assert_eq!(bits(&got), bits(&reference), "outputs against the scalar reference, {what}");
                    assert_eq!(bits(&got), bits(&want), "outputs, {what}");
                    assert_eq!(bits(&got_p), bits(&want_p), "weights, {what}");
                    let (mut want_s, mut got_s) = (vec![0.0; nh * t * (p + t)], vec![0.0; nh * t * (p + t)]);
                    attention_scores(isa, &mut want_s, qs, 3 * c, &k, d);
                    attention_scores_blocks(isa, &mut got_s, qs, 3 * c, &paged, d);
                    assert_eq!(bits(&got_s), bits(&want_s), "scores, {what}");
                }
            }
        }
    }
}
