//! `Model.run_with_cache`: one forward pass with the tensors it computes on the way, under
//! TransformerLens's hook names, each recorded only when asked for.
//!
//! Shapes (batch 1 first, as TransformerLens gives them; T tokens, C channels, NH heads of HS, F
//! the MLP's width, V the vocabulary):
//!
//! | name | shape | what |
//! |---|---|---|
//! | `hook_embed`, `hook_pos_embed` | `[1, T, C]` | the token's `wte` row, the position's `wpe` row |
//! | `blocks.{l}.hook_resid_pre` | `[1, T, C]` | the residual stream entering block l |
//! | `blocks.{l}.ln1.hook_normalized` | `[1, T, C]` | `ln_1`'s output |
//! | `blocks.{l}.attn.hook_q`, `hook_k`, `hook_v` | `[1, T, NH, HS]` | `c_attn`'s output, split |
//! | `blocks.{l}.attn.hook_attn_scores` | `[1, NH, T, T]` | `q·k/√HS`, −∞ where masked |
//! | `blocks.{l}.attn.hook_pattern` | `[1, NH, T, T]` | the softmax of the scores |
//! | `blocks.{l}.hook_attn_out` | `[1, T, C]` | `attn.c_proj`'s output |
//! | `blocks.{l}.hook_resid_mid` | `[1, T, C]` | the residual after attention |
//! | `blocks.{l}.ln2.hook_normalized` | `[1, T, C]` | `ln_2`'s output |
//! | `blocks.{l}.mlp.hook_post` | `[1, T, F]` | `c_fc` after GELU |
//! | `blocks.{l}.hook_mlp_out` | `[1, T, C]` | `mlp.c_proj`'s output |
//! | `blocks.{l}.hook_resid_post` | `[1, T, C]` | the residual leaving block l |
//! | `ln_final.hook_normalized` | `[1, T, C]` | `ln_f`'s output |

use crate::model::{ids_of, Model};
use kvgpt_core::{Point, Tap};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::{BTreeMap, BTreeSet};

/// The hook names of a block, after `blocks.{l}.`.
const BLOCK_HOOKS: [&str; 13] = [
    "hook_resid_pre",
    "ln1.hook_normalized",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_attn_scores",
    "attn.hook_pattern",
    "hook_attn_out",
    "hook_resid_mid",
    "ln2.hook_normalized",
    "mlp.hook_post",
    "hook_mlp_out",
    "hook_resid_post",
];

/// Every hook name of a model with `n_layer` blocks, in the order of the forward pass.
pub(crate) fn hook_names(n_layer: usize) -> Vec<String> {
    let mut v = vec!["hook_embed".to_string(), "hook_pos_embed".to_string()];
    for l in 0..n_layer {
        v.extend(BLOCK_HOOKS.iter().map(|h| format!("blocks.{l}.{h}")));
    }
    v.push("ln_final.hook_normalized".into());
    v
}

/// A hook: a global one, or a block's (its layer and its name after `blocks.{l}.`).
enum Hook<'a> {
    Global(&'a str),
    Block(usize, &'a str),
}

fn parse(name: &str, n_layer: usize) -> Option<Hook<'_>> {
    if let Some(rest) = name.strip_prefix("blocks.") {
        let (l, hook) = rest.split_once('.')?;
        let l: usize = l.parse().ok()?;
        return (l < n_layer && BLOCK_HOOKS.contains(&hook)).then_some(Hook::Block(l, hook));
    }
    ["hook_embed", "hook_pos_embed", "ln_final.hook_normalized"].contains(&name).then_some(Hook::Global(name))
}

/// The taps of the forward pass a hook is made from.
fn points(h: &Hook) -> Vec<Point> {
    match *h {
        Hook::Global("ln_final.hook_normalized") => vec![Point::LnF],
        Hook::Global(_) => vec![],
        Hook::Block(0, "hook_resid_pre") => vec![Point::Embed],
        Hook::Block(l, "hook_resid_pre") => vec![Point::Block(l - 1)],
        Hook::Block(l, "ln1.hook_normalized") => vec![Point::Ln1(l)],
        Hook::Block(l, "attn.hook_attn_scores") => vec![Point::AttnScores(l)],
        Hook::Block(l, "attn.hook_pattern") => vec![Point::AttnProbs(l)],
        Hook::Block(l, "hook_attn_out") => vec![Point::AttnProj(l)],
        Hook::Block(l, "hook_resid_mid") => {
            vec![if l == 0 { Point::Embed } else { Point::Block(l - 1) }, Point::AttnProj(l)]
        }
        Hook::Block(l, "ln2.hook_normalized") => vec![Point::Ln2(l)],
        Hook::Block(l, "mlp.hook_post") => vec![Point::MlpAct(l)],
        Hook::Block(l, "hook_mlp_out") => vec![Point::MlpProj(l)],
        Hook::Block(l, "hook_resid_post") => vec![Point::Block(l)],
        Hook::Block(l, _) => vec![Point::CAttn(l)], // q, k, v
    }
}

/// Records the points it was asked for, each once, keeping the data and its shape (batch 1
/// first) to hand to numpy.
struct Taps {
    wanted: BTreeSet<Point>,
    got: BTreeMap<Point, (Vec<f32>, Vec<usize>)>,
}

