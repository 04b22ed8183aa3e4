//! Drawing attention: one [`Grid`] (a labelled heatmap, [`grid`]) drawn as
//! terminal text ([`term`]), SVG ([`svg`]) or one self-contained HTML viewer ([`html`], which the
//! Python package draws too), all with the same colour scale: white for no weight, dark blue for
//! all of it; and the cache view's data ([`cache`]) drawn by [`cache_term`], [`cache_svg`] and
//! [`cache_html`].

pub mod cache;
pub mod cache_html;
pub mod cache_svg;
pub mod cache_term;
pub mod svg;
pub mod term;

pub mod attention_html;
pub mod grid;

pub use attention_html as html;
pub use grid::{axis_label, prob, Grid, Tick};

/// The script every self-contained page shares (its view in the address's `#fragment`).
pub const PAGES_JS: &str = include_str!("pages.js");
