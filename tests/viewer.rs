//! The HTML attention viewer in a real browser: Debian's headless Chromium, driven over WebDriver
//! by its chromedriver. The page loads nothing from anywhere; its pickers, hover lines, heatmap,
//! divider and all-heads view show HF's attention weights (the fixture's reference); and its
//! screenshot shows the colours the DOM says, darker for more weight.
//!
//! Without `chromium` and `chromedriver` on PATH the test says it skipped, unless
//! KVGPT_REQUIRE_BROWSER=1 (as `.ci/run` sets), where a missing browser fails it
//! (tests/common/browser.rs).

mod common;

use common::browser::{kvgpt_json, luma, rgb, Browser};
use common::*;
use serde_json::json;
use std::path::Path;
use std::process::Command;

/// `[[q, k, w, head], …]` of every element matching `css` with data-q/k/w/head.
fn weighted(b: &Browser, css: &str) -> Vec<(usize, usize, f64, usize)> {
    let v = b.js(
        "return [...document.querySelectorAll(arguments[0])].map(e => [+e.dataset.q, +e.dataset.k, +e.dataset.w, +e.dataset.head])",
        json!([css]),
    );
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_u64().unwrap() as usize,
                r[1].as_u64().unwrap() as usize,
                r[2].as_f64().unwrap(),
                r[3].as_u64().unwrap() as usize,
            )
        })
        .collect()
}

