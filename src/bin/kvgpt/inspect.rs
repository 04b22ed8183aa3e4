//! `kvgpt inspect …` and `kvgpt explain`: the learner's views of the forward pass, with the
//! engine's real numbers, as text, JSON, heatmaps and exported tensors.

use crate::render::{self, Matrix};
use crate::{load, print_json, prompt_ids, read_prompt, Input, ModelArgs, Outcome, PromptArgs};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use kvgpt::export::{self, Named};
use kvgpt::inspect::{top_k, trace, Trace, TraceSpec};
use kvgpt::{KvPart, Loaded, Point};
use serde::Serialize;
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum InspectCmd {
    /// Token ids, pieces (raw bytes where a piece is part of a UTF-8 character) and byte offsets.
    Tokens(Common),
    /// Per position: the wte row, the wpe row and their sum (first numbers and norms).
    Embeddings {
        #[command(flatten)]
        c: Common,
        /// How many leading numbers of each row to show.
        #[arg(long, default_value_t = 8)]
        dims: usize,
    },
    /// Attention weights [query, key] per layer and head, as a heatmap, JSON, SVG or HTML.
    Attention {
        #[command(flatten)]
        c: Common,
        #[command(flatten)]
        sel: Select,
        /// Also run N greedy decode steps with the KV cache on; the matrix covers the prompt and them.
        #[arg(long, default_value_t = 0, value_name = "N")]
        generate: usize,
        /// Draw every selected layer × head as a grid of labelled heatmaps into an SVG file.
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
        /// The same grid as a standalone HTML page.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// Top-k next-token probabilities, logits and entropy; `--lens` adds the logit lens per layer.
    Logits {
        #[command(flatten)]
        c: Common,
        /// How many of the most likely tokens to show.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
        top_k: u32,
        /// The position whose next-token distribution to show (default: the last).
        #[arg(long, conflicts_with = "all_positions")]
        position: Option<usize>,
        /// Show every position.
        #[arg(long)]
        all_positions: bool,
        /// The logit lens: each layer's residual stream through ln_f and the vocabulary projection.
        #[arg(long)]
        lens: bool,
    },
    /// KV-cache shapes, bytes and fill after the prompt, and what each decode step reads and computes.
    Cache {
        #[command(flatten)]
        c: Common,
        /// Greedy decode steps to run after the prompt.
        #[arg(long, default_value_t = 0, value_name = "N")]
        generate: usize,
    },
}

/// What every inspect command takes.
#[derive(Args, Clone)]
pub struct Common {
    #[command(flatten)]
    pub io: Input,
    /// Write the tensors shown to FILE.safetensors (all) or FILE.npy (the main one), for numpy.
    #[arg(long, value_name = "FILE")]
    pub export: Option<PathBuf>,
}

#[derive(Args, Clone)]
pub struct Select {
    /// Only this layer (0-based).
    #[arg(long)]
    pub layer: Option<usize>,
    /// Only this head (0-based).
    #[arg(long)]
    pub head: Option<usize>,
}

#[derive(Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub prompt: PromptArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

impl InspectCmd {
    pub fn model_args(&self) -> &ModelArgs {
        &self.common().io.model
    }

    fn common(&self) -> &Common {
        match self {
            InspectCmd::Tokens(c)
            | InspectCmd::Embeddings { c, .. }
            | InspectCmd::Attention { c, .. }
            | InspectCmd::Logits { c, .. }
            | InspectCmd::Cache { c, .. } => c,
        }
    }
}

/// The loaded model, the prompt text and its ids.
struct Session {
    loaded: Loaded,
    ids: Vec<u32>,
}

impl Session {
    fn open(c: &Common) -> Result<Session> {
        let text = read_prompt(&c.io.prompt)?;
        let loaded = load(&c.io.model)?;
        let ids = prompt_ids(&loaded, &text)?;
        Ok(Session { loaded, ids })
    }

    fn labels(&self, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&i| self.loaded.tokenizer.token_label(i)).collect()
    }

    fn label(&self, id: u32) -> String {
        self.loaded.tokenizer.token_label(id)
    }
}

