//! One self-contained HTML page (no network: its data, style and script are inline) to explore
//! attention: a layer picker, a head picker with "all heads", bertviz-style lines from a token to
//! what it attends to on hover, the heatmap with both axes labelled, and the colour scale.

use super::grid::{axis_label, xml_escape, MASKED, PALETTE};
use serde_json::json;
use std::fmt::Write as _;

/// What the page shows: `weights[layer index][head index]` is an `[S, S]` matrix over `tokens`.
pub struct Viewer<'a> {
    pub title: &'a str,
    pub tokens: &'a [String],
    pub prompt_len: usize,
    pub layers: &'a [usize],
    pub heads: &'a [usize],
    pub weights: Vec<Vec<&'a [f32]>>,
    /// Open on this query over all heads (`--query`), else on the first head.
    pub query: Option<usize>,
}

/// Weights in the page: five decimals (the page shows four).
fn round5(w: f32) -> f64 {
    (f64::from(w) * 1e5).round() / 1e5
}

pub fn html(v: &Viewer) -> String {
    let s = v.tokens.len();
    // attn[layer][head][query] = the weights on keys 0..=query (the rest are masked).
    let attn: Vec<Vec<Vec<Vec<f64>>>> = v
        .weights
        .iter()
        .map(|heads| {
            heads
                .iter()
                .map(|m| (0..s).map(|q| m[q * s..=q * s + q].iter().map(|&w| round5(w)).collect()).collect())
                .collect()
        })
        .collect();
    let data = json!({
        "title": v.title,
        "tokens": v.tokens.iter().map(|t| axis_label(t)).collect::<Vec<_>>(),
        "prompt_len": v.prompt_len,
        "layers": v.layers,
        "heads": v.heads,
        "palette": PALETTE,
        "masked": MASKED,
        "attn": attn,
        "query": v.query,
    });
    // `<` only occurs inside JSON strings, where \u003c is the same character: the data cannot
    // close its <script> element.
    let data = data.to_string().replace('<', "\\u003c");
    let mut out = String::new();
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n");
    let _ = writeln!(out, "<title>{}</title>", xml_escape(v.title));
    let _ = writeln!(out, "<style>\n{}</style>\n</head>\n<body>", include_str!("viewer.css"));
    let _ = writeln!(out, "<h1>{}</h1>", xml_escape(v.title));
    out.push_str(
        "<p class=\"how\">Each query token (left) attends to itself and the tokens before it (right); a \
         line's strength is the attention weight. Hover a token for its lines, hover a cell for its \
         value, pick a layer and a head (or click its thumbnail), or <em>all heads</em> to see one \
         query over every head (click a query token to choose it; the coloured buttons switch a \
         head's lines off and on). “·” is a space.",
    );
    if v.prompt_len < s {
        let _ = write!(
            out,
            " Tokens {}… were decoded one at a time with the KV cache on (below the dashed line).",
            v.prompt_len
        );
    }
    out.push_str("</p>\n");
    out.push_str(
        "<div id=\"controls\">\n<label>Layer <select id=\"layer\"></select></label>\n\
         <label>Head <select id=\"head\"></select></label>\n\
         <span id=\"readout\">Hover a token or a cell.</span>\n</div>\n<svg id=\"scale\"></svg>\n\
         <details id=\"model-view\" open><summary>Every layer and head (click one to open it)</summary>\
         <div id=\"model\"></div></details>\n\
         <div id=\"views\">\n<figure><figcaption>Lines from each query to its keys (opacity = \
         weight; in <em>all heads</em>, one colour per head)</figcaption><div id=\"head-switches\" hidden></div>\
         <svg id=\"lines\"></svg></figure>\n\
         <figure id=\"grid-figure\"><figcaption id=\"grid-caption\"></figcaption><svg id=\"grid\"></svg></figure>\n</div>\n",
    );
    let _ = writeln!(out, "<script type=\"application/json\" id=\"kvgpt-data\">{data}</script>");
    let _ = writeln!(out, "<script>\n{}{}</script>\n</body>\n</html>", super::PAGES_JS, include_str!("viewer.js"));
    out
}