impl Tap for Taps {
    fn wants(&self, point: Point) -> bool {
        self.wanted.contains(&point)
    }
    fn record(&mut self, point: Point, shape: &[usize], data: &[f32]) {
        self.got.insert(point, (data.to_vec(), [&[1], shape].concat()));
    }
}

/// The recorded taps, handed to the hooks that read them: the last reader of a point takes its
/// data; the others copy it, or read it in place.
struct Got {
    data: BTreeMap<Point, (Vec<f32>, Vec<usize>)>,
    /// How many of the hooks asked for have still to read each point.
    readers: BTreeMap<Point, usize>,
}

impl Got {
    fn peek(&self, p: Point) -> &(Vec<f32>, Vec<usize>) {
        &self.data[&p]
    }

    /// One reader of `p` is done with it: the last takes its data.
    fn done(&mut self, p: Point) -> Option<(Vec<f32>, Vec<usize>)> {
        let n = self.readers.get_mut(&p)?;
        *n -= 1;
        if *n == 0 {
            self.data.remove(&p)
        } else {
            None
        }
    }

    fn take(&mut self, p: Point) -> (Vec<f32>, Vec<usize>) {
        self.done(p).unwrap_or_else(|| self.data[&p].clone())
    }
}

#[pymethods]
impl Model {
    /// Every hook name `run_with_cache` knows for this model, in the order of the forward pass.
    fn hook_names(&self) -> Vec<String> {
        hook_names(self.e.model().config.n_layer)
    }

    /// One forward pass over `input` (a text or token ids) from an empty cache: the logits of
    /// every position (`[1, T, V]`) and a dict of the hooks asked for (`names`, default all) as
    /// numpy arrays, each what the forward pass computed, bit for bit.
    #[pyo3(signature = (input, names=None))]
    fn run_with_cache<'py>(
        &self,
        py: Python<'py>,
        input: &Bound<'py, PyAny>,
        names: Option<Vec<String>>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyDict>)> {
        let cfg = self.e.model().config.clone();
        let ids = ids_of(&self.e, input)?;
        let names = names.unwrap_or_else(|| hook_names(cfg.n_layer));
        let mut hooks = Vec::with_capacity(names.len());
        for n in &names {
            hooks.push(parse(n, cfg.n_layer).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "{n:?} is not a hook of this model: see Model.hook_names() ({} layers)",
                    cfg.n_layer
                ))
            })?);
        }
        let wanted: BTreeSet<Point> = hooks.iter().flat_map(points).collect();
        let mut readers = BTreeMap::<Point, usize>::new();
        hooks.iter().flat_map(points).for_each(|p| *readers.entry(p).or_default() += 1);
        let (t, v) = (ids.len(), cfg.vocab_size);
        let (logits, taps) = self.e.tapped(py, &ids, Taps { wanted, got: BTreeMap::new() }, t)?;
        let (c, nh, hs) = (cfg.n_embd, cfg.n_head, cfg.head_dim());
        let mut got = Got { data: taps.got, readers };
        let cache = PyDict::new(py);
        for (name, hook) in names.iter().zip(&hooks) {
            let (data, shape): (Vec<f32>, Vec<usize>) = match *hook {
                Hook::Global("hook_embed") => {
                    let mut d = vec![0.0; t * c];
                    for (row, &id) in d.chunks_mut(c).zip(&ids) {
                        self.e.model().wte.column_into(id as usize, row);
                    }
                    (d, vec![1, t, c])
                }
                Hook::Global("hook_pos_embed") => (self.e.model().wpe[..t * c].to_vec(), vec![1, t, c]),
                Hook::Block(l, h @ ("attn.hook_q" | "attn.hook_k" | "attn.hook_v")) => {
                    // c_attn's rows are q | k | v, each [NH, HS] in order: [T, NH, HS] each.
                    let part = ["attn.hook_q", "attn.hook_k", "attn.hook_v"].iter().position(|&p| p == h).unwrap_or(0);
                    let qkv = &got.peek(Point::CAttn(l)).0;
                    let d = qkv.chunks(3 * c).flat_map(|r| &r[part * c..(part + 1) * c]).copied().collect();
                    got.done(Point::CAttn(l));
                    (d, vec![1, t, nh, hs])
                }
                Hook::Block(l, "hook_resid_mid") => {
                    // The residual plus attention's output: the forward pass's own `x += proj`.
                    let pre = if l == 0 { Point::Embed } else { Point::Block(l - 1) };
                    let ((x, shape), (proj, _)) = (got.peek(pre), got.peek(Point::AttnProj(l)));
                    let d = (x.iter().zip(proj).map(|(a, b)| a + b).collect(), shape.clone());
                    got.done(pre);
                    got.done(Point::AttnProj(l));
                    d
                }
                ref h => got.take(points(h)[0]),
            };
            cache.set_item(name, PyArray1::from_vec(py, data).reshape(shape)?)?;
        }
        let logits = PyArray1::from_vec(py, logits).reshape([1, t, v])?;
        Ok((logits.into_any(), cache))
    }
}
