//! The HTML cache viewer (`inspect cache --html`) in a real browser (tests/common/browser.rs):
//! nothing fetched; the step buttons, the slider and the pickers; the rows each step wrote or
//! read, highlighted; the query's weights, the scores and the K/V values against Hugging Face's
//! (the fixture's reference) or, past the prompt, the engine's --json (which tests/cache_views.rs
//! checks against HF); and the screenshot's pixels are the colours the data says.

mod common;

use common::browser::{kvgpt_json, rgb, Browser, Shot};
use common::*;
use serde_json::json;

/// The viewer's colour scale, ColorBrewer's 9-step "Blues", interpolated linearly: written out
/// here from the scale's published stops, not taken from kvgpt.
fn blues(w: f64) -> [u8; 3] {
    const STOPS: [u32; 9] = [0xf7fbff, 0xdeebf7, 0xc6dbef, 0x9ecae1, 0x6baed6, 0x4292c6, 0x2171b5, 0x08519c, 0x08306b];
    let x = w.clamp(0.0, 1.0) * 8.0;
    let i = (x.floor() as usize).min(7);
    let f = x - i as f64;
    let c = |v: u32, s: u32| ((v >> s) & 0xff) as f64;
    [16, 8, 0].map(|s| (c(STOPS[i], s) + (c(STOPS[i + 1], s) - c(STOPS[i], s)) * f).round() as u8)
}

fn near(a: [u8; 3], b: [u8; 3]) -> bool {
    (0..3).all(|c| a[c].abs_diff(b[c]) <= 2)
}

