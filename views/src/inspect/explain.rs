//! `kvgpt explain`: one forward pass and one cached decode step as a short lesson, with the
//! engine's real numbers.

use super::{trace, Trace, TraceSpec};
use kvgpt_core::error::{Error, Result};
use kvgpt_core::logprobs::top_k;
use kvgpt_core::tap::{Point, Recorded};
use kvgpt_core::units::count;
use kvgpt_core::{Config, Loaded};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The first `n` numbers of `v`, as the lesson shows a row.
pub fn first(v: &[f32], n: usize) -> String {
    let parts: Vec<String> = v.iter().take(n).map(|x| format!("{x:.4}")).collect();
    format!("[{}{}]", parts.join(", "), if v.len() > n { ", …" } else { "" })
}

/// What every section reads: the model, the prompt, its trace (the prefill and one decode step).
struct Lesson<'a> {
    loaded: &'a Loaded,
    text: &'a str,
    ids: &'a [u32],
    tr: Trace,
}

/// The lesson on `text` (its `ids`): the prefill, layer 0 in detail, the logits, the cache, one
/// decode step.
pub fn explain(loaded: &Loaded, text: &str, ids: &[u32]) -> Result<String> {
    let spec = TraceSpec { generate: 1, want: |_| true, all_logits: false, prefill: None };
    let tr = trace(&loaded.model, ids, &spec)?;
    let l = Lesson { loaded, text, ids, tr };
    let mut out = String::new();
    l.tokens(&mut out);
    l.embeddings(&mut out);
    l.layer0(&mut out)?;
    l.logits(&mut out)?;
    l.cache(&mut out);
    l.decode(&mut out)?;
    Ok(out)
}

fn missing(what: &str) -> Error {
    Error::Invalid(format!("{what} was not recorded"))
}

/// A line of the lesson (writing into a String cannot fail).
macro_rules! say {
    ($out:expr, $($t:tt)*) => {{
        let _ = writeln!($out, $($t)*);
    }};
}

