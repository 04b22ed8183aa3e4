//! The model: GPT-2 weights named as in the checkpoint (`wte`, `wpe`, `h[i].ln_1`, `c_attn`,
//! `c_proj`, `ln_2`, `c_fc`, `ln_f`) and one forward pass for every use.
//!
//! Dimensions: `T` tokens in this call, `P` tokens already cached, `C` channels, `NH` heads,
//! `HS` head size, `F` MLP width, `V` vocabulary, `R` rows whose logits are wanted.

use crate::checkpoint::Weights;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::tap::{NoTap, Point, Tap};
use kvgpt_kernels::{self as k, AttnDims, Isa, PackedMatrix, WeightType, Q8_BLOCK};
use rayon::prelude::*;
use std::path::Path;

pub struct LayerNorm {
    pub weight: Vec<f32>, // [C]
    pub bias: Vec<f32>,   // [C]
}

/// GPT-2's Conv1D: `y = x @ weight + bias`, weight `[in, out]` packed into column panels.
pub struct Conv1D {
    pub weight: PackedMatrix, // [n_in, n_out]
    pub bias: Vec<f32>,       // [n_out]
}

pub struct Block {
    pub ln_1: LayerNorm,
    pub c_attn: Conv1D,      // [C, 3C]
    pub attn_c_proj: Conv1D, // [C, C]
    pub ln_2: LayerNorm,
    pub c_fc: Conv1D,       // [C, F]
    pub mlp_c_proj: Conv1D, // [F, C]
}

/// An immutable GPT-2. All state of a run lives in the [`KvCache`] and the [`Scratch`].
pub struct Model {
    pub config: Config,
    /// The token embedding `[V, C]`, held transposed as `[C, V]` panels: the tied vocabulary
    /// projection `x @ wteᵀ` then streams it like any other weight, and a token's embedding is
    /// column `id`.
    pub wte: PackedMatrix, // [C, V]
    pub wpe: Vec<f32>, // [n_positions, C]
    /// The vocabulary projection's bias: none (zeros, added exactly).
    no_bias: Vec<f32>, // [V]
    pub h: Vec<Block>,
    pub ln_f: LayerNorm,
    /// The dtype the weights were stored in, in the file.
    pub stored_dtype: String,
    /// How the matrices are held for computation (accumulation is always f32).
    pub dtype: WeightType,
    isa: Isa,
}

/// Tokens per chunk of a long prefill (the scratch's rows in generate, bench and verify). At
/// DistilGPT-2's size the activations of a 512-token prompt then take 8.7 MB instead of 17 MB
/// (peak RSS with int8 weights 157 -> 148 MB); 128-token chunks saved 4 MB more but re-read all
/// weights from memory per chunk, and measured slower at pp512.
pub const CHUNK_ROWS: usize = 256;

/// One sequence's part of a forward call: the tokens it feeds at positions `cache.len()..`, its
/// cache, and `[R, V]` for the logits of its last R rows (empty: none).
pub struct Rows<'a> {
    pub ids: &'a [u32],
    pub cache: &'a mut KvCache,
    pub logits: &'a mut [f32],
}

/// Something that takes part in [`Model::forward_batch`]: it lends its rows for one call.
pub trait Batched {
    fn rows(&mut self) -> Rows<'_>;
}

impl Batched for Rows<'_> {
    fn rows(&mut self) -> Rows<'_> {
        Rows { ids: self.ids, cache: &mut *self.cache, logits: &mut *self.logits }
    }
}

/// Work buffers of the forward pass, sized for the largest `T` seen and then reused: decoding
/// allocates nothing.
pub struct Scratch {
    rows: usize,
    x: Vec<f32>,            // [T, C] the residual stream
    xn: Vec<f32>,           // [T, C] LayerNorm output
    qkv: Vec<f32>,          // [T, 3C]
    att: Vec<f32>,          // [T, C] attention output (heads side by side)
    proj: Vec<f32>,         // [T, C] c_proj outputs
    fc: Vec<f32>,           // [T, F]
    scores: Vec<f32>,       // [NH, 2, n_positions] two score rows per head
    probs: Vec<f32>,        // [NH, T, P+T] only when a tap asks for attention weights
    logits: Vec<f32>,       // [R, V] of a batch whose logits go to several sequences
    acts: k::QuantizedActs, // [T, K] int8 activations of the matmul at hand (W8A8 only)
}

