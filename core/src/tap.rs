//! Named taps: the forward pass reports what it computes at named points (`"ln_1"` of layer 0,
//! `"attn_probs"` of layer 3, …) to an observer. Generation passes [`NoTap`], which asks for
//! nothing, so the only cost is one virtual call per point; inspection passes a [`Recorder`].

use std::collections::BTreeMap;

/// A point in the forward pass. Layer points carry their layer index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Point {
    /// `wte[ids] + wpe[positions]`, `[T, C]`.
    Embed,
    /// Output of `ln_1`, `[T, C]`.
    Ln1(usize),
    /// Output of the fused `attn.c_attn`, `[T, 3C]` (q | k | v).
    CAttn(usize),
    /// Attention scores before the softmax, `q·k / √HS`, `[NH, T, P+T]` (−∞ above the causal
    /// diagonal: the mask).
    AttnScores(usize),
    /// Softmax attention weights, `[NH, T, P+T]` (0 above the causal diagonal).
    AttnProbs(usize),
    /// Output of `attn.c_proj` before the residual, `[T, C]`.
    AttnProj(usize),
    /// Output of `ln_2`, `[T, C]`.
    Ln2(usize),
    /// Output of `mlp.c_fc` after GELU, `[T, F]`.
    MlpAct(usize),
    /// Output of `mlp.c_proj` before the residual, `[T, C]`.
    MlpProj(usize),
    /// The residual stream after the block, `[T, C]`.
    Block(usize),
    /// Output of `ln_f` for the rows whose logits are computed, `[R, C]`.
    LnF,
    /// Logits of those rows, `[R, V]`.
    Logits,
}

impl Point {
    /// The checkpoint-style name of the point.
    pub fn name(self) -> &'static str {
        match self {
            Point::Embed => "embed",
            Point::Ln1(_) => "ln_1",
            Point::CAttn(_) => "c_attn",
            Point::AttnScores(_) => "attn_scores",
            Point::AttnProbs(_) => "attn_probs",
            Point::AttnProj(_) => "attn_proj",
            Point::Ln2(_) => "ln_2",
            Point::MlpAct(_) => "mlp_act",
            Point::MlpProj(_) => "mlp_proj",
            Point::Block(_) => "block",
            Point::LnF => "ln_f",
            Point::Logits => "logits",
        }
    }

    pub fn layer(self) -> Option<usize> {
        match self {
            Point::Ln1(l)
            | Point::CAttn(l)
            | Point::AttnScores(l)
            | Point::AttnProbs(l)
            | Point::AttnProj(l)
            | Point::Ln2(l)
            | Point::MlpAct(l)
            | Point::MlpProj(l)
            | Point::Block(l) => Some(l),
            Point::Embed | Point::LnF | Point::Logits => None,
        }
    }

    /// `name` or `name.layer`, the key used in exported files.
    pub fn key(self) -> String {
        match self.layer() {
            Some(l) => format!("{}.{l}", self.name()),
            None => self.name().to_string(),
        }
    }
}

/// An observer of the forward pass.
pub trait Tap {
    /// Called when a forward call over `t` tokens at positions `p..p+t` starts.
    fn begin(&mut self, _p: usize, _t: usize) {}
    /// Whether the forward pass should report `point`. Attention weights are only materialised
    /// when asked for.
    fn wants(&self, point: Point) -> bool;
    /// Called with the tensor at `point`, row-major with `shape`.
    fn record(&mut self, point: Point, shape: &[usize], data: &[f32]);
}

/// Wants nothing: the tap generation uses.
pub struct NoTap;

impl Tap for NoTap {
    fn wants(&self, _: Point) -> bool {
        false
    }
    fn record(&mut self, _: Point, _: &[usize], _: &[f32]) {}
}

/// A recorded tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Records the points it was built to want (all of them by default), one tensor per point per
/// forward call; the calls of a run are kept in order.
#[derive(Default)]
pub struct Recorder {
    filter: Option<fn(Point) -> bool>,
    /// One map per forward call.
    pub calls: Vec<BTreeMap<Point, Recorded>>,
}

impl Recorder {
    /// Records every point.
    pub fn all() -> Recorder {
        Recorder::default()
    }

    /// Records the points for which `f` is true.
    pub fn only(f: fn(Point) -> bool) -> Recorder {
        Recorder { filter: Some(f), ..Recorder::default() }
    }

    /// The tensor at `point` in the last call.
    pub fn last(&self, point: Point) -> Option<&Recorded> {
        self.calls.last()?.get(&point)
    }
}

impl Tap for Recorder {
    fn wants(&self, point: Point) -> bool {
        self.filter.is_none_or(|f| f(point))
    }
    fn begin(&mut self, _p: usize, _t: usize) {
        self.calls.push(BTreeMap::new());
    }
    fn record(&mut self, point: Point, shape: &[usize], data: &[f32]) {
        let Some(call) = self.calls.last_mut() else {
            return;
        };
        call.insert(point, Recorded { shape: shape.to_vec(), data: data.to_vec() });
    }
}
