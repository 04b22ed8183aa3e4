//! A count in a file is checked against the tensors the file holds before anything is allocated
//! for it: on e3c743f a GGUF whose `gpt2.block_count` said 10^6 took 1.5 GB for a 12 MB file and
//! 2^32 − 1 aborted, and config.json's `n_layer` 2^32 − 1 took 15 GB before aborting. Each runs
//! here under a 1 GiB address-space limit and must end with an error naming the count.

mod common;

use common::*;
use std::process::Command;

/// `kvgpt generate` on `model` under `ulimit -v` of 1 GiB: its status, and what it said.
fn generate_bounded(model: &std::path::Path) -> (Option<i32>, String) {
    let script = r#"ulimit -v 1048576; exec "$0" generate "The cat" -n 2 --model "$1""#;
    let out = Command::new("sh")
        .args(["-c", script, env!("CARGO_BIN_EXE_kvgpt"), &model.display().to_string()])
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The fixture's Q8_0 GGUF with `gpt2.block_count` set to `n`.
fn gguf_claiming(dir: &std::path::Path, n: u32) -> std::path::PathBuf {
    let mut bytes = std::fs::read(gguf_fixture("q8_0")).unwrap();
    let key = b"gpt2.block_count";
    let at = bytes.windows(key.len()).position(|w| w == key).expect("the key") + key.len();
    assert_eq!(u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()), 4, "a u32 value follows");
    bytes[at + 4..at + 8].copy_from_slice(&n.to_le_bytes());
    let file = dir.join(format!("claims-{n}.gguf"));
    std::fs::write(&file, bytes).unwrap();
    file
}

#[test]
fn a_gguf_claiming_a_million_blocks_is_refused_before_any_allocation() {
    let dir = tempfile::tempdir().unwrap();
    for n in [1_000_000, 10_000_000, u32::MAX] {
        let (status, err) = generate_bounded(&gguf_claiming(dir.path(), n));
        assert_eq!(status, Some(1), "a clean error, not an abort: {err}");
        assert!(err.contains(&format!("block_count is {n}, but it holds tensors of only 2 blocks")), "{err}");
    }
}

#[test]
fn a_config_claiming_four_billion_layers_is_refused_before_any_allocation() {
    let dir = tempfile::tempdir().unwrap();
    copy_side_files(dir.path());
    std::fs::copy(fixture_dir().join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture_dir().join("config.json")).unwrap()).unwrap();
    cfg["n_layer"] = serde_json::json!(u32::MAX);
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let (status, err) = generate_bounded(dir.path());
    assert_eq!(status, Some(1), "a clean error, not an abort: {err}");
    assert!(err.contains("n_layer = 4294967295, but the file holds only 2 transformer blocks"), "{err}");
}
