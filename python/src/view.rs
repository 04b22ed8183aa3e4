//! `Model.attention_view`: kvgpt's self-contained attention viewer (the page `kvgpt inspect
//! attention --html` writes) for a text, every layer and head, shown inline by Jupyter.

use crate::errors::py_err;
use crate::model::{ids_of, Model};
use kvgpt_core::files::Inputs;
use kvgpt_core::{Point, Recorder};
use kvgpt_views::render::attention_html::{html, Viewer};
use pyo3::prelude::*;

/// kvgpt's attention viewer for a text: one self-contained HTML page (`html`), which Jupyter
/// shows inline (in a sandboxed frame of its own, so its script and style stay out of the
/// notebook's).
#[pyclass(frozen, module = "kvgpt")]
pub struct AttentionView {
    #[pyo3(get)]
    html: String,
    /// The model's files: `save` never writes onto one.
    inputs: Inputs,
}

#[pymethods]
impl AttentionView {
    fn _repr_html_(&self) -> String {
        // A quoted attribute needs only `&` and `"` escaped (`grid::xml_escape` also writes
        // control characters out, which would break the page's script).
        let escaped = self.html.replace('&', "&amp;").replace('"', "&quot;");
        format!(
            r#"<iframe srcdoc="{escaped}" style="width:100%;height:640px;border:0" sandbox="allow-scripts"></iframe>"#
        )
    }

    /// Writes the page to `path` (it opens in any browser, with no network), as the CLI writes
    /// its pages: never onto one of the model's files, and atomically.
    fn save(&self, path: std::path::PathBuf) -> PyResult<()> {
        self.inputs.refuse_as_output(&path).map_err(py_err)?;
        kvgpt_core::export::write_atomic(&path, self.html.as_bytes()).map_err(py_err)
    }
}

#[pymethods]
impl Model {
    /// kvgpt's attention viewer for `input` (a text or token ids), every layer and head: a layer
    /// and head picker, lines from each token to what it attends to, the heatmap.
    fn attention_view(&self, py: Python<'_>, input: &Bound<'_, PyAny>) -> PyResult<AttentionView> {
        let cfg = self.e.model().config.clone();
        let ids = ids_of(&self.e, input)?;
        let t = ids.len();
        let only_probs = Recorder::only(|p| matches!(p, Point::AttnProbs(_)));
        let (_, rec) = self.e.tapped(py, &ids, only_probs, 0)?;
        // Each layer's weights `[NH, T, T]`, one `[T, T]` per head.
        let weights = (0..cfg.n_layer)
            .map(|l| Some(rec.last(Point::AttnProbs(l))?.data.chunks(t * t).collect()))
            .collect::<Option<Vec<Vec<&[f32]>>>>()
            .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("attention weights were not recorded"))?;
        let (e, title) = (&self.e, format!("attention of {} ({} tokens)", self.e.files.name, t));
        let page = py.detach(|| {
            let labels: Vec<String> = ids.iter().map(|&i| e.tokenizer.token_label(i)).collect();
            let (layers, heads): (Vec<usize>, Vec<usize>) = ((0..cfg.n_layer).collect(), (0..cfg.n_head).collect());
            html(&Viewer {
                title: &title,
                tokens: &labels,
                prompt_len: t,
                layers: &layers,
                heads: &heads,
                weights,
                query: None,
            })
        });
        Ok(AttentionView { html: page, inputs: self.e.files.inputs("the model's") })
    }
}