impl Lesson<'_> {
    fn cfg(&self) -> &Config {
        &self.loaded.model.config
    }

    fn label(&self, id: u32) -> String {
        self.loaded.tokenizer.token_label(id)
    }

    /// The prefill's recorded points.
    fn prefill(&self) -> Result<&BTreeMap<Point, Recorded>> {
        self.tr.recorder.calls.first().ok_or_else(|| missing("the prefill"))
    }

    fn get(&self, p: Point) -> &[f32] {
        self.prefill().ok().and_then(|pre| pre.get(&p)).map_or(&[], |r| r.data.as_slice())
    }

    fn tokens(&self, out: &mut String) {
        let (text, t) = (self.text, self.ids.len());
        say!(
            out,
            "A forward pass of {} on {:?}, step by step, with the engine's real numbers.\n",
            self.loaded.files.name,
            text
        );
        say!(
            out,
            "1. Text → tokens → ids. The GPT-2 byte-level BPE tokenizer splits the text into {}:",
            count(t, "token")
        );
        for (i, &id) in self.ids.iter().enumerate() {
            say!(out, "     position {i:>3}: id {id:>6}  {:?}", self.label(id));
        }
        say!(out, "   The model sees the ids as a tensor of shape (1, {t}).\n");
    }

    fn embeddings(&self, out: &mut String) {
        let (m, cfg, t) = (&self.loaded.model, self.cfg(), self.ids.len());
        let (c, v, last) = (cfg.n_embd, cfg.vocab_size, t - 1);
        let embed = self.get(Point::Embed);
        let id = self.ids[last] as usize;
        say!(
            out,
            "2. Embeddings. Token embedding wte is [{v}, {c}], position embedding wpe is [{}, {c}].",
            cfg.n_positions
        );
        say!(
            out,
            "   Row id of wte plus row position of wpe (added, not concatenated) gives x of shape (1, {t}, {c})."
        );
        say!(out, "   For the last token (position {last}):");
        let (wte_name, wpe_name) = (format!("wte[{id}]"), format!("wpe[{last}]"));
        let w = wte_name.len().max(wpe_name.len());
        say!(out, "     {wte_name:<w$} = {}", first(&m.wte.column(id), 6));
        say!(out, "     {wpe_name:<w$} = {}", first(&m.wpe[last * c..][..c], 6));
        say!(out, "     {:<w$} = {}\n", "x", first(&embed[last * c..][..c], 6));
    }

    fn layer0(&self, out: &mut String) -> Result<()> {
        let (cfg, t) = (self.cfg(), self.ids.len());
        let (c, nh, hs, f, nl, last) = (cfg.n_embd, cfg.n_head, cfg.head_dim(), cfg.n_inner, cfg.n_layer, t - 1);
        let get = |p| self.get(p);
        say!(out, "3. Layer 0 of {nl}. Each layer is: x += attention(ln_1(x)); x += mlp(ln_2(x)).");
        say!(out, "   ln_1 normalises each row to mean 0, variance 1, then scales and shifts: (1, {t}, {c}).");
        say!(out, "     ln_1(x)[{last}] = {}", first(&get(Point::Ln1(0))[last * c..][..c], 6));
        let qkv = get(Point::CAttn(0));
        say!(out, "   c_attn is one fused projection {c} → {}: q, k, v side by side, (1, {t}, {}).", 3 * c, 3 * c);
        say!(out, "     q[{last}] = {}", first(&qkv[last * 3 * c..][..c], 4));
        say!(out, "     k[{last}] = {}", first(&qkv[last * 3 * c + c..][..c], 4));
        say!(out, "     v[{last}] = {}", first(&qkv[last * 3 * c + 2 * c..][..c], 4));
        say!(out, "   Each of q, k, v is split into {nh} heads of {hs}: (1, {nh}, {t}, {hs}).");
        say!(out,
            "   Scores q·kᵀ / √{hs} = q·kᵀ / {:.4} have shape (1, {nh}, {t}, {t}); the causal mask hides every key after \
             the query, so a token sees only itself and what came before.",
            (hs as f32).sqrt()
        );
        let probs = get(Point::AttnProbs(0));
        let row = &probs[last * t..(last + 1) * t]; // head 0, query `last`
        say!(
            out,
            "   softmax turns each row into weights α that sum to 1. Layer 0, head 0, the row of {:?}:",
            self.label(self.ids[last])
        );
        for (k, a) in row.iter().enumerate() {
            say!(out, "     α[{last}, {k}] = {a:.4}  {:?}", self.label(self.ids[k]));
        }
        say!(out, "   The head's output is Σ α·v: (1, {nh}, {t}, {hs}), the heads side by side again: (1, {t}, {c}).");
        say!(out, "   c_proj mixes the heads ({c} → {c}) and the result is added to x (the residual).");
        say!(out, "     attn out[{last}] = {}", first(&get(Point::AttnProj(0))[last * c..][..c], 6));
        say!(out, "   The MLP: ln_2, then c_fc {c} → {f}, GELU, then c_proj {f} → {c}, added to x again.");
        say!(out, "     gelu(c_fc)[{last}] = {}  (1, {t}, {f})", first(&get(Point::MlpAct(0))[last * f..][..f], 6));
        say!(out, "     x after layer 0[{last}] = {}\n", first(&get(Point::Block(0))[last * c..][..c], 6));
        Ok(())
    }

    fn logits(&self, out: &mut String) -> Result<()> {
        let (cfg, t) = (self.cfg(), self.ids.len());
        let (v, nl) = (cfg.vocab_size, cfg.n_layer);
        let logits_row = &self.prefill()?.get(&Point::Logits).ok_or_else(|| missing("the logits"))?.data;
        let rest = match nl {
            1 => "4. There is no other layer".to_string(),
            2 => "4. The same for layer 1".to_string(),
            _ => format!("4. The same for layers 1 to {}", nl - 1),
        };
        say!(out, "{rest}. Then ln_f, and the logits are ln_f(x) · wteᵀ (the vocabulary projection");
        say!(out, "   reuses the token embedding): shape (1, {t}, {v}). For the last position:");
        let (top, entropy) = top_k(logits_row, 5);
        say!(out, "   top-5 next tokens (softmax probabilities), entropy {entropy:.3} nats:");
        for cand in &top {
            say!(
                out,
                "     {:>6} {:<18} logit {:>9.4}  p = {:.4}",
                cand.id,
                format!("{:?}", self.label(cand.id)),
                cand.logit,
                cand.prob
            );
        }
        say!(out, "");
        Ok(())
    }

    fn cache(&self, out: &mut String) {
        let (cfg, t) = (self.cfg(), self.ids.len());
        let (nh, hs, nl) = (cfg.n_head, cfg.head_dim(), cfg.n_layer);
        say!(out, "5. The KV cache after this prefill: every layer keeps K and V of shape (1, {nh}, {t}, {hs}),");
        let shape = self.tr.cache.shape();
        let held = kvgpt_core::KvCache::bytes_per_position_as(cfg, shape.ty) * t;
        let size = match shape.ty.name() {
            "f32" => format!("floats × 4 bytes = {held} bytes"),
            ty => format!("numbers, held as {ty}: {held} bytes"),
        };
        say!(
            out,
            "   {nl} layers × 2 × {nh}·{t}·{hs} {size} in use, in blocks of {} positions taken as positions arrive \
             (the model reads at most {}).\n",
            shape.positions,
            cfg.n_positions
        );
    }

    fn decode(&self, out: &mut String) -> Result<()> {
        let (cfg, t) = (self.cfg(), self.ids.len());
        let (nh, hs, v) = (cfg.n_head, cfg.head_dim(), cfg.vocab_size);
        let step = self.tr.recorder.calls.get(1).ok_or_else(|| missing("the decode step"))?;
        let a1 = step.get(&Point::AttnProbs(0)).ok_or_else(|| missing("the decode step's attention"))?;
        let l1 = &step.get(&Point::Logits).ok_or_else(|| missing("the decode step's logits"))?.data;
        let next = self.tr.ids[t];
        say!(out, "6. One decode step. Greedy decoding picks the most likely token, {next} {:?}.", self.label(next));
        say!(out, "   Input shape (1, 1): only this token runs through the layers; its q, k, v are computed,");
        say!(
            out,
            "   its K and V are written at position {t}, and attention reads the {t} cached positions plus its own."
        );
        say!(out, "   Cache length is now {}: K and V of each layer are (1, {nh}, {}, {hs}).", t + 1, t + 1);
        say!(out, "   Attention weights have shape (1, {nh}, 1, {}); layer 0, head 0:", a1.shape[2]);
        say!(out, "     {}", first(&a1.data[..a1.shape[2]], a1.shape[2]));
        let (top, _) = top_k(l1, 5);
        say!(out, "   Logits have shape (1, 1, {v}); top-5 next tokens:");
        for cand in &top {
            say!(out, "     {:>6} {:<18} p = {:.4}", cand.id, format!("{:?}", self.label(cand.id)), cand.prob);
        }
        say!(out, "\nEvery number above is what the engine computed; `kvgpt inspect` shows each part in full.");
        Ok(())
    }
}