#[test]
fn the_html_viewer_in_headless_chromium() {
    let Some((chromium, driver)) = common::browser::find("the_html_viewer_in_headless_chromium") else { return };
    let reference = Reference::load();
    let p = &reference.prompts()[1];
    let t = p.ids.len();
    let gen = 3;
    let s = t + gen;
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("attention.html");
    let m = fixture_dir().to_string_lossy().into_owned();
    let gen_s = gen.to_string();
    // The decoded rows (no reference has them) are checked against the engine's own --json,
    // whose prompt rows tests/inspect.rs checks against the reference.
    let engine = kvgpt_json(&[
        "inspect",
        "attention",
        &p.text,
        "--model",
        &m,
        "--generate",
        &gen_s,
        "--json",
        "--html",
        page.to_str().unwrap(),
    ]);
    let b = Browser::start(&chromium, &driver, &dir.path().join("profile"));
    let url = format!("file://{}", page.display());
    b.open(&url);
    b.assert_self_contained();
    // The pickers: every layer, every head and "all".
    let options =
        |id: &str| b.js(&format!("return [...document.querySelectorAll('#{id} option')].map(o => o.value)"), json!([]));
    assert_eq!(options("layer"), json!(["0", "1"]));
    assert_eq!(options("head"), json!(["0", "1", "2", "3", "all"]));

    // Layer 1, head 2, picked as a user picks them.
    b.click("#layer option[value='1']");
    b.click("#head option[value='2']");
    assert_eq!(b.js("return location.hash", json!([])), json!(format!("#layer=1&head=2&query={}", s - 1)));
    let (_, want) = reference.tensor("p1.attn.1").unwrap();
    let hf = |h: usize, q: usize, k: usize| want[(h * t + q) * t + k] as f64;
    let ours = |l: usize, h: usize, q: usize, k: usize| engine["attention"][l][h][q][k].as_f64().unwrap();
    let cells = weighted(&b, "#grid .cell");
    assert_eq!(cells.len(), s * (s + 1) / 2, "one cell per query and key at or before it");
    for &(q, k, w, h) in &cells {
        assert!(k <= q && h == 2);
        let expect = if q < t { hf(2, q, k) } else { ours(1, 2, q, k) };
        assert!((w - expect).abs() < 2e-4, "cell {q},{k}: {w} vs {expect}");
    }
    // Axis labels on both sides: every position, with its token.
    let tokens = engine["tokens"].as_array().unwrap();
    let labels =
        |css: &str| b.js(&format!("return [...document.querySelectorAll('{css}')].map(e => e.textContent)"), json!([]));
    let axis = |i: usize| format!("{i} {}", tokens[i].as_str().unwrap().replace(' ', "·"));
    let expected: Vec<String> = (0..s).map(axis).collect();
    assert_eq!(labels("#grid .col-label"), json!(expected));
    assert_eq!(labels("#grid .row-label"), json!(expected));
    // The divider runs between the last prompt row and the first decoded one.
    let divider_y = b.js("return +document.querySelector('#grid .divider').getAttribute('y1')", json!([]));
    let first_decoded_y =
        b.js(&format!("return +document.querySelector('#grid .cell[data-q=\"{t}\"]').getAttribute('y')"), json!([]));
    assert_eq!(divider_y, first_decoded_y);
    assert_eq!(b.js("return document.querySelectorAll('#lines .divider').length", json!([])), json!(1));

    // Hover a query token: its lines only, one per key at or before it, as strong as its weights;
    // the keys it reads shaded by them; the readout names what it attends to most.
    let q = 9;
    b.hover(&format!("#lines .tok.q[data-pos='{q}'] text"));
    let lines = weighted(&b, "#attn-lines line");
    assert_eq!(lines.len(), q + 1);
    for &(lq, k, w, h) in &lines {
        assert_eq!((lq, h), (q, 2));
        assert!((w - hf(2, q, k)).abs() < 2e-4, "line {q}→{k}: {w} vs {}", hf(2, q, k));
    }
    // What the eye sees of a line is its opacity: HF's weight.
    let opacity = b.js(
        "return [...document.querySelectorAll('#attn-lines line')].map(l => [+l.dataset.k, +l.getAttribute('stroke-opacity')])",
        json!([]),
    );
    for o in opacity.as_array().unwrap() {
        let (k, a) = (o[0].as_u64().unwrap() as usize, o[1].as_f64().unwrap());
        assert!((a - hf(2, q, k)).abs() < 2e-4, "opacity of {q}→{k}: {a}");
    }
    let best = (0..=q).max_by(|&a, &c| hf(2, q, a).total_cmp(&hf(2, q, c))).unwrap();
    let readout = b.js("return document.getElementById('readout').textContent", json!([]));
    assert!(readout.as_str().unwrap().contains(&format!("attends most to {}", axis(best))), "{readout}");
    let shaded = b.js("return [...document.querySelectorAll('#lines .tok.k rect.bg[data-w]')].length", json!([]));
    assert_eq!(shaded, json!(q + 1));
    // Hover a key token: the lines into it, from it and every later query.
    let k = 4;
    b.hover(&format!("#lines .tok.k[data-pos='{k}'] text"));
    let lines = weighted(&b, "#attn-lines line");
    assert_eq!(lines.iter().map(|l| l.0).collect::<Vec<_>>(), (k..s).collect::<Vec<_>>());
    assert!(lines.iter().all(|l| l.1 == k));

    // The screenshot shows what the DOM says: each cell's pixels are its fill, more weight is
    // darker, and a masked cell is grey.
    b.hover("h1");
    b.js("document.getElementById('grid').scrollIntoView()", json!([]));
    let png_bytes = b.screenshot();
    std::fs::write(Path::new(env!("CARGO_TARGET_TMPDIR")).join("attention-viewer.png"), &png_bytes).unwrap();
    let shot = common::browser::Shot::decode(&png_bytes);
    let px = |x: f64, y: f64| shot.px(x, y);
    let boxes = b.js(
        "return [...document.querySelectorAll('#grid .cell')].map(e => { const r = e.getBoundingClientRect(); \
         return [r.x + r.width / 2, r.y + r.height / 2, +e.dataset.w, getComputedStyle(e).fill]; })",
        json!([]),
    );
    let mut seen = Vec::new();
    for bx in boxes.as_array().unwrap() {
        let (x, y, w, fill) =
            (bx[0].as_f64().unwrap(), bx[1].as_f64().unwrap(), bx[2].as_f64().unwrap(), rgb(bx[3].as_str().unwrap()));
        let got = px(x, y);
        assert!((0..3).all(|c| got[c].abs_diff(fill[c]) <= 2), "pixel at {x},{y}: {got:?}, fill {fill:?}");
        seen.push((w, luma(got)));
    }
    seen.sort_by(|a, c| a.0.total_cmp(&c.0));
    for pair in seen.windows(2) {
        assert!(pair[1].1 <= pair[0].1 + 1.0, "more weight must not be lighter: {pair:?}");
    }
    assert!(seen[0].1 > 230.0 && seen.last().unwrap().1 < 140.0, "the scale runs from near white to dark: {seen:?}");
    let masked = b.js(
        "const c = document.querySelector('#grid .cell[data-q=\"0\"][data-k=\"0\"]').getBoundingClientRect(); \
         return [c.x + c.width * 1.5, c.y + c.height / 2]",
        json!([]),
    );
    assert_eq!(px(masked[0].as_f64().unwrap(), masked[1].as_f64().unwrap()), [0xd9; 3], "a masked cell is grey");

    // All heads: one query over every head, chosen by clicking its token; the address keeps it.
    b.click("#head option[value='all']");
    let qa = 6;
    b.click(&format!("#lines .tok.q[data-pos='{qa}'] text"));
    assert_eq!(b.js("return location.hash", json!([])), json!(format!("#layer=1&head=all&query={qa}")));
    let cells = weighted(&b, "#grid .cell");
    assert_eq!(cells.len(), 4 * (qa + 1));
    for &(cq, k, w, h) in &cells {
        assert_eq!(cq, qa);
        assert!((w - hf(h, qa, k)).abs() < 2e-4, "head {h} key {k}: {w} vs {}", hf(h, qa, k));
    }
    let colours = b.js(
        "return new Set([...document.querySelectorAll('#attn-lines line')].map(l => l.getAttribute('stroke'))).size",
        json!([]),
    );
    assert_eq!(colours, json!(4), "one colour per head");
    // On the clicked token, and away from it: its lines in every head; on another query, that
    // one's; on a key, the lines into it from every head.
    let count = || b.js("return document.querySelectorAll('#attn-lines line').length", json!([]));
    assert_eq!(count(), json!(4 * (qa + 1)));
    b.hover("h1");
    assert_eq!(count(), json!(4 * (qa + 1)));
    b.hover("#lines .tok.q[data-pos='2'] text");
    assert_eq!(count(), json!(4 * 3));
    b.hover("#lines .tok.k[data-pos='2'] text");
    assert_eq!(count(), json!(4 * (s - 2)));
    // The heads' switches: head 1 off leaves three heads' lines, on again all four.
    b.hover("h1");
    b.click("#head-switches .head-switch[data-head='1']");
    let heads_drawn = || {
        b.js(
            "return [...new Set([...document.querySelectorAll('#attn-lines line')].map(l => +l.dataset.head))].sort()",
            json!([]),
        )
    };
    assert_eq!(heads_drawn(), json!([0, 2, 3]));
    b.click("#head-switches .head-switch[data-head='1']");
    assert_eq!(heads_drawn(), json!([0, 1, 2, 3]));

    // The model view: a thumbnail per layer × head, its pixels HF's weights' colours; a click
    // opens that head.
    assert_eq!(b.js("return document.querySelectorAll('#model canvas.thumb').length", json!([])), json!(8));
    let thumb = b.js(
        "const c = document.querySelector('#model canvas.thumb[data-layer=\"0\"][data-head=\"1\"]'); \
         const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; \
         return [c.width, [...d.slice(4 * (arguments[0] * c.width + 2), 4 * (arguments[0] * c.width + 2) + 3)], \
                 [...d.slice(4 * 3, 4 * 3 + 3)]]",
        json!([5]),
    );
    assert_eq!(thumb[0], json!(s));
    let (pixel, masked) = (thumb[1].as_array().unwrap(), thumb[2].as_array().unwrap());
    assert_eq!(
        b.js("return document.querySelectorAll('#scale .step').length", json!([])),
        json!(100),
        "the colour bar"
    );
    // Query 0 cannot read key 3 (masked grey); query 5's pixel for key 2 is the colour the
    // heatmap of that head gives the cell, whose weight is HF's.
    assert_eq!(masked.iter().map(|x| x.as_u64().unwrap() as u8).collect::<Vec<_>>(), [0xd9; 3]);
    b.click("#model canvas.thumb[data-layer='0'][data-head='1']");
    assert_eq!(
        b.js("return [layer.value, head.value, location.hash]", json!([])),
        json!(["0", "1", format!("#layer=0&head=1&query={qa}")])
    );
    let cell = b.js(
        "const c = document.querySelector('#grid .cell[data-q=\"5\"][data-k=\"2\"]'); return [+c.dataset.w, getComputedStyle(c).fill]",
        json!([]),
    );
    let (_, want0) = reference.tensor("p1.attn.0").unwrap();
    assert!((cell[0].as_f64().unwrap() - want0[(t + 5) * t + 2] as f64).abs() < 2e-4);
    let fill = rgb(cell[1].as_str().unwrap());
    assert_eq!(pixel.iter().map(|x| x.as_u64().unwrap() as u8).collect::<Vec<_>>(), fill, "thumbnail = heatmap");
    // Leaving a heatmap cell lets the lines go back to every query's.
    b.hover("#grid .cell[data-q='4'][data-k='1']");
    assert_eq!(count(), json!(5));
    b.hover("h1");
    assert_eq!(count(), json!(s * (s + 1) / 2));
    assert_eq!(
        b.js("return document.getElementById('readout').textContent", json!([])),
        json!("Hover a token or a cell.")
    );

    // A linked view opens as linked.
    b.open(&format!("{url}#layer=0&head=3&query=2"));
    assert_eq!(b.js("return [layer.value, head.value]", json!([])), json!(["0", "3"]));
    let cells = weighted(&b, "#grid .cell[data-q='5']");
    assert_eq!(cells.len(), 6);
    for &(_, k, w, _) in &cells {
        assert!((w - want0[(3 * t + 5) * t + k] as f64).abs() < 2e-4);
    }

    // Labels stay inside their pictures: no text starts left of its SVG's edge.
    let clipped = b.js(
        "return [...document.querySelectorAll('#lines text, #grid text')].filter(t => t.getBBox().x < 0).map(t => t.textContent)",
        json!([]),
    );
    assert_eq!(clipped, json!([]));

    // A page made with --query opens on that query over every head, even for one head.
    let page = dir.path().join("query.html");
    let out = Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(["inspect", "attention", &p.text, "--model", &m, "--query", "3", "--layer", "1", "--head", "2", "--html"])
        .arg(&page)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    b.open(&format!("file://{}", page.display()));
    assert_eq!(
        b.js("return [layer.value, head.value, location.hash]", json!([])),
        json!(["1", "all", "#layer=1&head=all&query=3"])
    );
    let cells = weighted(&b, "#grid .cell");
    assert_eq!(cells.len(), 4);
    for &(cq, k, w, h) in &cells {
        assert_eq!((cq, h), (3, 2));
        assert!((w - hf(2, 3, k)).abs() < 2e-4);
    }
}