#[test]
fn the_cache_viewer_in_headless_chromium() {
    let Some((chromium, driver)) = common::browser::find("the_cache_viewer_in_headless_chromium") else { return };
    let r = Reference::load();
    let p = &r.prompts()[1];
    let t = p.ids.len(); // 14: prefill 10, then 4 decode steps of the prompt's tokens, then 2 generated
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("cache.html");
    let m = fixture_dir().to_string_lossy().into_owned();
    let engine = kvgpt_json(&[
        "inspect",
        "cache",
        &p.text,
        "--model",
        &m,
        "--prefill",
        "10",
        "--generate",
        "2",
        "--layer",
        "1",
        "--head",
        "2",
        "--json",
        "--html",
        page.to_str().unwrap(),
    ]);
    let b = Browser::start(&chromium, &driver, &dir.path().join("profile"));
    b.open(&format!("file://{}", page.display()));
    b.assert_self_contained();

    // It opens on the last step (7 steps: 0..6) with the layer and head of --layer/--head.
    let hash = || b.js("return location.hash", json!([]));
    assert_eq!(hash(), json!("#step=6&layer=1&head=2"));
    // A link with a fraction, a name the page does not keep and a layer past the last opens
    // anyway: the fraction ignored, the layer clamped.
    b.call("POST", "/url", json!({ "url": "about:blank" })); // a new load, not a hash change
    b.open(&format!("file://{}#step=2.5&valueOf=1&layer=9", page.display()));
    assert_eq!(hash(), json!("#step=6&layer=1&head=2"));
    b.click("#prev");
    b.click("#prev");
    assert_eq!(hash(), json!("#step=4&layer=1&head=2"));
    b.keys("#step", "\u{E012}"); // ← on the slider
    assert_eq!(hash(), json!("#step=3&layer=1&head=2"));
    b.click("#next");
    assert_eq!(hash(), json!("#step=4&layer=1&head=2"));
    // Step 4 fed the prompt's token 13: it wrote position 13 and read positions 0..=12.
    let a = 13;
    let summary = b.js("return document.getElementById('summary').textContent", json!([])).to_string();
    assert!(summary.contains(&format!("at position {a} reads K,V of positions 0–{}", a - 1)), "{summary}");
    let rows = |css: &str| -> Vec<u64> {
        let v = b.js("return [...document.querySelectorAll(arguments[0])].map(e => +e.dataset.pos)", json!([css]));
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
    };
    assert_eq!(rows("#cached rect.kv.written"), vec![a, a]);
    assert_eq!(rows("#cached rect.kv.read").len(), 2 * a as usize);
    assert_eq!(rows("#uncached rect.kv.written").len(), 2 * (a as usize + 1), "without the cache every row runs");

    // Pick layer 0, head 1 as a user does: the weights are HF's for query 13 of that head.
    b.click("#layer option[value='0']");
    b.click("#head option[value='1']");
    assert_eq!(hash(), json!("#step=4&layer=0&head=1"));
    let attn0 = r.tensor("p1.attn.0").unwrap().1;
    let weights = b.js("return [...document.querySelectorAll('#cached rect.w')].map(e => +e.dataset.w)", json!([]));
    let weights: Vec<f64> = weights.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert_eq!(weights.len(), t);
    for (k, w) in weights.iter().enumerate() {
        let want = attn0[(t + 13) * t + k] as f64; // head 1, query 13
        assert!((w - want).abs() < 2e-4, "weight on key {k}: {w} vs HF {want}");
    }
    b.hover("#cached rect.w[data-pos='5']");
    let readout = b.js("return document.getElementById('readout').textContent", json!([])).to_string();
    assert!(readout.contains(&format!("weight {:.4}", weights[5])), "{readout}");

    // The K and V values of layer 1 head 2 (--layer/--head) at every position: HF's past_key_values.
    for (part, key) in [("K", "k"), ("V", "v")] {
        let hf = r.tensor(&format!("p1.{key}.1")).unwrap().1;
        let got = b.js(
            "return [...document.querySelectorAll(`#values rect.val[data-part='${arguments[0]}']`)].map(e => [+e.dataset.pos, +e.dataset.d, +e.dataset.v])",
            json!([part]),
        );
        let got = got.as_array().unwrap();
        assert_eq!(got.len(), t * 16);
        for c in got {
            let (pos, d, x) =
                (c[0].as_u64().unwrap() as usize, c[1].as_u64().unwrap() as usize, c[2].as_f64().unwrap());
            let want = hf[(2 * t + pos) * 16 + d] as f64;
            assert!((x - want).abs() < 2e-4, "{part}[{pos}][{d}]: {x} vs HF {want}");
        }
    }
    // The prefill's scores: −∞ exactly above the diagonal, the rest the engine's (checked
    // against HF in tests/cache_views.rs).
    b.keys("#step", "\u{E012}\u{E012}\u{E012}\u{E012}");
    assert_eq!(hash(), json!("#step=0&layer=0&head=1"));
    let scores = b.js(
        "return [...document.querySelectorAll('#scores rect.score')].map(e => [+e.dataset.q, +e.dataset.k, e.dataset.s])",
        json!([]),
    );
    let scores = scores.as_array().unwrap();
    assert_eq!(scores.len(), 10 * 10);
    for s in scores {
        let (q, k, x) = (s[0].as_u64().unwrap() as usize, s[1].as_u64().unwrap() as usize, s[2].as_str().unwrap());
        if k > q {
            assert_eq!(x, "-inf");
        } else {
            let want = engine["steps"][0]["scores"][q][k].as_f64().unwrap();
            assert!((x.parse::<f64>().unwrap() - want).abs() < 2e-4);
        }
    }

    // Both heatmaps have a legend (five swatches, −max to +max), and every score is readable on
    // its cell: WCAG's contrast ratio between the text's colour and the cell's at least 4.5.
    for caption in ["scores-caption", "values-caption"] {
        let n = b.js("return document.querySelectorAll('#' + arguments[0] + ' .swatch').length", json!([caption]));
        assert_eq!(n, json!(5), "{caption}");
    }
    let pairs = b.js(
        "return [...document.querySelectorAll('#scores rect.score')].map(r => [getComputedStyle(r).fill, \
         getComputedStyle(r.nextElementSibling).fill])",
        json!([]),
    );
    let luminance = |c: [u8; 3]| {
        let lin = |v: u8| {
            let s = v as f64 / 255.0;
            if s <= 0.04045 {
                s / 12.92
            } else {
                ((s + 0.055) / 1.055).powf(2.4)
            }
        };
        0.2126 * lin(c[0]) + 0.7152 * lin(c[1]) + 0.0722 * lin(c[2])
    };
    for p in pairs.as_array().unwrap() {
        let (cell, text) = (luminance(rgb(p[0].as_str().unwrap())), luminance(rgb(p[1].as_str().unwrap())));
        let ratio = (cell.max(text) + 0.05) / (cell.min(text) + 0.05);
        assert!(ratio >= 4.5, "text {} on {}: contrast {ratio:.2}", p[1], p[0]);
    }

    // The screenshot: written rows orange, read rows grey-blue, each weight the colour of its
    // value on the Blues scale.
    b.click("#next"); // step 1: writes position 10
    b.hover("h1");
    let png_bytes = b.screenshot();
    std::fs::write(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cache-viewer.png"), &png_bytes).unwrap();
    let shot = Shot::decode(&png_bytes);
    let boxes = b.js(
        "return [...document.querySelectorAll('#cached rect.kv, #cached rect.w')].map(e => { const r = e.getBoundingClientRect(); \
         return [r.x + r.width / 2, r.y + r.height / 2, e.getAttribute('class'), +(e.dataset.w || 0), getComputedStyle(e).fill, +e.dataset.pos]; })",
        json!([]),
    );
    let (mut written, mut read, mut shaded) = (0, 0, 0);
    for bx in boxes.as_array().unwrap() {
        let (x, y) = (bx[0].as_f64().unwrap(), bx[1].as_f64().unwrap());
        let got = shot.px(x, y);
        assert!(near(got, rgb(bx[4].as_str().unwrap())), "pixel at {x},{y}: {got:?} vs its fill {}", bx[4]);
        match bx[2].as_str().unwrap() {
            "kv written" => {
                assert!(near(got, [0xf2, 0x8e, 0x2b]) && bx[5] == json!(10), "{bx}");
                written += 1;
            }
            "kv read" => {
                assert!(near(got, [0xc9, 0xd6, 0xe3]), "{bx}");
                read += 1;
            }
            _ => {
                let w = attn0[(t + 10) * t + bx[5].as_u64().unwrap() as usize] as f64; // HF's weight
                assert!(near(got, blues(w)), "weight {w}: pixel {got:?} vs {:?}", blues(w));
                shaded += 1;
            }
        }
    }
    assert_eq!((written, read, shaded), (2, 20, 11));
}