impl Scratch {
    /// Buffers for calls of up to `rows` tokens: [`Model::run`] splits longer inputs into chunks
    /// of `rows`; [`Model::forward`] grows the buffers on demand.
    pub fn new(cfg: &Config, rows: usize) -> Scratch {
        let mut s = Scratch {
            rows: 0,
            x: vec![],
            xn: vec![],
            qkv: vec![],
            att: vec![],
            proj: vec![],
            fc: vec![],
            scores: vec![0.0; 2 * cfg.n_head * cfg.n_positions],
            probs: vec![],
            logits: vec![],
            acts: k::QuantizedActs::default(),
        };
        s.ensure(cfg, rows);
        s
    }

    /// Tokens the buffers hold activations for.
    pub fn rows(&self) -> usize {
        self.rows
    }

    fn ensure(&mut self, cfg: &Config, rows: usize) {
        if rows <= self.rows {
            return;
        }
        let c = cfg.n_embd;
        self.x.resize(rows * c, 0.0);
        self.xn.resize(rows * c, 0.0);
        self.qkv.resize(rows * 3 * c, 0.0);
        self.att.resize(rows * c, 0.0);
        self.proj.resize(rows * c, 0.0);
        self.fc.resize(rows * cfg.n_inner, 0.0);
        self.rows = rows;
    }
}

impl Conv1D {
    fn load(ck: &Weights, name: &str, n_in: usize, n_out: usize, dtype: WeightType) -> Result<Conv1D> {
        // Streamed row by row into the panels: the f32 matrix never exists whole.
        let mut weight = PackedMatrix::zeros(n_in, n_out, dtype);
        ck.tensor_rows(&format!("{name}.weight"), &[n_in, n_out], |i, row| weight.set_row(i, row))?;
        Ok(Conv1D { weight, bias: ck.tensor(&format!("{name}.bias"), &[n_out])? })
    }

    /// `out[T, n_out] = inp[T, n_in] @ weight + bias`.
    fn forward(&self, isa: Isa, out: &mut [f32], inp: &[f32], t: usize, acts: &mut k::QuantizedActs) {
        k::matmul_packed(isa, out, inp, &self.weight, &self.bias, t, acts);
    }
}

impl LayerNorm {
    fn load(ck: &Weights, name: &str, c: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: ck.tensor(&format!("{name}.weight"), &[c])?,
            bias: ck.tensor(&format!("{name}.bias"), &[c])?,
        })
    }

    /// `out[T, C] = layernorm(inp[T, C])`.
    fn forward(&self, isa: Isa, out: &mut [f32], inp: &[f32], t: usize, eps: f32) {
        k::layernorm(isa, out, inp, &self.weight, &self.bias, t, self.weight.len(), eps);
    }
}

/// Reports `data` at `point` if the tap wants it.
fn report(tap: &mut dyn Tap, point: Point, shape: &[usize], data: &[f32]) {
    if tap.wants(point) {
        tap.record(point, shape, data);
    }
}

impl Model {
    /// Loads `config.json` and `model.safetensors`, holding the weights in f32.
    pub fn load(config_path: &Path, weights_path: &Path) -> Result<Model> {
        Model::load_as(config_path, weights_path, WeightType::F32)
    }

