//! The forward pass: one sequence or many side by side, through every block, into logits. It
//! reads top to bottom; the bookkeeping of a batch (checks, embedding rows, per-sequence
//! attention, the rows whose logits are wanted) lives in the named helpers below it.

use super::gpt2::Model;
use super::rows::{Rows, Scratch};
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::tap::{NoTap, Point, Tap};
use kvgpt_kernels::{self as k, AttnDims};

impl Model {
    /// [`Model::forward`] with nothing observed, for inputs of any length: runs them in chunks of
    /// at most `scratch.rows()` tokens (the last one also holds the R logits rows), so the
    /// activations never outgrow the scratch. The same bits as one call, since no row's arithmetic
    /// depends on how many rows share the call (tests/reference.rs checks it).
    pub fn run(&self, ids: &[u32], cache: &mut KvCache, scratch: &mut Scratch, logits: &mut [f32]) -> Result<()> {
        let r = logits.len() / self.config.vocab_size;
        cache.check_room(ids.len())?; // the whole input fits before any of it runs
        let chunk = scratch.rows().max(1);
        let mut done = 0;
        while ids.len() - done > chunk && ids.len() - done - chunk >= r {
            self.forward(&ids[done..done + chunk], cache, scratch, &mut NoTap, &mut [])?;
            done += chunk;
        }
        self.forward(&ids[done..], cache, scratch, &mut NoTap, logits)
    }

    /// The forward pass over `ids` at positions `cache.len()..cache.len()+T`.
    ///
    /// Prefill calls it with the prompt (T > 1), decode with one token, the uncached mode with the
    /// whole sequence and an empty cache: the same code. K and V of the new tokens are written into
    /// the cache; `logits` (`[R, V]`, 0 ≤ R ≤ T) receives the logits of the last R tokens (none
    /// for R = 0, which skips the vocabulary projection). The scratch grows to T rows.
    pub fn forward(
        &self,
        ids: &[u32],
        cache: &mut KvCache,
        scratch: &mut Scratch,
        tap: &mut dyn Tap,
        logits: &mut [f32],
    ) -> Result<()> {
        self.forward_rows(&mut [Rows { ids, cache, logits }], scratch, tap)
    }