/// Checks an output path before any work, so a typo does not cost a long run.
fn check_writable(path: &Path) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        bail!("cannot write {}: the folder {} does not exist", path.display(), dir.display());
    }
    Ok(())
}

fn write_text(path: &Path, text: &str) -> Result<()> {
    Ok(export::write_atomic(path, text.as_bytes())?)
}

fn do_export(c: &Common, tensors: &[Named]) -> Result<()> {
    if let Some(path) = &c.export {
        let names = export::write(path, tensors)?;
        errln!("[kvgpt] wrote {} ({})", path.display(), names.join(", "));
    }
    Ok(())
}

pub fn run(cmd: InspectCmd) -> Result<Outcome> {
    let c = cmd.common();
    if let (InspectCmd::Tokens(_), Some(_)) = (&cmd, &c.export) {
        bail!("inspect tokens has no tensor to --export; --json prints the ids, tokens, bytes and offsets");
    }
    let mut outputs: Vec<&Path> = Vec::new();
    if let Some(p) = &c.export {
        export::Format::of(p)?;
        outputs.push(p);
    }
    if let InspectCmd::Attention { svg, html, .. } = &cmd {
        outputs.extend(svg.iter().chain(html).map(PathBuf::as_path));
    }
    if !outputs.is_empty() {
        let files = crate::locate(&c.io.model)?;
        for p in outputs {
            check_writable(p)?;
            crate::refuse_input_path(p, &files, c.io.prompt.prompt_file.as_deref())?;
        }
    }
    match &cmd {
        InspectCmd::Tokens(c) => tokens(c),
        InspectCmd::Embeddings { c, dims } => embeddings(c, *dims),
        InspectCmd::Attention { c, sel, generate, svg, html } => {
            attention(c, sel, *generate, svg.as_deref(), html.as_deref())
        }
        InspectCmd::Logits { c, top_k, position, all_positions, lens } => {
            logits(c, *top_k as usize, *position, *all_positions, *lens)
        }
        InspectCmd::Cache { c, generate } => cache(c, *generate),
    }?;
    Ok(Outcome::Done)
}

// ---------------------------------------------------------------------------------------------
// tokens

