//! Drawing attention: one [`Grid`] (a labelled heatmap) drawn as terminal text ([`term`]), SVG
//! ([`svg`]) or one self-contained HTML viewer ([`html`]), all with the same colour scale
//! ([`shade`]): white for no weight, dark blue for all of it.

pub mod cache;
pub mod cache_html;
pub mod cache_svg;
pub mod cache_term;
mod grid;
pub mod html;
pub mod svg;
pub mod term;

pub use grid::{axis_label, prob, Grid, Tick};