    /// One forward pass over the rows of many sequences at once: their rows sit side by side in
    /// every matmul (each weight is read once for all of them), while K/V are written and
    /// attention is computed per sequence. A sequence whose `ids` are empty sits the call out.
    ///
    /// No row's arithmetic reads another row, so every sequence gets the same bits as if it ran
    /// alone ([`Model::forward`]), whatever else shares the call. Nothing is computed unless
    /// every sequence's input is valid and fits its cache.
    pub fn forward_batch(&self, batch: &mut [Rows<'_>], scratch: &mut Scratch) -> Result<()> {
        self.forward_rows(batch, scratch, &mut NoTap)
    }

    /// The one forward pass behind [`Model::forward`] and [`Model::forward_batch`]. A tap that
    /// wants [`Point::LnF`] is only given with a single sequence.
    fn forward_rows(&self, batch: &mut [Rows<'_>], scratch: &mut Scratch, tap: &mut dyn Tap) -> Result<()> {
        let cfg = &self.config;
        let (c, f, v) = (cfg.n_embd, cfg.n_inner, cfg.vocab_size);
        let (isa, eps) = (self.isa, cfg.layer_norm_epsilon);
        let (t, r) = self.check_batch(batch)?; //                              T = Σ Tᵢ, R = Σ Rᵢ
        let lnf_all = tap.wants(Point::LnF);
        debug_assert!(!lnf_all || batch.len() == 1, "taps observe one sequence");
        tap.begin(batch[0].cache.len(), t);
        scratch.ensure(cfg, t);
        let Scratch { x, xn, qkv, att, proj, fc, scores, probs, logits, acts, .. } = scratch;
        let (x, xn, qkv) = (&mut x[..t * c], &mut xn[..t * c], &mut qkv[..t * 3 * c]);
        let (att, proj, fc) = (&mut att[..t * c], &mut proj[..t * c], &mut fc[..t * f]);

        // Token plus position embeddings.                                          x: [T, C]
        self.embed(x, batch);
        report(tap, Point::Embed, &[t, c], x);

        for (l, blk) in self.h.iter().enumerate() {
            // Attention: x += c_proj(softmax(q kᵀ / √HS, causal) v), q k v from c_attn(ln_1(x)).
            blk.ln_1.forward(isa, xn, x, t, eps); //                                  [T, C]
            report(tap, Point::Ln1(l), &[t, c], xn);
            blk.c_attn.forward(isa, qkv, xn, t, acts); //                            [T, 3C]
            report(tap, Point::CAttn(l), &[t, 3 * c], qkv);
            let work = Work { scores: &mut scores[..], probs: &mut *probs, tap: &mut *tap };
            self.attend(l, att, qkv, batch, work); //                                 [T, C]
            blk.attn_c_proj.forward(isa, proj, att, t, acts); //                      [T, C]
            report(tap, Point::AttnProj(l), &[t, c], proj);
            k::add_inplace(x, proj);

            // MLP: x += c_proj(gelu_new(c_fc(ln_2(x)))).
            blk.ln_2.forward(isa, xn, x, t, eps); //                                  [T, C]
            report(tap, Point::Ln2(l), &[t, c], xn);
            blk.c_fc.forward(isa, fc, xn, t, acts); //                                [T, F]
            k::gelu_new(isa, fc);
            report(tap, Point::MlpAct(l), &[t, f], fc);
            blk.mlp_c_proj.forward(isa, proj, fc, t, acts); //                        [T, C]
            report(tap, Point::MlpProj(l), &[t, c], proj);
            k::add_inplace(x, proj);
            report(tap, Point::Block(l), &[t, c], x);
        }

        // Final LayerNorm of the rows whose logits are wanted (all with ln_f tapped).  [S, C]
        let sel = self.final_norm(xn, x, batch, lnf_all);
        report(tap, Point::LnF, &[sel, c], &xn[..sel * c]);
        // The tied vocabulary projection of the last R of them.                       [R, V]
        self.project(batch, &xn[(sel - r) * c..sel * c], r, logits, acts);
        if let ([one], true) = (&*batch, r > 0) {
            report(tap, Point::Logits, &[r, v], one.logits);
        }
        check_finite(batch, v)?;
        for s in batch.iter_mut() {
            s.cache.advance(s.ids.len());
        }
        Ok(())
    }

    /// Checks every sequence before any work (logits rows, ids, room) and reserves the K/V
    /// blocks its rows will fill; returns `(T, R)`.
    fn check_batch(&self, batch: &mut [Rows<'_>]) -> Result<(usize, usize)> {
        let v = self.config.vocab_size;
        let (mut t, mut r) = (0, 0);
        for s in batch.iter() {
            let (ti, ri) = (s.ids.len(), s.logits.len() / v);
            if ri > ti || s.logits.len() != ri * v {
                return Err(Error::Invalid(format!(
                    "forward needs logits for 0..={ti} rows of {v} (got {} floats)",
                    s.logits.len()
                )));
            }
            if let Some(&id) = s.ids.iter().find(|&&id| id as usize >= v) {
                return Err(Error::BadTokenId { id, vocab: v });
            }
            (t, r) = (t + ti, r + ri);
        }
        for s in batch.iter_mut() {
            s.cache.reserve(s.ids.len())?;
        }
        if t == 0 {
            return Err(Error::Invalid("forward needs at least one token".into()));
        }
        Ok((t, r))
    }

    /// `x[T, C]`: each token's embedding plus its position's, sequence after sequence.
    fn embed(&self, x: &mut [f32], batch: &[Rows<'_>]) {
        let c = self.config.n_embd;
        let mut rows = x.chunks_exact_mut(c);
        for s in batch {
            for (i, &id) in s.ids.iter().enumerate() {
                let xr = rows.next().expect("T rows");
                self.wte.column_into(id as usize, xr);
                for (xo, e) in xr.iter_mut().zip(&self.wpe[(s.cache.len() + i) * c..][..c]) {
                    *xo += e;
                }
            }
        }
    }

    /// Attention of layer `l`, each sequence over its own cache: writes its K/V at positions
    /// `P..P+Tᵢ`, then `att` rows `row..row+Tᵢ` from its queries.
    fn attend(&self, l: usize, att: &mut [f32], qkv: &[f32], batch: &mut [Rows<'_>], w: Work<'_>) {
        let cfg = &self.config;
        let (c, nh, hs) = (cfg.n_embd, cfg.n_head, cfg.head_dim());
        let Work { scores, probs, tap } = w;
        let want_probs = tap.wants(Point::AttnProbs(l));
        let mut row = 0;
        for s in batch.iter_mut().filter(|s| !s.ids.is_empty()) {
            let (ti, p) = (s.ids.len(), s.cache.len());
            let q = &qkv[row * 3 * c..(row + ti) * 3 * c];
            s.cache.write(l, q, ti);
            if want_probs {
                probs.resize(nh * ti * (p + ti), 0.0);
            }
            let dims = AttnDims { t: ti, p, nh, hs, t_max: s.cache.capacity(), scale: cfg.attn_scale(l) };
            let kv = s.cache.layer(l);
            if tap.wants(Point::AttnScores(l)) {
                let mut sc = vec![0.0; nh * ti * (p + ti)]; // views only: allocates
                k::attention_scores_blocks(self.isa, &mut sc, q, 3 * c, &kv, dims);
                tap.record(Point::AttnScores(l), &[nh, ti, p + ti], &sc);
            }
            let out = &mut att[row * c..(row + ti) * c];
            let wanted = want_probs.then_some(&mut probs[..]);
            k::attention_blocks(self.isa, out, wanted, q, 3 * c, &kv, scores, dims);
            if want_probs {
                tap.record(Point::AttnProbs(l), &[nh, ti, p + ti], probs);
            }
            row += ti;
        }
    }

    /// `ln_f` of the last Rᵢ rows of each sequence (all of its rows with `all`), gathered into
    /// the first rows of `xn`; returns how many rows it wrote.
    fn final_norm(&self, xn: &mut [f32], x: &[f32], batch: &[Rows<'_>], all: bool) -> usize {
        let cfg = &self.config;
        let (c, v) = (cfg.n_embd, cfg.vocab_size);
        let (mut row, mut sel) = (0, 0);
        for s in batch {
            let (ti, ri) = (s.ids.len(), s.logits.len() / v);
            let first = if all { 0 } else { ti - ri };
            let (src, n) = (&x[(row + first) * c..(row + ti) * c], ti - first);
            self.ln_f.forward(self.isa, &mut xn[sel * c..(sel + n) * c], src, n, cfg.layer_norm_epsilon);
            (row, sel) = (row + ti, sel + n);
        }
        sel
    }

    /// The tied vocabulary projection of `xn` (`[R, C]`) into each sequence's logits: straight
    /// into them when one sequence wants logits, else through `batch_logits` (grown to the
    /// largest batch, then kept).
    fn project(
        &self,
        batch: &mut [Rows<'_>],
        xn: &[f32],
        r: usize,
        batch_logits: &mut Vec<f32>,
        acts: &mut k::QuantizedActs,
    ) {
        let v = self.config.vocab_size;
        let mut wanting = batch.iter_mut().filter(|s| !s.logits.is_empty());
        match (wanting.next(), wanting.next()) {
            (None, _) => {}
            (Some(one), None) => k::matmul_packed(self.isa, one.logits, xn, &self.wte, &self.no_bias, r, acts),
            _ => {
                if batch_logits.len() < r * v {
                    batch_logits.resize(r * v, 0.0);
                }
                let all = &mut batch_logits[..r * v];
                k::matmul_packed(self.isa, all, xn, &self.wte, &self.no_bias, r, acts);
                let mut done = 0;
                for s in batch.iter_mut() {
                    let n = s.logits.len();
                    s.logits.copy_from_slice(&all[done..done + n]);
                    done += n;
                }
            }
        }
    }
}

/// The per-call work space that attention uses besides the activations.
struct Work<'a> {
    scores: &'a mut [f32],
    probs: &'a mut Vec<f32>,
    tap: &'a mut dyn Tap,
}

/// Finite weights can still overflow f32 on some input; garbage logits are an error.
fn check_finite(batch: &[Rows<'_>], v: usize) -> Result<()> {
    for s in batch {
        if let Some(i) = s.logits.iter().position(|x| !x.is_finite()) {
            let (ti, ri) = (s.ids.len(), s.logits.len() / v);
            let position = s.cache.len() + ti - ri + i / v;
            return Err(Error::NonFiniteLogits { position, value: s.logits[i] });
        }
    }
    Ok(())
}

/// Reports `data` at `point` if the tap wants it.
fn report(tap: &mut dyn Tap, point: Point, shape: &[usize], data: &[f32]) {
    if tap.wants(point) {
        tap.record(point, shape, data);
    }
}