fn tokens(c: &Common) -> Result<()> {
    let s = Session::open(c)?;
    let tok = &s.loaded.tokenizer;
    let mut offsets = Vec::with_capacity(s.ids.len());
    let mut at = 0usize;
    for &id in &s.ids {
        let n = tok.token_bytes(id).len();
        offsets.push([at, at + n]);
        at += n;
    }
    let bytes: Vec<&[u8]> = s.ids.iter().map(|&i| tok.token_bytes(i)).collect();
    let partial: Vec<bool> = s.ids.iter().map(|&i| tok.is_partial(i)).collect();
    if c.io.json {
        print_json(&json!({
            "ids": s.ids,
            "tokens": s.labels(&s.ids),
            "pieces": s.ids.iter().map(|&i| tok.piece(i)).collect::<Vec<_>>(),
            "bytes": bytes,
            "offsets": offsets,
            "partial_utf8": partial,
        }))?;
    } else {
        outln!("{} tokens, {} bytes (offsets are byte ranges of the UTF-8 text)", s.ids.len(), at);
        outln!("{:>4} {:>6}  {:<10} {:<22} {:<16} bytes", "pos", "id", "offsets", "text", "piece");
        for (i, &id) in s.ids.iter().enumerate() {
            let hex: Vec<String> = bytes[i].iter().map(|b| format!("{b:02x}")).collect();
            let shown = if partial[i] { s.label(id) } else { format!("{:?}", s.label(id)) };
            outln!(
                "{i:>4} {id:>6}  {:<10} {:<22} {:<16} {}{}",
                format!("[{}, {})", offsets[i][0], offsets[i][1]),
                shown,
                tok.piece(id),
                hex.join(" "),
                if partial[i] { "  (part of a UTF-8 character)" } else { "" }
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// embeddings

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt()
}

fn embeddings(c: &Common, dims: usize) -> Result<()> {
    let s = Session::open(c)?;
    let m = &s.loaded.model;
    let cfg = &m.config;
    let ch = cfg.n_embd;
    let spec = TraceSpec { generate: 0, want: |p| p == Point::Embed, all_logits: false };
    let tr = trace(m, &s.ids, &spec)?;
    let (_, sum) = tr.rows(Point::Embed).context("the forward pass reported no embeddings")?;
    let t = s.ids.len();
    let wte_rows: Vec<f32> = s.ids.iter().flat_map(|&id| m.wte.column(id as usize)).collect();
    let wpe_rows: Vec<f32> = m.wpe[..t * ch].to_vec();
    let d = dims.min(ch);
    let rows: Vec<Value> = (0..t)
        .map(|i| {
            let (a, b, x) = (&wte_rows[i * ch..][..ch], &wpe_rows[i * ch..][..ch], &sum[i * ch..][..ch]);
            json!({
                "position": i, "id": s.ids[i], "token": s.label(s.ids[i]),
                "wte": &a[..d], "wte_norm": norm(a),
                "wpe": &b[..d], "wpe_norm": norm(b),
                "sum": &x[..d], "sum_norm": norm(x),
            })
        })
        .collect();
    if c.io.json {
        print_json(&json!({ "ids": s.ids, "tokens": s.labels(&s.ids), "n_embd": ch, "dims": d, "positions": rows }))?;
    } else {
        outln!("x = wte[id] + wpe[position]: each row has {ch} numbers; the first {d} and the L2 norm of all {ch}:");
        let fmt = |v: &Value| -> String {
            v.as_array().into_iter().flatten().map(|x| format!("{:>8.4}", x.as_f64().unwrap_or(0.0))).collect()
        };
        for r in &rows {
            outln!("pos {} id {} {:?}", r["position"], r["id"], r["token"].as_str().unwrap_or(""));
            for (name, key) in [("wte", "wte"), ("wpe", "wpe"), ("sum", "sum")] {
                outln!("  {name:<4}{} | norm {:.4}", fmt(&r[key]), r[format!("{key}_norm")].as_f64().unwrap_or(0.0));
            }
        }
    }
    do_export(
        c,
        &[
            Named { name: "embed".into(), shape: vec![t, ch], data: &sum },
            Named { name: "wte_rows".into(), shape: vec![t, ch], data: &wte_rows },
            Named { name: "wpe_rows".into(), shape: vec![t, ch], data: &wpe_rows },
        ],
    )
}

// ---------------------------------------------------------------------------------------------
// attention

fn selected(sel: Option<usize>, n: usize, what: &str) -> Result<Vec<usize>> {
    match sel {
        Some(i) if i >= n => bail!("--{what} {i} is out of range: the model has {n} {what}s (0..{})", n - 1),
        Some(i) => Ok(vec![i]),
        None => Ok((0..n).collect()),
    }
}

fn attention(c: &Common, sel: &Select, generate: usize, svg: Option<&Path>, html: Option<&Path>) -> Result<()> {
    let s = Session::open(c)?;
    let m = &s.loaded.model;
    let cfg = &m.config;
    let layers = selected(sel.layer, cfg.n_layer, "layer")?;
    let heads = selected(sel.head, cfg.n_head, "head")?;
    let spec = TraceSpec { generate, want: |p| matches!(p, Point::AttnProbs(_)), all_logits: false };
    let tr = trace(m, &s.ids, &spec)?;
    let n = tr.len();
    let per_layer: Vec<Vec<f32>> = layers
        .iter()
        .map(|&l| tr.attention(l).map(|(_, a)| a).context("attention weights were not recorded"))
        .collect::<Result<_>>()?;
    let matrix = |li: usize, h: usize| &per_layer[li][h * n * n..(h + 1) * n * n];
    let labels = s.labels(&tr.ids);

    let mut selected_data = Vec::with_capacity(layers.len() * heads.len() * n * n);
    for li in 0..layers.len() {
        for &h in &heads {
            selected_data.extend_from_slice(matrix(li, h));
        }
    }
    let title = format!(
        "attention of {} ({} prompt tokens{})",
        s.loaded.files.name,
        tr.prompt_len,
        if generate > 0 { format!(" + {generate} decoded with the KV cache") } else { String::new() }
    );
    let mats: Vec<Matrix> = layers
        .iter()
        .enumerate()
        .flat_map(|(li, &l)| heads.iter().map(move |&h| (li, l, h)))
        .map(|(li, l, h)| Matrix { layer: l, head: h, weights: matrix(li, h) })
        .collect();
    if let Some(p) = svg {
        write_text(p, &render::svg(&mats, &labels, &title))?;
        errln!("[kvgpt] wrote {} ({} heatmaps)", p.display(), mats.len());
    }
    if let Some(p) = html {
        write_text(p, &render::html(&mats, &labels, &title))?;
        errln!("[kvgpt] wrote {} ({} heatmaps)", p.display(), mats.len());
    }
    if c.io.json {
        let nested: Vec<Vec<Vec<&[f32]>>> =
            (0..layers.len()).map(|li| heads.iter().map(|&h| matrix(li, h).chunks(n).collect()).collect()).collect();
        print_json(&json!({
            "ids": tr.ids,
            "tokens": labels,
            "prompt_len": tr.prompt_len,
            "generated": generate,
            "layers": layers,
            "heads": heads,
            "attention": nested,
        }))?;
    } else {
        let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        outln!("{title}; rows are queries, columns keys");
        for mat in &mats {
            outln!("\nlayer {} head {}", mat.layer, mat.head);
            out!("{}", render::heatmap(mat, &labels, color));
        }
    }
    do_export(
        c,
        &[Named { name: "attention".into(), shape: vec![layers.len(), heads.len(), n, n], data: &selected_data }],
    )
}

// ---------------------------------------------------------------------------------------------
// logits

/// One candidate next token.
#[derive(Serialize)]
struct Candidate {
    id: u32,
    token: String,
    logit: f32,
    prob: f64,
}

/// A next-token distribution: its top candidates and entropy.
#[derive(Serialize)]
struct Distribution {
    top: Vec<Candidate>,
    entropy: f64,
}

/// How the model rated the token that actually comes next in the prompt.
#[derive(Serialize)]
struct Actual {
    id: u32,
    token: String,
    rank: usize,
    prob: f64,
    surprisal: f64,
}

/// One layer of the logit lens.
#[derive(Serialize)]
struct LensRow {
    /// "embed", or the block's index.
    layer: Value,
    #[serde(flatten)]
    dist: Distribution,
}

/// What `inspect logits` shows of one position.
#[derive(Serialize)]
struct LogitsView {
    position: usize,
    token: String,
    #[serde(flatten)]
    dist: Distribution,
    /// The prompt's next token (none after the last position).
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<Actual>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lens: Option<Vec<LensRow>>,
}

fn distribution(s: &Session, row: &[f32], k: usize) -> Distribution {
    let (top, entropy) = top_k(row, k);
    let top = top.iter().map(|c| Candidate { id: c.id, token: s.label(c.id), logit: c.logit, prob: c.prob }).collect();
    Distribution { top, entropy }
}

fn print_top(top: &[Candidate]) -> Result<()> {
    outln!("  {:>4} {:>6}  {:<18} {:>10} {:>9}", "rank", "id", "token", "logit", "prob");
    for (r, t) in top.iter().enumerate() {
        outln!("  {:>4} {:>6}  {:<18} {:>10.4} {:>9.5}", r + 1, t.id, format!("{:?}", t.token), t.logit, t.prob);
    }
    Ok(())
}

fn logits(c: &Common, k: usize, position: Option<usize>, all: bool, lens: bool) -> Result<()> {
    let s = Session::open(c)?;
    let m = &s.loaded.model;
    let cfg = &m.config;
    let (t, v, ch) = (s.ids.len(), cfg.vocab_size, cfg.n_embd);
    if let Some(p) = position {
        if p >= t {
            bail!("--position {p} is out of range: the prompt has {t} tokens (positions 0..{})", t - 1);
        }
    }
    let spec = TraceSpec {
        generate: 0,
        want: if lens { |p| matches!(p, Point::Embed | Point::Block(_)) } else { |_| false },
        all_logits: true,
    };
    let tr = trace(m, &s.ids, &spec)?;
    let positions: Vec<usize> = if all { (0..t).collect() } else { vec![position.unwrap_or(t - 1)] };
    // The logit lens: the residual stream after the embeddings and after each block, through ln_f
    // and the vocabulary projection. After the last block this is exactly the model's logits.
    let mut hidden = Vec::new();
    if lens {
        hidden.extend(tr.rows(Point::Embed).context("no embeddings recorded")?.1);
        for l in 0..cfg.n_layer {
            hidden.extend(tr.rows(Point::Block(l)).context("no block output recorded")?.1);
        }
    }
    let views: Vec<LogitsView> = positions
        .iter()
        .map(|&p| {
            let row = &tr.logits[p * v..(p + 1) * v];
            let next = s.ids.get(p + 1).map(|&id| {
                let sc = kvgpt::score::token_score(row, id, p + 1, p + 1);
                Actual { id, token: s.label(id), rank: sc.rank, prob: sc.prob, surprisal: sc.surprisal }
            });
            let lens = lens.then(|| {
                let rows: Vec<f32> =
                    (0..=cfg.n_layer).flat_map(|l| hidden[(l * t + p) * ch..][..ch].iter().copied()).collect();
                let lens_logits = m.logits_of_hidden(&rows);
                (0..=cfg.n_layer)
                    .map(|l| LensRow {
                        layer: if l == 0 { json!("embed") } else { json!(l - 1) },
                        dist: distribution(&s, &lens_logits[l * v..(l + 1) * v], k),
                    })
                    .collect()
            });
            LogitsView { position: p, token: s.label(s.ids[p]), dist: distribution(&s, row, k), next, lens }
        })
        .collect();
    if c.io.json {
        let v = if all { serde_json::to_value(&views)? } else { serde_json::to_value(&views[0])? };
        print_json(&v)?;
    } else {
        for view in &views {
            outln!(
                "position {} ({:?}): next-token distribution, entropy {:.4} nats",
                view.position,
                view.token,
                view.dist.entropy
            );
            print_top(&view.dist.top)?;
            if let Some(n) = &view.next {
                outln!(
                    "  the prompt's next token {:?} (id {}): rank {}, prob {}, surprisal {:.3} nats",
                    n.token,
                    n.id,
                    n.rank,
                    render::prob(n.prob),
                    n.surprisal
                );
            }
            if let Some(lens) = &view.lens {
                outln!("  logit lens (ln_f + vocabulary projection of the residual stream after each layer):");
                for e in lens {
                    let tops: Vec<String> = e.dist.top.iter().map(|t| format!("{:?} {:.3}", t.token, t.prob)).collect();
                    let name = match e.layer.as_str() {
                        Some(s) => s.to_string(),
                        None => format!("layer {}", e.layer),
                    };
                    outln!("    {name:<9} H={:.3}  {}", e.dist.entropy, tops.join(", "));
                }
            }
            outln!("");
        }
    }
    let mut tensors = vec![Named { name: "logits".into(), shape: vec![t, v], data: &tr.logits }];
    if lens {
        tensors.push(Named { name: "hidden".into(), shape: vec![cfg.n_layer + 1, t, ch], data: &hidden });
    }
    do_export(c, &tensors)
}

// ---------------------------------------------------------------------------------------------
// cache

fn cache(c: &Common, generate: usize) -> Result<()> {
    let s = Session::open(c)?;
    let m = &s.loaded.model;
    let cfg = &m.config;
    let (nh, hs, np) = (cfg.n_head, cfg.head_dim(), cfg.n_positions);
    let spec = TraceSpec { generate, want: |_| false, all_logits: false };
    let tr = trace(m, &s.ids, &spec)?;
    let t = tr.prompt_len;
    let layer_view = |len: usize| -> Vec<Value> {
        (0..cfg.n_layer)
            .map(|l| {
                json!({
                    "layer": l,
                    "k_shape": [nh, len, hs],
                    "v_shape": [nh, len, hs],
                    "dtype": "f32",
                    "bytes_used": 2 * nh * len * hs * 4,
                    "bytes_allocated": 2 * nh * np * hs * 4,
                })
            })
            .collect()
    };
    let steps: Vec<Value> = (0..generate)
        .map(|i| {
            let pos = t + i;
            let id = tr.ids[pos];
            json!({
                "step": i + 1,
                "token_id": id,
                "token": s.label(id),
                "position": pos,
                "read_from_cache": [0, pos],
                "computed": [pos, pos + 1],
                "cache_len_after": pos + 1,
            })
        })
        .collect();
    let view = json!({
        "n_positions": np, "n_layer": cfg.n_layer, "n_head": nh, "head_dim": hs, "dtype": "f32",
        "prompt_tokens": t,
        "after_prefill": {"len": t, "fill": t as f64 / np as f64, "layers": layer_view(t)},
        "steps": steps,
        "final": {"len": tr.cache.len(), "fill": tr.cache.len() as f64 / np as f64, "layers": layer_view(tr.cache.len())},
        "total_bytes_allocated": tr.cache.bytes(),
    });
    if c.io.json {
        print_json(&view)?;
    } else {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        outln!(
            "KV cache: {} layers × (K, V), each [n_head={nh}, positions, head_dim={hs}] f32, preallocated to {np} positions ({:.2} MiB)",
            cfg.n_layer,
            mib(tr.cache.bytes())
        );
        outln!("after the prompt ({t} tokens, computed together in one prefill call):");
        for l in 0..cfg.n_layer {
            outln!(
                "  layer {l}: K [{nh}, {t}, {hs}]  V [{nh}, {t}, {hs}]  {:.3} MiB used of {:.3} MiB, fill {t}/{np}",
                mib(2 * nh * t * hs * 4),
                mib(2 * nh * np * hs * 4)
            );
        }
        for st in &steps {
            let pos = st["position"].as_u64().unwrap_or(0);
            outln!(
                "decode step {}: token {} {:?} at position {pos}: K,V of the {pos} cached positions 0-{} read, \
                 q,k,v of position {pos} computed and its K,V written at {pos}; cache length now {}",
                st["step"],
                st["token_id"],
                st["token"].as_str().unwrap_or(""),
                pos.saturating_sub(1),
                pos + 1
            );
        }
        if generate > 0 {
            let len = tr.cache.len();
            outln!("final: every layer K [{nh}, {len}, {hs}] V [{nh}, {len}, {hs}], fill {len}/{np}");
        }
    }
    let len = tr.cache.len();
    let mut k = Vec::with_capacity(cfg.n_layer * nh * len * hs);
    let mut v = Vec::with_capacity(k.capacity());
    for l in 0..cfg.n_layer {
        k.extend(tr.cache.gather(l, KvPart::K));
        v.extend(tr.cache.gather(l, KvPart::V));
    }
    let shape = vec![cfg.n_layer, nh, len, hs];
    do_export(
        c,
        &[Named { name: "k".into(), shape: shape.clone(), data: &k }, Named { name: "v".into(), shape, data: &v }],
    )
}

// ---------------------------------------------------------------------------------------------
// explain

fn first(v: &[f32], n: usize) -> String {
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
    let spec = TraceSpec { generate: 1, want: |_| true, all_logits: false };
    let tr: Trace = trace(m, &s.ids, &spec)?;
    let pre = tr.recorder.calls.first().context("no prefill recorded")?;
    let get = |p: Point| pre.get(&p).map(|r| r.data.as_slice()).unwrap_or(&[]);
    let last = t - 1;

    outln!("A forward pass of {} on {:?}, step by step, with the engine's real numbers.\n", s.loaded.files.name, text);
    outln!("1. Text → tokens → ids. The GPT-2 byte-level BPE tokenizer splits the text into {t} tokens:");
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

    outln!(
        "4. The same for layers 1 to {}. Then ln_f, and the logits are ln_f(x) · wteᵀ (the vocabulary projection",
        nl - 1
    );
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
