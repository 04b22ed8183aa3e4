//! The views of speculative decoding: `inspect draft` shows each round (drafted, accepted, the
//! model's token, the cache before the step, after the forward and after the rollback) with
//! Hugging Face's greedy ids and the cache arithmetic recomputed here; `bench --draft` puts a
//! drafted row beside each plain decode row.

mod common;

use common::*;
use serde_json::Value;
use std::process::{Command, Output};

fn kvgpt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(args).env_remove("HF_HUB_OFFLINE").output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = kvgpt(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn inspect_draft_shows_every_round_with_hfs_answer_and_the_caches_lengths() {
    let m = fixture_dir().display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let reference = Reference::load();
    for p in reference.prompts() {
        let n = p.greedy_ids.len();
        let n_arg = n.to_string();
        for draft in [&["--draft", "lookup"][..], &["--draft", "self:w8a8"], &["--draft-model", &m]] {
            let what = format!("{} {draft:?}", p.key);
            let mut args = vec!["inspect", "draft", "--model", &m, "-n", &n_arg, &p.text];
            args.extend_from_slice(draft);
            let html = dir.path().join("rounds.html");
            let html_arg = html.display().to_string();
            let json: Value =
                serde_json::from_str(&ok(&[&args[..], &["--json", "--html", &html_arg]].concat())).unwrap();
            assert_eq!(ids(&json["prompt_ids"]), p.ids, "{what}");
            assert_eq!(ids(&json["generated_ids"]), p.greedy_ids, "{what}: HF's greedy ids");
            // Round by round: the cache holds the prompt and every accepted token but the last;
            // a round feeds that one and the drafts, then forgets the rejected ones.
            let (mut cache, mut made) = (p.ids.len(), 1);
            for (i, r) in json["rounds"].as_array().unwrap().iter().enumerate() {
                let drafted = ids(&r["drafted"]);
                let (d, a) = (drafted.len(), r["accepted"].as_u64().unwrap() as usize);
                assert!(a <= d, "{what} round {i}");
                assert_eq!(r["cache_before"], cache, "{what} round {i}");
                assert_eq!(r["cache_fed"], cache + 1 + d, "{what} round {i}");
                assert_eq!(r["cache_after"], cache + 1 + a, "{what} round {i}");
                assert_eq!(drafted[..a], p.greedy_ids[made..made + a], "{what} round {i}: accepted = HF's tokens");
                let token = r["token"].as_u64().unwrap() as u32;
                assert_eq!(token, p.greedy_ids[made + a], "{what} round {i}: the model's token = HF's");
                let p_token = r["p_token"].as_f64().unwrap();
                if a < d {
                    assert_ne!(drafted[a], token, "{what} round {i}: a rejected draft differs from the model's token");
                    assert!(
                        r["p_rejected"].as_f64().unwrap() <= p_token,
                        "{what} round {i}: greedy takes the likelier"
                    );
                } else {
                    assert!(r["p_rejected"].is_null());
                }
                if draft[0] == "--draft-model" {
                    assert_eq!(a, d, "{what} round {i}: the model agrees with itself");
                }
                (cache, made) = (cache + 1 + a, made + 1 + a);
            }
            assert_eq!(made, n, "{what}: every token accounted for");
            // The page carries the same data, inline, and fetches nothing.
            let page = std::fs::read_to_string(&html).unwrap();
            let inline = page.split("<script type=\"application/json\" id=\"kvgpt-data\">").nth(1).unwrap();
            let inline: Value = serde_json::from_str(inline.split("</script>").next().unwrap()).unwrap();
            assert_eq!(inline, json, "{what}: the page's data");
            assert!(!page.contains("http://") && !page.contains("https://") && !page.contains(" src="), "{what}");
            // The terminal says the same in words.
            let text = ok(&args);
            assert!(text.contains(&format!("round 1: cache {} → ", p.ids.len())), "{text}");
            assert!(
                text.contains(&format!("{n} tokens in {} forwards", json["rounds"].as_array().unwrap().len() + 1)),
                "{text}"
            );
        }
    }
    let out = kvgpt(&["inspect", "draft", "--model", &m, "hello"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("give one with --draft"), "{out:?}");
}

#[test]
fn bench_with_a_draft_puts_a_drafted_row_beside_each_plain_one() {
    let m = fixture_dir().display().to_string();
    let args = ["bench", "--model", &m, "-p", "4,16", "-n", "12", "-r", "1", "--probe-mib", "0", "--no-uncached"];
    let rows: Value =
        serde_json::from_str(&ok(&[&args[..], &["--draft", "self:w8a8", "--draft-min", "2", "-o", "json"]].concat()))
            .unwrap();
    let rows = rows.as_array().unwrap();
    for prompt in [4, 16] {
        let drafted = rows.iter().find(|r| r["mode"] == "drafted" && r["prompt_tokens"] == prompt).unwrap();
        assert_eq!(drafted["draft"], "self:w8a8");
        assert_eq!(drafted["gen_tokens"], 12);
        let acceptance = drafted["acceptance"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&acceptance), "{drafted}");
        // Each step makes at least one token and at most 1 + the most drafts (--draft-max's 16).
        let per_step = drafted["tokens_per_step"].as_f64().unwrap();
        assert!((1.0..=17.0).contains(&per_step), "{drafted}");
        assert!(drafted["acceptance"].as_f64().unwrap() > 0.0, "--draft-min 2 drafted and int8 agreed: {drafted}");
        assert!(rows.iter().any(|r| r["mode"] == "cached" && r["test"] == "tg12" && r["prompt_tokens"] == prompt));
    }
    let md = ok(&[&args[..], &["--draft", "lookup"]].concat());
    assert!(md.contains("| tok/s with draft lookup | × plain | acceptance | tokens / verify step |"), "{md}");
    assert!(md.contains("random weights repeat themselves"), "{md}");
}