    /// Loads the model holding its matrices as `dtype` (converted or quantized at load time;
    /// LayerNorms, biases and `wpe` stay f32).
    pub fn load_as(config_path: &Path, weights_path: &Path, dtype: WeightType) -> Result<Model> {
        let (config, ck) = Weights::open(config_path, weights_path)?;
        let (c, f) = (config.n_embd, config.n_inner);
        let v = config.vocab_size;
        // wte (the largest tensor) on one worker while the blocks load on the others.
        let (wte, h) = rayon::join(
            || -> Result<_> {
                // Streamed in blocks of Q8_BLOCK rows (columns of wteᵀ), each converted into its
                // dtype, so it never sits in memory as f32 whole.
                let mut wte = PackedMatrix::zeros(c, v, dtype);
                let mut block = Vec::with_capacity(Q8_BLOCK * c);
                let stored = ck.tensor_rows("wte.weight", &[v, c], |r, row| {
                    block.extend_from_slice(row);
                    if block.len() == Q8_BLOCK * c || r + 1 == v {
                        wte.set_cols(r + 1 - block.len() / c, &block);
                        block.clear();
                    }
                })?;
                Ok((wte, stored))
            },
            || {
                (0..config.n_layer)
                    .into_par_iter()
                    .map(|i| {
                        let p = format!("h.{i}");
                        Ok(Block {
                            ln_1: LayerNorm::load(&ck, &format!("{p}.ln_1"), c)?,
                            c_attn: Conv1D::load(&ck, &format!("{p}.attn.c_attn"), c, 3 * c, dtype)?,
                            attn_c_proj: Conv1D::load(&ck, &format!("{p}.attn.c_proj"), c, c, dtype)?,
                            ln_2: LayerNorm::load(&ck, &format!("{p}.ln_2"), c)?,
                            c_fc: Conv1D::load(&ck, &format!("{p}.mlp.c_fc"), c, f, dtype)?,
                            mlp_c_proj: Conv1D::load(&ck, &format!("{p}.mlp.c_proj"), f, c, dtype)?,
                        })
                    })
                    .collect::<Result<Vec<_>>>()
            },
        );
        let ((wte, stored), h) = (wte?, h?);
        let stored_dtype = stored.to_string();
        Ok(Model {
            wte,
            no_bias: vec![0.0; v],
            wpe: ck.tensor("wpe.weight", &[config.n_positions, c])?,
            h,
            ln_f: LayerNorm::load(&ck, "ln_f", c)?,
            stored_dtype,
            dtype,
            isa: Isa::detect(),
            config,
        })
    }

    /// The same model running another compiled copy of the kernels (for tests and benchmarks).
    pub fn with_isa(mut self, isa: Isa) -> Model {
        self.isa = isa;
        self
    }

    /// A fingerprint of the weights (FNV-1a over the shape, `wpe`, every LayerNorm and bias, and
    /// the first eight token embeddings): what a prompt cache file records to refuse another
    /// model's K/V.
    pub fn fingerprint(&self) -> u64 {
        use crate::prompt_file::{fnv1a, FNV_OFFSET};
        let cfg = &self.config;
        let floats = |h: u64, x: &[f32]| x.iter().fold(h, |h, f| fnv1a(h, &f.to_bits().to_le_bytes()));
        let mut h = FNV_OFFSET;
        for n in [cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.n_inner, cfg.n_positions, cfg.vocab_size] {
            h = fnv1a(h, &(n as u64).to_le_bytes());
        }
        h = floats(h, &self.wpe);
        let mut col = vec![0.0; cfg.n_embd];
        for id in 0..8.min(cfg.vocab_size) {
            self.wte.column_into(id, &mut col);
            h = floats(h, &col);
        }
        for b in &self.h {
            for ln in [&b.ln_1, &b.ln_2] {
                h = floats(floats(h, &ln.weight), &ln.bias);
            }
            for c in [&b.c_attn, &b.attn_c_proj, &b.c_fc, &b.mlp_c_proj] {
                h = floats(h, &c.bias);
            }
        }
        floats(floats(h, &self.ln_f.weight), &self.ln_f.bias)
    }

