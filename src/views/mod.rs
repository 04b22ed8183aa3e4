//! Pictures of attention that the CLI and the Python package both draw: the labelled heatmap and
//! its colour scale ([`grid`]), and the self-contained HTML viewer ([`attention_html`]).

pub mod attention_html;
pub mod grid;

/// The script every self-contained page shares (its view in the address's `#fragment`).
pub const PAGES_JS: &str = include_str!("pages.js");
