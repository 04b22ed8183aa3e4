//! The disk tier under the pool (issue #35): the blocks the prompt cache holds are written
//! through to `--kv-disk`, and a restarted server serves a known prefix from them, token exact,
//! with HF's greedy answer. Blocks that are not exactly these — flipped, truncated, or from
//! another model, `--kv-dtype` or block size — are never used: refused by their checksum, or
//! never found under their content address.

mod common;

use common::server::{ids_of, Server};
use common::{RefPrompt, Reference};
use serde_json::json;
use std::path::Path;

/// HF's 88-token prompt and its 40 greedy tokens.
fn prompt() -> RefPrompt {
    Reference::load().prompts().into_iter().find(|p| p.key == "p2").unwrap()
}

/// The server's greedy answer to `p` and how many prompt tokens it did not compute.
fn ask(s: &Server, p: &RefPrompt) -> (Vec<u32>, u64) {
    let (ids, cached, _) = ask_tiers(s, p);
    (ids, cached)
}

/// [`ask`], and where the usage says the reused positions came from.
fn ask_tiers(s: &Server, p: &RefPrompt) -> (Vec<u32>, u64, serde_json::Value) {
    let n = p.greedy_ids.len();
    let v = s.complete(&json!({"prompt": p.ids, "max_tokens": n, "temperature": 0, "ignore_eos": true, "logprobs": 1}));
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    (ids_of(&v["choices"][0]["logprobs"]["token_ids"]), cached, v["usage"]["prompt_cache"]["tiers"].clone())
}

/// A server on the disk tier `dir` (and `extra` flags) answers `p` once and exits, its writes done.
fn fill(dir: &Path, p: &RefPrompt) {
    let s = Server::start(&["--kv-disk", dir.to_str().unwrap()]);
    assert_eq!(ask(&s, p), (p.greedy_ids.clone(), 0), "a first run computes everything");
    assert!(s.terminate().success());
}

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let subs = std::fs::read_dir(dir).unwrap().flatten().filter(|e| e.path().is_dir());
    let all = subs.flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten().map(|f| f.path()));
    all.filter(|f| f.extension().is_none_or(|e| e != "tmp")).collect() // written ones, not being written
}

/// Changes one K/V value of every block in `dir` and makes its checksum again over the altered
/// bytes: what a store cannot tell from honest bytes by itself.
fn alter_behind_the_checksum(dir: &Path) {
    for f in files(dir) {
        let mut bytes = std::fs::read(&f).unwrap();
        let body = bytes.len() - 32;
        bytes[body - 2] ^= 0x01; // the last K/V value's low mantissa bits
        let sum = *blake3::hash(&bytes[..body]).as_bytes();
        bytes[body..].copy_from_slice(&sum);
        std::fs::write(&f, bytes).unwrap();
    }
}

#[test]
fn a_restarted_server_serves_the_prefix_from_disk_token_exact_with_hfs_answer() {
    let (dir, p) = (tempfile::tempdir().unwrap(), prompt());
    fill(dir.path(), &p);
    // Five whole blocks of 16 and the prompt's last 8 positions (a partial block), as written.
    assert!(files(dir.path()).len() >= 6, "{:?}", files(dir.path()));
    // The same request's log-probabilities from a cold server, computed from nothing.
    let body =
        json!({"prompt": p.ids, "max_tokens": p.greedy_ids.len(), "temperature": 0, "ignore_eos": true, "logprobs": 3});
    let cold = Server::start(&[]).complete(&body);
    let s = Server::start(&["--kv-disk", dir.path().to_str().unwrap()]);
    let warm = s.complete(&body);
    let tiers = json!({"ram": 0, "disk": 87, "redis": 0, "verified": 0});
    assert_eq!(warm["usage"]["prompt_cache"]["tiers"], tiers, "all but the last prompt token from disk");
    assert_eq!(ids_of(&warm["choices"][0]["logprobs"]["token_ids"]), p.greedy_ids);
    assert_eq!(warm["choices"][0]["logprobs"], cold["choices"][0]["logprobs"], "the same bits as computed cold");
    let again = json!({"ram": 87, "disk": 0, "redis": 0, "verified": 0});
    assert_eq!(ask_tiers(&s, &p).2, again, "then from RAM");
    assert_eq!(s.metric("kvgpt_kv_store_hit_blocks_total"), 6.0);
    // Four choices of one prompt on another restarted server: its blocks are read once.
    let s = Server::start(&["--kv-disk", dir.path().to_str().unwrap()]);
    let n4 = s.complete(&json!({"prompt": p.ids, "max_tokens": 4, "n": 4, "temperature": 0}));
    assert_eq!(n4["usage"]["prompt_tokens_details"]["cached_tokens"], 87, "{n4}");
    assert_eq!(s.metric("kvgpt_kv_store_hit_blocks_total"), 6.0, "read once, not once per choice");
    assert_eq!(s.metric("kvgpt_kv_store_refused_blocks_total"), 0.0);
}