    /// The dtype the weights are held in for computation.
    pub fn weights_dtype(&self) -> &'static str {
        self.dtype.name()
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Bytes the weights of a `cfg` model would take held as `ty` (what [`Model::weight_bytes`]
    /// reports once loaded): the matrices in their panels, biases, LayerNorms and `wpe` in f32.
    pub fn weight_bytes_for(cfg: &Config, ty: WeightType) -> usize {
        let (c, f) = (cfg.n_embd, cfg.n_inner);
        let conv = |k: usize, n: usize| PackedMatrix::bytes_of(k, n, ty) + 4 * n;
        let block = 4 * 4 * c + conv(c, cfg.qkv_width()) + conv(c, c) + conv(c, f) + conv(f, c);
        PackedMatrix::bytes_of(c, cfg.vocab_size, ty) + 4 * cfg.n_positions * c + cfg.n_layer * block + 4 * 2 * c
    }

    /// Bytes of all weights as held in memory.
    pub fn weight_bytes(&self) -> usize {
        let conv = |c: &Conv1D| c.weight.bytes() + 4 * c.bias.len();
        let ln = |l: &LayerNorm| 4 * (l.weight.len() + l.bias.len());
        let blocks: usize = self
            .h
            .iter()
            .map(|b| {
                ln(&b.ln_1) + conv(&b.c_attn) + conv(&b.attn_c_proj) + ln(&b.ln_2) + conv(&b.c_fc) + conv(&b.mlp_c_proj)
            })
            .sum();
        self.wte.bytes() + 4 * self.wpe.len() + blocks + ln(&self.ln_f)
    }

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
    pub fn forward_batch<B: Batched>(&self, batch: &mut [B], scratch: &mut Scratch) -> Result<()> {
        self.forward_rows(batch, scratch, &mut NoTap)
    }

    /// The one forward pass behind [`Model::forward`] and [`Model::forward_batch`]. A tap that
    /// wants [`Point::LnF`] is only given with a single sequence.
    fn forward_rows<B: Batched>(&self, batch: &mut [B], scratch: &mut Scratch, tap: &mut dyn Tap) -> Result<()> {
        let cfg = &self.config;
        let (c, nh, hs, f, v) = (cfg.n_embd, cfg.n_head, cfg.head_dim(), cfg.n_inner, cfg.vocab_size);
        let (isa, eps) = (self.isa, cfg.layer_norm_epsilon);
        // Check every sequence before any work: rows, logits, ids, room.                    T = Σ Tᵢ
        let (mut t, mut r_all, mut wanting) = (0, 0, 0);
        for b in batch.iter_mut() {
            let s = b.rows();
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
            s.cache.check_room(ti)?;
            (t, r_all, wanting) = (t + ti, r_all + ri, wanting + usize::from(ri > 0));
        }
        if t == 0 {
            return Err(Error::Invalid("forward needs at least one token".into()));
        }
        let lnf_all = tap.wants(Point::LnF);
        debug_assert!(!lnf_all || batch.len() == 1, "taps observe one sequence");
        tap.begin(batch[0].rows().cache.len(), t);
        scratch.ensure(cfg, t);
        let Scratch { x, xn, qkv, att, proj, fc, scores, probs, logits: batch_logits, acts, .. } = scratch;
        let (x, xn, qkv) = (&mut x[..t * c], &mut xn[..t * c], &mut qkv[..t * 3 * c]);
        let (att, proj, fc) = (&mut att[..t * c], &mut proj[..t * c], &mut fc[..t * f]);

        // Token plus position embeddings.                                          x: [T, C]
        let mut row = 0;
        for b in batch.iter_mut() {
            let s = b.rows();
            for (i, &id) in s.ids.iter().enumerate() {
                let xr = &mut x[row * c..(row + 1) * c];
                self.wte.column_into(id as usize, xr);
                for (xo, e) in xr.iter_mut().zip(&self.wpe[(s.cache.len() + i) * c..][..c]) {
                    *xo += e;
                }
                row += 1;
            }
        }
        report(tap, Point::Embed, &[t, c], x);

        for (l, blk) in self.h.iter().enumerate() {
            // Attention: x += c_proj(softmax(q kᵀ / √HS, causal) v), q k v from c_attn(ln_1(x)).
            blk.ln_1.forward(isa, xn, x, t, eps); //                                  [T, C]
            report(tap, Point::Ln1(l), &[t, c], xn);
            blk.c_attn.forward(isa, qkv, xn, t, acts); //                                    [T, 3C]
            report(tap, Point::CAttn(l), &[t, 3 * c], qkv);
            let mut row = 0;
            for b in batch.iter_mut() {
                // Each sequence over its own cache.                          rows row..row+Tᵢ
                let s = b.rows();
                let (ti, p) = (s.ids.len(), s.cache.len());
                if ti == 0 {
                    continue;
                }
                let q = &qkv[row * 3 * c..(row + ti) * 3 * c];
                s.cache.write(l, q, ti); //                                K, V → positions P..P+Tᵢ
                let want_probs = tap.wants(Point::AttnProbs(l));
                if want_probs {
                    probs.resize(nh * ti * (p + ti), 0.0);
                }
                let dims = AttnDims { t: ti, p, nh, hs, t_max: s.cache.capacity(), scale: cfg.attn_scale(l) };
                let kv = s.cache.layer(l);
                let out = &mut att[row * c..(row + ti) * c];
                k::attention(isa, out, want_probs.then_some(&mut probs[..]), q, 3 * c, &kv.k, &kv.v, scores, dims);
                if want_probs {
                    tap.record(Point::AttnProbs(l), &[nh, ti, p + ti], probs);
                }
                row += ti;
            }
            blk.attn_c_proj.forward(isa, proj, att, t, acts); //                             [T, C]
            report(tap, Point::AttnProj(l), &[t, c], proj);
            k::add_inplace(x, proj);

            // MLP: x += c_proj(gelu_new(c_fc(ln_2(x)))).
            blk.ln_2.forward(isa, xn, x, t, eps); //                                  [T, C]
            report(tap, Point::Ln2(l), &[t, c], xn);
            blk.c_fc.forward(isa, fc, xn, t, acts); //                                       [T, F]
            k::gelu_new(isa, fc);
            report(tap, Point::MlpAct(l), &[t, f], fc);
            blk.mlp_c_proj.forward(isa, proj, fc, t, acts); //                               [T, C]
            report(tap, Point::MlpProj(l), &[t, c], proj);
            k::add_inplace(x, proj);
            report(tap, Point::Block(l), &[t, c], x);
        }

        // Final LayerNorm, only of the rows whose logits are wanted (the last Rᵢ of each
        // sequence), gathered into the first rows of xn; all rows when a tap asks for ln_f.
        let (mut row, mut sel) = (0, 0);
        for b in batch.iter_mut() {
            let s = b.rows();
            let (ti, ri) = (s.ids.len(), s.logits.len() / v);
            let first = if lnf_all { 0 } else { ti - ri };
            let (src, n) = (&x[(row + first) * c..(row + ti) * c], ti - first);
            self.ln_f.forward(isa, &mut xn[sel * c..(sel + n) * c], src, n, eps);
            (row, sel) = (row + ti, sel + n);
        }
        report(tap, Point::LnF, &[sel, c], &xn[..sel * c]);

        // The tied vocabulary projection.                                              [R, V]
        let xn_logits = &xn[(sel - r_all) * c..sel * c];
        if wanting == 1 {
            let s = batch.iter_mut().map(|b| b.rows()).find(|s| !s.logits.is_empty()).expect("one wants logits");
            k::matmul_packed(isa, s.logits, xn_logits, &self.wte, &self.no_bias, r_all, acts);
            report(tap, Point::Logits, &[r_all, v], s.logits);
        } else if wanting > 1 {
            if batch_logits.len() < r_all * v {
                batch_logits.resize(r_all * v, 0.0); // grows with the largest batch, then stays
            }
            let logits = &mut batch_logits[..r_all * v];
            k::matmul_packed(isa, logits, xn_logits, &self.wte, &self.no_bias, r_all, acts);
            let mut done = 0;
            for b in batch.iter_mut() {
                let s = b.rows();
                let n = s.logits.len();
                s.logits.copy_from_slice(&batch_logits[done..done + n]);
                done += n;
            }
        }
        // Finite weights can still overflow f32 on some input; garbage logits are an error.
        for b in batch.iter_mut() {
            let s = b.rows();
            if let Some(i) = s.logits.iter().position(|x| !x.is_finite()) {
                let (ti, ri) = (s.ids.len(), s.logits.len() / v);
                let position = s.cache.len() + ti - ri + i / v;
                return Err(Error::NonFiniteLogits { position, value: s.logits[i] });
            }
        }
        for b in batch.iter_mut() {
            let s = b.rows();
            let ti = s.ids.len();
            s.cache.advance(ti);
        }
        Ok(())
    }

    /// `ln_f` and the vocabulary projection applied to residual-stream rows `hidden` (`[R, C]`):
    /// the logit lens. Allocates; for inspection, not for the generation loop.
    pub fn logits_of_hidden(&self, hidden: &[f32]) -> Vec<f32> {
        let (c, v) = (self.config.n_embd, self.config.vocab_size);
        let r = hidden.len() / c;
        let mut xn = vec![0.0; r * c];
        self.ln_f.forward(self.isa, &mut xn, hidden, r, self.config.layer_norm_epsilon);
        let mut out = vec![0.0; r * v];
        let mut acts = k::QuantizedActs::default();
        k::matmul_packed(self.isa, &mut out, &xn, &self.wte, &self.no_bias, r, &mut acts);
        out
    }
}
