//! `kvgpt explain`: one forward pass and one cached decode step as a short lesson.

use super::session::Session;
use crate::common::{load, prompt_ids, read_prompt, ModelArgs, Outcome, PromptArgs};
use anyhow::{Context, Result};
use clap::Args;
use kvgpt_core::logprobs::top_k;
use kvgpt_core::units::count;
use kvgpt_core::Point;
use kvgpt_views::inspect::{trace, Trace, TraceSpec};

#[derive(Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub prompt: PromptArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

pub(super) fn first(v: &[f32], n: usize) -> String {
    let parts: Vec<String> = v.iter().take(n).map(|x| format!("{x:.4}")).collect();
    format!("[{}{}]", parts.join(", "), if v.len() > n { ", …" } else { "" })
}

pub fn explain(a: &ExplainArgs) -> Result<Outcome> {
    let text = read_prompt(&a.prompt)?;
    let loaded = load(&a.model)?;
    let ids = prompt_ids(&loaded, &text)?;
    let s = Session { loaded, ids };
    let m = &s.loaded.model;
    let cfg = &m.config;
    let (t, c, nh, hs, f, v, nl) =
        (s.ids.len(), cfg.n_embd, cfg.n_head, cfg.head_dim(), cfg.n_inner, cfg.vocab_size, cfg.n_layer);
    let spec = TraceSpec { generate: 1, want: |_| true, all_logits: false, prefill: None };
    let tr: Trace = trace(m, &s.ids, &spec)?;
    let pre = tr.recorder.calls.first().context("no prefill recorded")?;
    let get = |p: Point| pre.get(&p).map(|r| r.data.as_slice()).unwrap_or(&[]);
    let last = t - 1;

    outln!("A forward pass of {} on {:?}, step by step, with the engine's real numbers.\n", s.loaded.files.name, text);
    outln!("1. Text → tokens → ids. The GPT-2 byte-level BPE tokenizer splits the text into {}:", count(t, "token"));
    for (i, &id) in s.ids.iter().enumerate() {
        outln!("     position {i:>3}: id {id:>6}  {:?}", s.label(id));
    }
    outln!("   The model sees the ids as a tensor of shape (1, {t}).\n");

    let embed = get(Point::Embed);
    let id = s.ids[last] as usize;
    outln!("2. Embeddings. Token embedding wte is [{v}, {c}], position embedding wpe is [{}, {c}].", cfg.n_positions);
    outln!("   Row id of wte plus row position of wpe (added, not concatenated) gives x of shape (1, {t}, {c}).");
    outln!("   For the last token (position {last}):");
    let (wte_name, wpe_name) = (format!("wte[{id}]"), format!("wpe[{last}]"));
    let w = wte_name.len().max(wpe_name.len());
    outln!("     {wte_name:<w$} = {}", first(&m.wte.column(id), 6));
    outln!("     {wpe_name:<w$} = {}", first(&m.wpe[last * c..][..c], 6));
    outln!("     {:<w$} = {}\n", "x", first(&embed[last * c..][..c], 6));

    outln!("3. Layer 0 of {nl}. Each layer is: x += attention(ln_1(x)); x += mlp(ln_2(x)).");
    outln!("   ln_1 normalises each row to mean 0, variance 1, then scales and shifts: (1, {t}, {c}).");
    outln!("     ln_1(x)[{last}] = {}", first(&get(Point::Ln1(0))[last * c..][..c], 6));
    let qkv = get(Point::CAttn(0));
    outln!("   c_attn is one fused projection {c} → {}: q, k, v side by side, (1, {t}, {}).", 3 * c, 3 * c);
    outln!("     q[{last}] = {}", first(&qkv[last * 3 * c..][..c], 4));
    outln!("     k[{last}] = {}", first(&qkv[last * 3 * c + c..][..c], 4));
    outln!("     v[{last}] = {}", first(&qkv[last * 3 * c + 2 * c..][..c], 4));
    outln!("   Each of q, k, v is split into {nh} heads of {hs}: (1, {nh}, {t}, {hs}).");
    outln!(
        "   Scores q·kᵀ / √{hs} = q·kᵀ / {:.4} have shape (1, {nh}, {t}, {t}); the causal mask hides every key after \
         the query, so a token sees only itself and what came before.",
        (hs as f32).sqrt()
    );
    let probs = get(Point::AttnProbs(0));
    let row = &probs[last * t..(last + 1) * t]; // head 0, query `last`
    outln!(
        "   softmax turns each row into weights α that sum to 1. Layer 0, head 0, the row of {:?}:",
        s.label(s.ids[last])
    );
    for (k, a) in row.iter().enumerate() {
        outln!("     α[{last}, {k}] = {a:.4}  {:?}", s.label(s.ids[k]));
    }
    outln!("   The head's output is Σ α·v: (1, {nh}, {t}, {hs}), the heads side by side again: (1, {t}, {c}).");
    outln!("   c_proj mixes the heads ({c} → {c}) and the result is added to x (the residual).");
    outln!("     attn out[{last}] = {}", first(&get(Point::AttnProj(0))[last * c..][..c], 6));
    outln!("   The MLP: ln_2, then c_fc {c} → {f}, GELU, then c_proj {f} → {c}, added to x again.");
    outln!("     gelu(c_fc)[{last}] = {}  (1, {t}, {f})", first(&get(Point::MlpAct(0))[last * f..][..f], 6));
    outln!("     x after layer 0[{last}] = {}\n", first(&get(Point::Block(0))[last * c..][..c], 6));

    let rest = match nl {
        1 => "4. There is no other layer".to_string(),
        2 => "4. The same for layer 1".to_string(),
        _ => format!("4. The same for layers 1 to {}", nl - 1),
    };
    outln!("{rest}. Then ln_f, and the logits are ln_f(x) · wteᵀ (the vocabulary projection");
    outln!("   reuses the token embedding): shape (1, {t}, {v}). For the last position:");
    let logits_row = &pre.get(&Point::Logits).context("no logits recorded")?.data;
    let (top, entropy) = top_k(logits_row, 5);
    outln!("   top-5 next tokens (softmax probabilities), entropy {entropy:.3} nats:");
    for cand in &top {
        outln!(
            "     {:>6} {:<18} logit {:>9.4}  p = {:.4}",
            cand.id,
            format!("{:?}", s.label(cand.id)),
            cand.logit,
            cand.prob
        );
    }
    outln!("");

    outln!("5. The KV cache after this prefill: every layer keeps K and V of shape (1, {nh}, {t}, {hs}),");
    outln!(
        "   {} layers × 2 × {nh}·{t}·{hs} floats = {} bytes in use, preallocated for {} positions.\n",
        nl,
        nl * 2 * nh * t * hs * 4,
        cfg.n_positions
    );

    let next = tr.ids[t];
    let step = tr.recorder.calls.get(1).context("no decode step recorded")?;
    outln!("6. One decode step. Greedy decoding picks the most likely token, {next} {:?}.", s.label(next));
    outln!("   Input shape (1, 1): only this token runs through the layers; its q, k, v are computed,");
    outln!("   its K and V are written at position {t}, and attention reads the {t} cached positions plus its own.");
    outln!("   Cache length is now {}: K and V of each layer are (1, {nh}, {}, {hs}).", t + 1, t + 1);
    let a1 = &step.get(&Point::AttnProbs(0)).context("no decode attention")?;
    outln!("   Attention weights have shape (1, {nh}, 1, {}); layer 0, head 0:", a1.shape[2]);
    outln!("     {}", first(&a1.data[..a1.shape[2]], a1.shape[2]));
    let l1 = &step.get(&Point::Logits).context("no decode logits")?.data;
    let (top, _) = top_k(l1, 5);
    outln!("   Logits have shape (1, 1, {v}); top-5 next tokens:");
    for cand in &top {
        outln!("     {:>6} {:<18} p = {:.4}", cand.id, format!("{:?}", s.label(cand.id)), cand.prob);
    }
    outln!("\nEvery number above is what the engine computed; `kvgpt inspect` shows each part in full.");
    Ok(Outcome::Done)
}
