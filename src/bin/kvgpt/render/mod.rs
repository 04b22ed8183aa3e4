//! Drawing attention: one [`Grid`] (a labelled heatmap, the library's `views::grid`) drawn as
//! terminal text ([`term`]), SVG ([`svg`]) or one self-contained HTML viewer ([`html`], the
//! library's `views::attention_html`, which the Python package draws too), all with the same
//! colour scale: white for no weight, dark blue for all of it.

pub mod cache;
pub mod cache_html;
pub mod cache_svg;
pub mod cache_term;
pub mod svg;
pub mod term;

pub use grid::{axis_label, prob, Grid, Tick};
pub use kvgpt::views::attention_html as html;
pub use kvgpt::views::grid;
