//! `inspect cache`, the cache view: every number it shows against an independent party. The K/V
//! rows each step writes against Hugging Face's `past_key_values` of the fixture; the scores
//! before the softmax against q·k/√HS from HF's own c_attn output (layer 0) and against HF's
//! softmax weights (every layer); the query weights against HF's attention; the work with and
//! without the cache against a count derived here from config.json alone.

mod common;

use common::views::{kvgpt, stdout};
use common::*;
use serde_json::Value;

fn json_of(args: &[&str]) -> Value {
    serde_json::from_str(&stdout(args)).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// The work of a forward call of `t` tokens after `p` cached ones with one logits row, derived
/// from config.json: (multiply-adds, weight bytes at f32, K/V bytes read).
fn derived_work(cfg: &Value, p: u64, t: u64) -> (u64, u64, u64) {
    let n = |k: &str| cfg[k].as_u64().unwrap();
    let (l, c, v) = (n("n_layer"), n("n_embd"), n("vocab_size"));
    let f = cfg["n_inner"].as_u64().unwrap_or(4 * c);
    // Query at position j reads keys 0..=j.
    let keys: u64 = (p + 1..=p + t).sum();
    let per_token = 3 * c * c + c * c + c * f + f * c;
    let macs = l * (t * per_token + 2 * c * keys) + c * v;
    let block_params = per_token + (3 * c + c + f + c) + 4 * c;
    let weights = 4 * (l * block_params + 2 * c + t * 2 * c + c * v);
    (macs, weights, l * 2 * c * 4 * keys)
}

#[test]
fn work_counts_match_a_count_derived_from_the_config() {
    let cfg: Value = serde_json::from_slice(&std::fs::read(fixture_dir().join("config.json")).unwrap()).unwrap();
    let j = json_of(&["inspect", "cache", "The cat sat on", "--model", &model(), "--generate", "6", "--json"]);
    let steps = j["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 7);
    let mut last_ratio = 0.0;
    for (i, st) in steps.iter().enumerate() {
        let [a, b] = [0, 1].map(|k| st["written"][k].as_u64().unwrap());
        assert_eq!((a, b), if i == 0 { (0, 4) } else { (3 + i as u64, 4 + i as u64) });
        let w = &st["work"];
        let get = |side: &str, k: &str| w[side][k].as_u64().unwrap();
        let (macs, weights, kv) = derived_work(&cfg, a, b - a);
        assert_eq!((get("with_cache", "macs"), get("with_cache", "weight_bytes")), (macs, weights), "step {i}");
        assert_eq!(get("with_cache", "kv_read_bytes"), kv, "step {i}");
        let (macs_u, weights_u, kv_u) = derived_work(&cfg, 0, b);
        assert_eq!(get("without_cache", "macs"), macs_u, "step {i} uncached");
        assert_eq!(get("without_cache", "weight_bytes"), weights_u, "step {i} uncached");
        assert_eq!(get("without_cache", "kv_read_bytes"), kv_u, "step {i} uncached");
        assert_eq!(get("with_cache", "positions"), b - a);
        assert_eq!(get("without_cache", "positions"), b);
        let ratio = w["ratio"]["macs"].as_f64().unwrap();
        assert!((ratio - macs_u as f64 / macs as f64).abs() < 1e-9);
        assert!(ratio > last_ratio || i == 0, "the ratio grows with the context: step {i} {ratio}");
        last_ratio = ratio;
        let same = &st["recomputed_same_bits"];
        assert_eq!(*same, if i == 0 { Value::Null } else { Value::Bool(true) }, "step {i}");
    }
    // The bytes of this run's cache, from the config: its 10 positions take one block of 16,
    // 16 positions × 2 (K, V) × layers × C × 4.
    let (l, c) = (cfg["n_layer"].as_u64().unwrap(), cfg["n_embd"].as_u64().unwrap());
    assert_eq!((j["capacity"].as_u64(), j["block_size"].as_u64(), j["blocks"].as_u64()), (Some(10), Some(16), Some(1)));
    assert_eq!(j["bytes_allocated"].as_u64().unwrap(), 16 * 2 * l * c * 4);
    assert_eq!(j["block_table"], serde_json::json!([{"logical": 0, "physical": 0, "positions": [0, 10], "step": 0}]));
    // In blocks of 3, the prompt's 4 positions take two blocks in the prefill and the decode
    // steps take the next as their positions reach them.
    let j = json_of(&[
        "inspect",
        "cache",
        "The cat sat on",
        "--model",
        &model(),
        "--generate",
        "6",
        "--kv-block-size",
        "3",
        "--json",
    ]);
    let table: Vec<(u64, u64)> = j["block_table"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["positions"][0].as_u64().unwrap(), e["step"].as_u64().unwrap()))
        .collect();
    assert_eq!(table, [(0, 0), (3, 0), (6, 3), (9, 6)], "{}", j["block_table"]);
    let text = stdout(&["inspect", "cache", "The cat sat on", "--model", &model(), "--generate", "6"]);
    let says = format!(
        "This run holds 1 block of 16 positions for its 10 positions: {:.1} KiB",
        (16 * 2 * l * c * 4) as f64 / 1024.0
    );
    assert!(text.contains(&says), "{text}");
    assert!(!text.contains("preallocated"));
}

#[test]
fn the_cache_grid_scores_and_weights_match_hugging_face() {
    let r = Reference::load();
    let p = &r.prompts()[1];
    let t = p.ids.len(); // 14: a prefill of 10, then 4 decode steps of the prompt's own tokens
    let (hs, c) = (16, 64);
    let qkv0 = r.tensor("p1.qkv.0").unwrap().1; // HF's c_attn output of layer 0, [T, 3C]
    for (layer, head) in [(0usize, 2usize), (1, 3)] {
        let (ls, hs_s) = (layer.to_string(), head.to_string());
        let j = json_of(&[
            "inspect",
            "cache",
            &p.text,
            "--model",
            &model(),
            "--prefill",
            "10",
            "--generate",
            "0",
            "--layer",
            &ls,
            "--head",
            &hs_s,
            "--json",
        ]);
        let steps = j["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 5);
        // The grid's values: every row the steps wrote, against HF's past_key_values.
        for (part, key) in [("k", "k"), ("v", "v")] {
            let hf = r.tensor(&format!("p1.{key}.{layer}")).unwrap().1; // [NH, T, HS]
            for pos in 0..t {
                let want = &hf[(head * t + pos) * hs..(head * t + pos + 1) * hs];
                assert_close(&format!("{part}[{pos}] l{layer} h{head}"), &floats(&j[part][pos]), want, 1e-4);
            }
        }
        let attn = r.tensor(&format!("p1.attn.{layer}")).unwrap().1; // [NH, T, T]
        let hf_w = |h: usize, q: usize, k: usize| attn[(h * t + q) * t + k];
        for st in steps {
            let [a, b] = [0, 1].map(|k| st["written"][k].as_u64().unwrap() as usize);
            // The query's weights on every cached key, each head, against HF's.
            for h in 0..4 {
                let got = floats(&st["weights"][layer][h]);
                let want: Vec<f32> = (0..b).map(|k| hf_w(h, b - 1, k)).collect();
                assert_close(&format!("weights step {a} head {h}"), &got, &want, 1e-4);
            }
            // Scores: −∞ (null) exactly above the diagonal; softmax of a row is HF's weights.
            for (qi, row) in st["scores"].as_array().unwrap().iter().enumerate() {
                let q = a + qi;
                let row = row.as_array().unwrap();
                assert_eq!(row.len(), b);
                assert!(row.iter().enumerate().all(|(k, x)| x.is_null() == (k > q)), "mask of query {q}: {row:?}");
                let s: Vec<f64> = row[..=q].iter().map(|x| x.as_f64().unwrap()).collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for (k, x) in s.iter().enumerate() {
                    let w = ((x - m).exp() / z) as f32;
                    assert!((w - hf_w(head, q, k)).abs() < 1e-4, "softmax(scores) l{layer} h{head} {q},{k}");
                    if layer == 0 {
                        // HF's own q and k (its c_attn output): q·k / √HS.
                        let qv = &qkv0[q * 3 * c + head * hs..][..hs];
                        let kv = &qkv0[k * 3 * c + c + head * hs..][..hs];
                        let want: f32 = qv.iter().zip(kv).map(|(x, y)| x * y).sum::<f32>() / (hs as f32).sqrt();
                        assert!((*x as f32 - want).abs() < 1e-4, "score {q},{k}: {x} vs HF {want}");
                    }
                }
            }
        }
    }
    // Every layer's cache after the run (all heads), exported: HF's past_key_values.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("kv.safetensors");
    let out = kvgpt(&[
        "inspect",
        "cache",
        &p.text,
        "--model",
        &model(),
        "--prefill",
        "3",
        "--generate",
        "0",
        "--export",
        f.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let (shape, k) = kvgpt_core::export::read(&f, Some("k")).unwrap();
    assert_eq!(shape, vec![2, 4, t, 16]);
    let v = kvgpt_core::export::read(&f, Some("v")).unwrap().1;
    let n = 4 * t * 16;
    for l in 0..2 {
        assert_close("k", &k[l * n..(l + 1) * n], &r.tensor(&format!("p1.k.{l}")).unwrap().1, 1e-4);
        assert_close("v", &v[l * n..(l + 1) * n], &r.tensor(&format!("p1.v.{l}")).unwrap().1, 1e-4);
    }
}

#[test]
fn the_terminal_view_marks_steps_and_pictures_stay_off_the_terminal() {
    let m = model();
    let text = stdout(&["inspect", "cache", "The cat sat on", "--model", &m, "--prefill", "2", "--generate", "1"]);
    assert!(text.contains("step 0 — prefill: 2 prompt tokens at positions 0–1"), "{text}");
    // Prompt tokens fed after --prefill are headed as such, not as decoded ones.
    let fed = "step 1 — a prompt token fed alone: “·sat” at position 2 reads K,V of positions 0–1 from the cache";
    assert!(text.contains(fed), "{text}");
    assert!(text.contains("step 3 — decode: “"), "{text}");
    assert!(text.contains("−∞"), "the prefill's scores show the mask");
    // Step 2 wrote one row (■) and read two (□), in the grid of layer 0.
    let step2 = &text[text.find("step 2 — a prompt token").unwrap()..text.find("step 3 — decode").unwrap()];
    let grid: Vec<&str> = step2.lines().filter(|l| l.contains("   ↻")).collect();
    assert_eq!(grid.len(), 4);
    assert!(grid[..3].iter().all(|l| l.contains("□ □")) && grid[3].contains("■ ■"), "{grid:?}");
    let only = stdout(&["inspect", "cache", "The cat sat on", "--model", &m, "--step", "1", "--prefill", "2"]);
    assert!(only.contains("step 1 —") && !only.contains("step 0 —") && !only.contains("step 2 —"));
    let dir = tempfile::tempdir().unwrap();
    let (svg, html) = (dir.path().join("c.svg"), dir.path().join("c.html"));
    let out = stdout(&[
        "inspect",
        "cache",
        "The cat sat on",
        "--model",
        &m,
        "--generate",
        "2",
        "--svg",
        svg.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    assert_eq!(out, "", "pictures go to their files, not the terminal");
    let svg = std::fs::read_to_string(svg).unwrap();
    assert_eq!(svg.matches("class=\"w\"").count(), 4 + 5 + 6, "one weight cell per cached position per step");
    assert_eq!(svg.matches("class=\"recomputed\"").count(), 4 + 5 + 6);
    let bad = kvgpt(&["inspect", "cache", "The cat", "--model", &m, "--prefill", "3"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("the prefill must feed 1 to 2 tokens"));
    let bad = kvgpt(&["inspect", "cache", "The cat", "--model", &m, "--step", "4", "--generate", "0"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--step 4 is out of range: this run has only the prefill"));
    // By default a few decode steps follow the prefill: the cache at work.
    let j: serde_json::Value =
        serde_json::from_str(&stdout(&["inspect", "cache", "The cat", "--model", &m, "--json"])).unwrap();
    let kinds: Vec<&str> = j["steps"].as_array().unwrap().iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["prefill", "decode", "decode", "decode"]);
}

/// `cache diff`'s block tables for a prompt of `la` tokens, then one of `lb` whose first `stop`
/// tokens match it: the first takes its own blocks; the second maps the whole blocks before the
/// stop (the same physical blocks), copies the block the stop falls inside, and takes the rest.
fn block_tables_follow_the_stop(j: &Value, (la, lb): (usize, usize), stop: usize, block: usize) {
    let rows = |i: usize| j[i]["blocks"].as_array().unwrap().clone();
    let (first, second) = (rows(0), rows(1));
    let kind = |r: &Value| r["kind"].as_str().unwrap().to_string();
    assert_eq!(first.len(), la.div_ceil(block));
    assert!(first.iter().all(|r| kind(r) == "own"), "{first:?}");
    assert_eq!(second.len(), lb.div_ceil(block));
    for (l, r) in second.iter().enumerate() {
        let want = if l < stop / block {
            "shared"
        } else if l == stop / block && !stop.is_multiple_of(block) {
            "copied"
        } else {
            "own"
        };
        assert_eq!(
            (kind(r), r["logical"].as_u64()),
            (want.to_string(), Some(l as u64)),
            "blocks of {block}: {second:?}"
        );
        match want {
            "shared" => assert_eq!(r["physical"], first[l]["physical"], "the earlier prompt's block itself"),
            "copied" => assert_eq!(r["copied_from"], first[l]["physical"], "a copy of the partly matched block"),
            _ => assert!(first.iter().all(|f| f["physical"] != r["physical"]), "a block of its own"),
        }
    }
    assert_eq!(j[1]["block_size"].as_u64(), Some(block as u64));
}

/// The README's demo: a system prompt with a `Current time:` line, two requests a minute apart,
/// through `kvgpt cache diff`; where reuse must stop is computed here from Hugging Face's own
/// tokenizer (the `tokenizers` library reading the model's tokenizer.json), not by kvgpt.
#[test]
fn cache_diff_stops_at_the_first_token_the_tokenizer_says_differs() {
    let hf = tokenizers::Tokenizer::from_file(fixture_dir().join("tokenizer.json")).unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/prompt-cache");
    for (first, second) in
        [("time-first-0914.txt", "time-first-0915.txt"), ("time-last-0914.txt", "time-last-0915.txt")]
    {
        let (a, b) = (dir.join(first), dir.join(second));
        let ids = |p: &std::path::Path| {
            let text = std::fs::read_to_string(p).unwrap();
            hf.encode(text.strip_suffix('\n').unwrap(), false).unwrap().get_ids().to_vec()
        };
        let (ia, ib) = (ids(&a), ids(&b));
        let stop = ia.iter().zip(&ib).position(|(x, y)| x != y).expect("the prompts differ");
        let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
        // The second prompt twice: the last time everything but its last token is reused.
        let j = json_of(&["cache", "diff", a, b, b, "--model", &model(), "--json"]);
        let r = |i: usize| &j[i]["report"];
        assert_eq!((r(0)["reused"].as_u64(), r(0)["reason"].as_str()), (Some(0), Some("cache_ends")));
        assert_eq!(r(0)["prompt_tokens"].as_u64(), Some(ia.len() as u64));
        assert_eq!(r(1)["reused"].as_u64(), Some(stop as u64), "{first}: the first differing id");
        assert_eq!(r(1)["reason"], "differs");
        assert_eq!(r(1)["cached_token"]["id"].as_u64(), Some(u64::from(ia[stop])));
        assert_eq!(r(1)["new_token"]["id"].as_u64(), Some(u64::from(ib[stop])));
        assert_eq!(r(1)["new_token"]["text"], hf.decode(&[ib[stop]], false).unwrap());
        assert_eq!(r(1)["recomputed"].as_u64(), Some((ib.len() - stop) as u64));
        assert_eq!(r(1)["context"]["new_after"], hf.decode(&ib[stop..(stop + 9).min(ib.len())], false).unwrap());
        assert_eq!(r(1)["context"]["cached_after"], hf.decode(&ia[stop..(stop + 9).min(ia.len())], false).unwrap());
        assert_eq!((r(2)["reused"].as_u64(), r(2)["reason"].as_str()), (Some(ib.len() as u64 - 1), Some("last_token")));
        for i in 0..3 {
            assert_eq!(j[i]["same_bits_as_cold"], true, "a reused prefix gives the same logits as none");
        }
        for block in [4usize, 16] {
            let j =
                json_of(&["cache", "diff", a, b, "--model", &model(), "--json", "--kv-block-size", &block.to_string()]);
            block_tables_follow_the_stop(&j, (ia.len(), ib.len()), stop, block);
        }
    }
    let out = kvgpt(&["cache", "diff", "examples/no-such.txt", "examples/no-such.txt", "--model", &model()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("could not read the prompt file examples/no-such.txt"));
}

/// `cache diff --kv-disk DIR`: the second run of the README's two prompts, in the other order,
/// continues each from the disk tier the first run wrote: the later prompt whole (all but its last
/// token) from disk, the earlier one from RAM up to the block that holds the first differing token
/// (as Hugging Face's tokenizer says) and from disk after it, its blocks marked as loaded; the
/// logits are the bits computed from nothing.
#[test]
fn cache_diff_with_kv_disk_continues_from_the_disk_tier_and_marks_its_blocks() {
    let hf = tokenizers::Tokenizer::from_file(fixture_dir().join("tokenizer.json")).unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/prompt-cache");
    let (a, b) = (dir.join("time-last-0914.txt"), dir.join("time-last-0915.txt"));
    let ids = |p: &std::path::Path| {
        let text = std::fs::read_to_string(p).unwrap();
        hf.encode(text.strip_suffix('\n').unwrap(), false).unwrap().get_ids().to_vec()
    };
    let (ia, ib) = (ids(&a), ids(&b));
    let stop = ia.iter().zip(&ib).position(|(x, y)| x != y).unwrap();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let disk = tempfile::tempdir().unwrap();
    let d = disk.path().to_str().unwrap();
    let first =
        json_of(&["cache", "diff", a, b, "--model", &model(), "--json", "--kv-disk", d, "--kv-block-size", "16"]);
    assert_eq!(first[0]["report"]["tiers"]["disk"], 0, "an empty directory gives nothing");
    let j = json_of(&["cache", "diff", b, a, "--model", &model(), "--json", "--kv-disk", d, "--kv-block-size", "16"]);
    let tiers = |i: usize| j[i]["report"]["tiers"].clone();
    assert_eq!(tiers(0), serde_json::json!({"ram": 0, "disk": ib.len() - 1, "redis": 0, "verified": 0}));
    let start = stop / 16 * 16;
    assert_eq!(tiers(1), serde_json::json!({"ram": start, "disk": ia.len() - 1 - start, "redis": 0, "verified": 0}));
    let kinds = |i: usize| -> Vec<String> {
        j[i]["blocks"].as_array().unwrap().iter().map(|r| r["kind"].as_str().unwrap().to_string()).collect()
    };
    assert!(kinds(0)[..(ib.len() - 1) / 16].iter().all(|k| k == "disk"), "{:?}", kinds(0));
    assert!(kinds(1)[..start / 16].iter().all(|k| k == "shared") && kinds(1)[start / 16] == "disk", "{:?}", kinds(1));
    for i in 0..2 {
        assert_eq!(j[i]["same_bits_as_cold"], true, "loaded K/V give the logits computed from nothing");
    }
    let text = stdout(&["cache", "diff", b, a, "--model", &model(), "--kv-disk", d, "--kv-block-size", "16"]);
    assert!(text.contains("▤") && text.contains("loaded from --kv-disk"), "{text}");
}

/// `inspect cache --kv-disk DIR` marks each block with where it stands in the directory
/// `generate --kv-disk` wrote: its content address is the name of a file there, and the stored
/// rows are the bits this run computed; a block altered behind its checksum is shown with other
/// bits, one flipped under it as refused, and a block the directory lacks as not stored.
#[test]
fn inspect_cache_with_kv_disk_marks_each_block_by_where_it_is_stored() {
    let p = Reference::load().prompts().into_iter().find(|p| p.key == "p2").unwrap();
    let disk = tempfile::tempdir().unwrap();
    let d = disk.path().to_str().unwrap();
    let n = p.greedy_ids.len().to_string();
    assert!(kvgpt(&["generate", &p.text, "-n", &n, "--ignore-eos", "--model", &model(), "--kv-disk", d])
        .status
        .success());
    let m = model();
    let view = |extra: &[&str]| {
        let args = [&["inspect", "cache", &p.text, "--model", &m, "--kv-disk", d, "--json"][..], extra].concat();
        let j = json_of(&args);
        j["block_table"].as_array().unwrap().iter().map(|e| e["stored"].clone()).collect::<Vec<_>>()
    };
    // 88 prompt tokens and 8 decoded: six whole blocks of 16, all written by generate.
    let marks = view(&["--generate", "8"]);
    assert_eq!(marks.len(), 6);
    let file = |key: &str| disk.path().join(&key[..2]).join(format!("{key}.kvb"));
    for m in &marks {
        assert_eq!((m["tier"].as_str(), m["same_bits"].as_bool()), (Some("disk"), Some(true)), "{m}");
        assert!(file(m["key"].as_str().unwrap()).is_file(), "the content address names the file: {m}");
    }
    let last = |extra: &[&str]| view(extra).last().unwrap().clone();
    assert_eq!(last(&["--generate", "9"])["tier"], serde_json::Value::Null, "97 positions: a part no run stored");
    let f = file(marks[5]["key"].as_str().unwrap());
    let mut bytes = std::fs::read(&f).unwrap();
    let body = bytes.len() - 32;
    bytes[body - 2] ^= 1;
    let sum = *blake3::hash(&bytes[..body]).as_bytes();
    bytes[body..].copy_from_slice(&sum);
    std::fs::write(&f, &bytes).unwrap();
    assert_eq!(last(&["--generate", "8"])["same_bits"], false, "altered behind its checksum: other bits");
    bytes[body - 2] ^= 2;
    std::fs::write(&f, &bytes).unwrap();
    assert_eq!(last(&["--generate", "8"])["same_bits"], serde_json::Value::Null, "flipped under it: refused");
    let html = disk.path().join("cache.html");
    let out =
        kvgpt(&["inspect", "cache", &p.text, "--model", &model(), "--kv-disk", d, "--html", html.to_str().unwrap()]);
    assert!(out.status.success());
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<td class=\"same\">stored, the same bits"), "the HTML's block table marks them");
}

/// `cache diff` compares a prefill with the reused prefix against one from nothing only where
/// something was reused: the first prompt, which reuses nothing, gets no comparison of two runs
/// of the same computation (noise shown as a difference).
#[test]
fn cache_diff_compares_times_only_where_something_was_reused() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/prompt-cache");
    let (a, b) = (dir.join("time-first-0914.txt"), dir.join("time-first-0915.txt"));
    let text = stdout(&["cache", "diff", a.to_str().unwrap(), b.to_str().unwrap(), "--model", &model()]);
    let (first, second) = text.split_once("time-first-0915.txt:").unwrap();
    assert!(first.contains("nothing was reused") && !first.contains("from nothing ("), "{first}");
    assert!(second.contains("with the reused prefix") && second.contains("from nothing (the same bits)"), "{second}");
}
