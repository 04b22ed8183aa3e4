//! The cache view as one self-contained HTML page (its data, style and script inline; nothing is
//! fetched): step buttons and a slider through the prefill and each decode step, layer and head
//! pickers, the cache with and without itself side by side (rows written or recomputed by the step
//! highlighted, the query's weight on each cached key), the work table and its ratio over the
//! steps, the scores with the mask as −∞, and the K and V values of the chosen head.

use super::cache::CacheView;
use super::grid::{xml_escape, PALETTE, READ, WRITTEN};
use kvgpt_core::error::{Error, Result};
use serde_json::{json, Value};
use std::fmt::Write as _;

/// Numbers in the page: five decimals (counts are integers and stay exact).
fn round(v: &mut Value) {
    match v {
        Value::Number(n) if n.is_f64() => {
            let x = (n.as_f64().unwrap_or(0.0) * 1e5).round() / 1e5;
            *v = json!(x);
        }
        Value::Array(a) => a.iter_mut().for_each(round),
        Value::Object(o) => o.values_mut().for_each(round),
        _ => {}
    }
}

/// The block table, PagedAttention's picture: each logical block of positions, the pool's block
/// that holds it, and the step that took it (a cache takes blocks as tokens arrive).
fn block_table(out: &mut String, v: &CacheView) {
    let stored = v.block_table.iter().any(|e| e.stored.is_some());
    let _ = writeln!(
        out,
        "<table id=\"blocks\"><caption>Block table: blocks of {} positions, {} (logical → the pool's block)</caption>\n\
         <tr><th>logical</th><th>positions</th><th>physical</th><th>taken by</th>{}</tr>",
        v.block_size,
        v.kv_dtype,
        if stored { "<th>--kv-disk (content address)</th>" } else { "" }
    );
    for e in &v.block_table {
        let by = if e.step == 0 { "the prefill".to_string() } else { format!("step {}", e.step) };
        let tier = e.stored.as_ref().map_or(String::new(), |s| {
            let class = match (s.tier, s.same_bits) {
                (None, _) => "absent",
                (Some(_), Some(true)) => "same",
                _ => "differs",
            };
            format!("<td class=\"{class}\">{} <code>{}…</code></td>", s.words(), &s.key[..16])
        });
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}–{}</td><td>#{}</td><td>{by}</td>{tier}</tr>",
            e.logical,
            e.positions[0],
            e.positions[1].saturating_sub(1),
            e.physical
        );
    }
    out.push_str("</table>\n");
}

pub fn html(v: &CacheView) -> Result<String> {
    let mut data = serde_json::to_value(v).map_err(|e| Error::Invalid(format!("the cache view as JSON: {e}")))?;
    round(&mut data);
    let page = json!({ "view": data, "palette": PALETTE, "written": WRITTEN, "read": READ });
    // `<` only occurs inside JSON strings, where \u003c is the same character.
    let page = page.to_string().replace('<', "\\u003c");
    let title = format!("The KV cache of {}, step by step", v.model);
    let mut out = String::new();
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n");
    let _ = writeln!(out, "<title>{}</title>", xml_escape(&title));
    let _ = writeln!(out, "<style>\n{}</style>\n</head>\n<body>", include_str!("cache_viewer.css"));
    let _ = writeln!(out, "<h1>{}</h1>", xml_escape(&title));
    let _ = writeln!(
        out,
        "<p class=\"how\">Step 0 is the prefill: the prompt's tokens run together and leave their K and V in every \
         layer's cache. Each decode step runs one new token: it computes only its own q, k, v, writes its K and V \
         (<span class=\"key written\">orange</span>) and its query reads every cached key \
         (<span class=\"key read\">grey-blue</span>) — its weight on each is the blue bar. Without the cache the \
         same step runs every earlier position again. Scores and K/V values are of layer {} head {} \
         (<code>--layer</code>, <code>--head</code>). “·” is a space.</p>",
        v.layer, v.head
    );
    out.push_str(
        "<div id=\"controls\">\n<button id=\"prev\">◀ step</button>\n\
         <input id=\"step\" type=\"range\" min=\"0\" value=\"0\"/>\n<button id=\"next\">step ▶</button>\n\
         <label>Weights of layer <select id=\"layer\"></select></label>\n<label>head <select id=\"head\"></select></label>\n\
         <span id=\"readout\"></span>\n</div>\n<p id=\"summary\"></p>\n\
         <div id=\"work-row\"><table id=\"work\"></table><figure><figcaption>Multiply-adds without the cache ÷ \
         with it, per step (this step outlined)</figcaption><svg id=\"ratios\"></svg></figure></div>\n\
         <div id=\"panels\">\n<figure><figcaption>With the cache</figcaption><svg id=\"cached\"></svg></figure>\n\
         <figure><figcaption>Without the cache: every position runs again</figcaption><svg id=\"uncached\"></svg></figure>\n\
         <figure><figcaption id=\"scores-caption\"></figcaption><svg id=\"scores\"></svg></figure>\n\
         <figure><figcaption id=\"values-caption\"></figcaption><svg id=\"values\"></svg></figure>\n</div>\n",
    );
    block_table(&mut out, v);
    let _ = writeln!(out, "<script type=\"application/json\" id=\"kvgpt-data\">{page}</script>");
    let _ = writeln!(
        out,
        "<script>\n{}{}</script>\n</body>\n</html>",
        crate::render::PAGES_JS,
        include_str!("cache_viewer.js")
    );
    Ok(out)
}