#[test]
fn blocks_of_another_model_kv_type_or_block_size_are_never_found() {
    let (dir, p) = (tempfile::tempdir().unwrap(), prompt());
    fill(dir.path(), &p);
    let held = files(dir.path()).len();
    for other in [["--kv-block-size", "8"], ["--kv-dtype", "f16"], ["--dtype", "bf16"]] {
        let s = Server::start(&[&["--kv-disk", dir.path().to_str().unwrap()][..], &other[..]].concat());
        let (ids, cached) = ask(&s, &p);
        assert_eq!(cached, 0, "{other:?}: nothing stored under another key is found");
        if other[0] == "--kv-block-size" {
            assert_eq!(ids, p.greedy_ids, "{other:?}");
        }
        assert_eq!(s.metric("kvgpt_kv_store_refused_blocks_total"), 0.0, "{other:?}: not found, so not refused");
        assert!(s.terminate().success());
    }
    // Each wrote its own blocks beside the first model's, which are all still there.
    assert!(files(dir.path()).len() >= 4 * held);
}

#[test]
fn flipped_and_truncated_blocks_are_refused_and_the_answer_is_hfs() {
    for (damage, reason) in [("flip", "checksum"), ("truncate", "truncated")] {
        let (dir, p) = (tempfile::tempdir().unwrap(), prompt());
        fill(dir.path(), &p);
        for f in files(dir.path()) {
            let mut bytes = std::fs::read(&f).unwrap();
            if damage == "flip" {
                let mid = bytes.len() / 2;
                bytes[mid] ^= 0x10; // one bit of one K/V value
            } else {
                bytes.truncate(bytes.len() - 40);
            }
            std::fs::write(&f, bytes).unwrap();
        }
        let s = Server::start(&["--kv-disk", dir.path().to_str().unwrap()]);
        assert_eq!(ask(&s, &p), (p.greedy_ids.clone(), 0), "{damage}: recomputed, HF's answer");
        let refused = format!("kvgpt_kv_store_refused_blocks_total{{tier=\"disk\",reason=\"{reason}\"}}");
        assert_eq!(s.metric(&refused), 1.0, "{damage}: the first block read is refused, and the run ends there");
        assert!(s.terminate().success());
    }
}

/// A block altered behind the checksum's back (one K/V value changed, the checksum made again
/// over the altered bytes) passes every check a store can make by itself: the server uses it.
/// With `--kv-verify 1` recomputing it gives other bits, so it is refused, removed and counted,
/// and the answer is HF's; an honest store's blocks are all proved and used.
#[test]
fn kv_verify_proves_stored_blocks_by_recomputing_them() {
    let (dir, p) = (tempfile::tempdir().unwrap(), prompt());
    fill(dir.path(), &p);
    let d = dir.path().to_str().unwrap();
    let s = Server::start(&["--kv-disk", d, "--kv-verify", "1"]);
    let tiers = json!({"ram": 0, "disk": 87, "redis": 0, "verified": 87});
    assert_eq!(ask_tiers(&s, &p), (p.greedy_ids.clone(), 87, tiers), "an honest store: every block proved, and used");
    assert_eq!((s.metric("kvgpt_kv_verified_blocks_total"), s.metric("kvgpt_kv_verify_failures_total")), (6.0, 0.0));
    assert!(s.terminate().success());
    alter_behind_the_checksum(dir.path());
    let copy = tempfile::tempdir().unwrap();
    for f in files(dir.path()) {
        let to = copy.path().join(f.strip_prefix(dir.path()).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&f, to).unwrap();
    }
    let trusting = Server::start(&["--kv-disk", copy.path().to_str().unwrap()]);
    assert_eq!(ask(&trusting, &p).1, 87, "the checksum cannot tell: the altered blocks are used");
    let s = Server::start(&["--kv-disk", d, "--kv-verify", "1"]);
    assert_eq!(ask(&s, &p), (p.greedy_ids.clone(), 0), "refused by recomputation: HF's answer");
    assert_eq!((s.metric("kvgpt_kv_verified_blocks_total"), s.metric("kvgpt_kv_verify_failures_total")), (0.0, 1.0));
    assert!(s.log_lines(1, |l| l.contains("is not what recomputing it gives")).len() == 1);
}

/// Blocks this server computed itself need no recomputing when they come back from disk: their
/// checked BLAKE3 sums are the ones it wrote (`--kv-verify 1` counts them as proved, known). Bytes
/// altered behind the checksum's back while it runs have another sum: recomputed, refused, and
/// the answer is HF's.
#[test]
fn kv_verify_knows_the_blocks_it_wrote_by_their_sums_and_recomputes_altered_ones() {
    let (dir, p) = (tempfile::tempdir().unwrap(), prompt());
    let s = Server::start(&["--kv-disk", dir.path().to_str().unwrap(), "--kv-verify", "1"]);
    assert_eq!(ask(&s, &p), (p.greedy_ids.clone(), 0));
    let t0 = std::time::Instant::now();
    while files(dir.path()).len() < 6 {
        assert!(t0.elapsed().as_secs() < 30, "the server wrote {} blocks", files(dir.path()).len());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(s.post("/flush_cache", &json!({})).0, 200);
    let tiers = json!({"ram": 0, "disk": 87, "redis": 0, "verified": 87});
    assert_eq!(ask_tiers(&s, &p), (p.greedy_ids.clone(), 87, tiers), "every block proved, none recomputed");
    let proved = |m: &str| s.metric(&format!("kvgpt_kv_{m}_total"));
    assert_eq!(
        (proved("verified_known_blocks"), proved("verified_blocks"), proved("verify_failures")),
        (6.0, 0.0, 0.0)
    );
    alter_behind_the_checksum(dir.path());
    assert_eq!(s.post("/flush_cache", &json!({})).0, 200);
    assert_eq!(ask(&s, &p), (p.greedy_ids.clone(), 0), "refused by recomputation: HF's answer");
    assert_eq!(
        (proved("verified_known_blocks"), proved("verified_blocks"), proved("verify_failures")),
        (6.0, 0.0, 1.0)
    );
}

/// One store for the command line and the server: `generate --kv-disk` computes HF's prompt
/// once, its next run reuses it from disk, and a server on the same directory serves it from there
/// too — each time HF's greedy answer.
#[test]
fn generate_and_serve_share_one_disk_tier() {
    let (dir, p) = (tempfile::tempdir().unwrap(), prompt());
    let d = dir.path().to_str().unwrap();
    let n = p.greedy_ids.len().to_string();
    for (run, reused) in [("first", 0), ("second", p.ids.len() - 1)] {
        let j = common::server::generate(&[&p.text, "-n", &n, "--ignore-eos", "--kv-disk", d]);
        assert_eq!(ids_of(&j["generated_ids"]), p.greedy_ids, "{run} run");
        assert_eq!(j["kv_disk"]["reused_tokens"].as_u64().unwrap() as usize, reused, "{run} run");
    }
    let s = Server::start(&["--kv-disk", d]);
    assert_eq!(ask(&s, &p), (p.greedy_ids.clone(), 87), "the server reuses what generate computed");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(["generate", "Hi", "--model", common::fixture_dir().to_str().unwrap(), "--no-cache", "--kv-disk", d])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--kv-disk reuses and keeps K/V"), "{err}");
}

/// `kvgpt cache verify DIR` proves every block of a directory offline by recomputing it, and
/// names the one altered behind its checksum and the one flipped under it (exit status 1).
#[test]
fn cache_verify_proves_a_directory_offline_and_names_what_is_wrong() {
    let (dir, p) = (tempfile::tempdir().unwrap(), prompt());
    fill(dir.path(), &p);
    let verify = || {
        let model = common::fixture_dir();
        let args = ["cache", "verify", dir.path().to_str().unwrap(), "--model", model.to_str().unwrap(), "--json"];
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(args).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.code(), v)
    };
    let all = files(dir.path()).len() as u64;
    let (code, v) = verify();
    assert_eq!((code, v["proved"].as_u64().unwrap(), v["orphans"].as_u64().unwrap()), (Some(0), all, 0), "{v}");
    let mut names = files(dir.path());
    names.sort();
    let mut bytes = std::fs::read(&names[0]).unwrap();
    let body = bytes.len() - 32;
    bytes[body - 2] ^= 0x01;
    let sum = *blake3::hash(&bytes[..body]).as_bytes();
    bytes[body..].copy_from_slice(&sum);
    std::fs::write(&names[0], bytes).unwrap();
    let stem = |i: usize| names[i].file_stem().unwrap().to_str().unwrap().to_string();
    let (code, v) = verify();
    // The altered value is the last layer's: no later block is computed from it, so only this
    // block differs.
    assert_eq!(
        (code, &v["differ"], v["proved"].as_u64().unwrap()),
        (Some(1), &serde_json::json!([stem(0)]), all - 1),
        "{v}"
    );
    let mut flipped = std::fs::read(&names[1]).unwrap();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x10;
    std::fs::write(&names[1], flipped).unwrap();
    let (code, v) = verify();
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(v["damaged"], serde_json::json!([{"key": stem(1), "reason": "checksum"}]), "{v}");
}

/// A disk that refuses writes (here every subdirectory name is taken by a file, as a full disk
/// would fail them) stops the tier's writing with one warning; the server answers as ever.
#[test]
fn a_disk_that_refuses_writes_stops_the_tier_and_costs_no_answer() {
    let (dir, p) = (tempfile::tempdir().unwrap(), prompt());
    for i in 0..=255u8 {
        std::fs::write(dir.path().join(format!("{i:02x}")), b"not a directory").unwrap();
    }
    let s = Server::start(&["--kv-disk", dir.path().to_str().unwrap()]);
    assert_eq!(ask(&s, &p), (p.greedy_ids.clone(), 0));
    assert_eq!(ask(&s, &p), (p.greedy_ids.clone(), 87), "the prompt cache in RAM goes on");
    assert_eq!(s.log_lines(1, |l| l.contains("stopped writing")).len(), 1, "one warning");
    assert_eq!(s.metric("kvgpt_kv_store_written_blocks_total"), 0.0);
    assert!(s.metric("kvgpt_kv_store_skipped_blocks_total") >= 1.0);
}
