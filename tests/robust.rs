//! Issue #9: bad input as a careless or hostile user gives it, one test per class — the command
//! must end with a clear error (or quietly, for a closed pipe), never a panic, never an
//! overwritten input, never silent garbage. (Config/weights classes are in tests/loading.rs.)

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn kvgpt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(args)
        .env_remove("HF_HUB_OFFLINE")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[track_caller]
fn fails_with(out: &Output, code: i32, parts: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for p in parts {
        assert!(err.contains(p), "{err:?} does not mention {p:?}");
    }
}

/// A copy of the fixture folder (so its files may be targeted without risk).
fn model_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json", "vocab.json", "merges.txt"] {
        std::fs::copy(fixture_dir().join(f), dir.path().join(f)).unwrap();
    }
    dir
}

fn bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

// ---- 2. Outputs never overwrite inputs; a failed write leaves nothing behind.

#[test]
fn an_output_that_is_an_input_is_refused_and_the_input_kept() {
    let dir = model_copy();
    let d = dir.path().to_str().unwrap().to_string();
    let prompt = dir.path().join("prompt.txt");
    std::fs::write(&prompt, "The cat sat on").unwrap();
    let p = prompt.to_str().unwrap().to_string();
    // An HF-cache-like snapshot: a folder of symlinks to the blobs.
    let snap = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::os::unix::fs::symlink(dir.path().join(f), snap.path().join(f)).unwrap();
    }
    let s = snap.path().to_str().unwrap().to_string();
    let cases: Vec<(Vec<String>, std::path::PathBuf)> = vec![
        (
            vec!["inspect", "logits", "x", "--model", &d, "--export", &format!("{d}/model.safetensors")],
            dir.path().join("model.safetensors"),
        ),
        (
            vec!["inspect", "attention", "x", "--model", &d, "--svg", &format!("{d}/config.json")],
            dir.path().join("config.json"),
        ),
        (
            vec!["inspect", "attention", "x", "--model", &d, "--html", &format!("{d}/tokenizer.json")],
            dir.path().join("tokenizer.json"),
        ),
        (vec!["inspect", "attention", "--prompt-file", &p, "--model", &d, "--svg", &p], prompt.clone()),
        (
            vec!["inspect", "embeddings", "x", "--model", &s, "--export", &format!("{s}/model.safetensors")],
            dir.path().join("model.safetensors"),
        ),
        (
            vec!["generate", "x", "--model", &s, "--prompt-cache", &format!("{s}/config.json")],
            dir.path().join("config.json"),
        ),
    ]
    .into_iter()
    .map(|(a, f)| (a.into_iter().map(String::from).collect(), f))
    .collect();
    for (args, victim) in cases {
        let before = bytes(&victim);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(&kvgpt(&args), 1, &["which this run reads; choose another output file"]);
        assert_eq!(bytes(&victim), before, "{args:?} changed {}", victim.display());
    }
    // The symlinks are still symlinks (nothing was renamed over them).
    assert!(std::fs::symlink_metadata(snap.path().join("model.safetensors")).unwrap().file_type().is_symlink());
}

#[test]
fn a_failed_write_leaves_no_half_file() {
    let dir = tempfile::tempdir().unwrap();
    // The output path is a directory: the rename fails, the error names it, no temp file stays.
    let target = dir.path().join("out.npy");
    std::fs::create_dir(&target).unwrap();
    let t = target.to_str().unwrap();
    fails_with(&kvgpt(&["inspect", "logits", "x", "--model", &model(), "--export", t]), 1, &["out.npy"]);
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("out.npy")], "{left:?}");
    // And a good export is a valid .npy of the logits' shape.
    let good = dir.path().join("logits.npy");
    let out = kvgpt(&["inspect", "logits", "The cat sat on", "--model", &model(), "--export", good.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (shape, data) = kvgpt_core::export::read_npy(&bytes(&good)).unwrap();
    assert_eq!(shape.iter().product::<usize>(), data.len());
    assert_eq!(*shape.last().unwrap(), 50257);
}

// ---- 3. Pipes, full disks, a closed stdout.

fn run_with(args: &[&str], stdout: Stdio, stderr: Stdio) -> std::process::ExitStatus {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    // Close our ends of the pipes at once: every write the child makes finds no reader.
    drop(child.stdout.take());
    drop(child.stderr.take());
    child.wait().unwrap()
}

#[test]
fn a_closed_pipe_ends_quietly_and_a_full_disk_is_one_line() {
    let m = model();
    let views: &[&[&str]] = &[
        &["inspect", "attention", "The cat sat on the mat", "--model", &m],
        &["inspect", "tokens", "The cat sat on the mat", "--model", &m],
        &["inspect", "logits", "The cat sat on the mat", "--model", &m],
        &["inspect", "embeddings", "The cat sat on the mat", "--model", &m],
        &["explain", "The cat sat on the mat", "--model", &m],
        &["verify", "cache", "The cat", "--model", &m],
        &["generate", "The cat", "--model", &m, "-n", "20"],
        &["bench", "--model", &m, "-p", "4", "-n", "2", "-r", "1", "--probe-mib", "0"],
    ];
    for args in views {
        // stdout and stderr both a pipe nobody reads (`2>&1 | head -c 10` at its worst): the
        // status a Unix tool ends with on SIGPIPE, not a panic's 101.
        let status = run_with(args, Stdio::piped(), Stdio::piped());
        assert_eq!(status.code(), Some(141), "{args:?}");
        // A full disk: exit 1 with one line that names standard output.
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(*args).stdout(full).output().unwrap();
        fails_with(&out, 1, &["could not write to standard output", "No space left on device"]);
        let errors = String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.starts_with("error:")).count();
        assert_eq!(errors, 1, "{}", String::from_utf8_lossy(&out.stderr));
    }
    // A closed stdout (`>&-`) is refused before any work.
    let out = Command::new("sh")
        .args(["-c", "exec \"$0\" \"$@\" >&-", env!("CARGO_BIN_EXE_kvgpt"), "explain", "x", "--model", &m])
        .output()
        .unwrap();
    fails_with(&out, 1, &["standard output is closed"]);
}

// ---- 4. The .npy reader.

fn npy(version: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let mut v = b"\x93NUMPY".to_vec();
    v.extend([version, 0]);
    if version == 1 {
        v.extend((dict.len() as u16).to_le_bytes());
    } else {
        v.extend((dict.len() as u32).to_le_bytes());
    }
    v.extend(dict.as_bytes());
    v.extend(data);
    v
}

#[test]
fn the_npy_reader_refuses_every_malformed_file_with_a_reason() {
    use kvgpt_core::export::read_npy;
    let six: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
    assert_eq!(read_npy(&npy(1, good, &six)).unwrap(), (vec![2, 3], (0..6).map(|i| i as f32).collect()));
    assert_eq!(read_npy(&npy(2, good, &six)).unwrap().0, vec![2, 3]);
    let one = "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }";
    assert_eq!(read_npy(&npy(1, one, &six)).unwrap().0, vec![6]);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"\x93NUM".to_vec(), "not a .npy file"),
        (npy(2, good, &six)[..10].to_vec(), "header length is cut short"),
        (npy(1, good, &six)[..30].to_vec(), "header says it is"),
        (npy(9, good, &six), "version 9"),
        (npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", &six), "shape entry"),
        (npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': 2, }", &six), "expected '('"),
        (npy(1, "{'descr': '<fé4', 'fortran_order': False, 'shape': (2, 3), }", &six), "dtype \"<fé4\""),
        (npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", &six), "float32 or float64"),
        (npy(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", &six), "Fortran"),
        (npy(1, "{'descr': '<f4', 'shape': (2, 3), }", &six), "no fortran_order"),
        (npy(1, good, &six[..20]), "needs exactly 24"),
        (npy(1, good, &[six.clone(), vec![0; 4]].concat()), "needs exactly 24"),
        (
            npy(
                1,
                "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }",
                &six,
            ),
            "too large",
        ),
        (npy(1, "[1, 2]", &six), "expected '{'"),
    ];
    for (bytes, want) in cases {
        let e = read_npy(&bytes).unwrap_err();
        assert!(e.contains(want), "{e:?} does not mention {want:?}");
    }
}

#[test]
fn verify_reference_checks_the_shape_against_the_prompt() {
    // HF's golden logits for the first prompt, [T, V], written as .npy; then transposed.
    let reference = Reference::load();
    let p = &reference.prompts()[0];
    let (shape, data) = reference.tensor(&format!("{}.logits", p.key)).unwrap();
    let (t, v) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let dir = tempfile::tempdir().unwrap();
    let as_npy = |name: &str, dims: (usize, usize), values: &[f32]| {
        let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", dims.0, dims.1);
        let body: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        let path = dir.path().join(name);
        std::fs::write(&path, npy(1, &dict, &body)).unwrap();
        path.display().to_string()
    };
    let good = as_npy("good.npy", (t, v), &data);
    let out = kvgpt(&["verify", "reference", &p.text, "--model", &model(), "--logits", &good]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut transposed = vec![0.0f32; t * v];
    for r in 0..t {
        for c in 0..v {
            transposed[c * t + r] = data[r * v + c];
        }
    }
    let bad = as_npy("transposed.npy", (v, t), &transposed);
    fails_with(
        &kvgpt(&["verify", "reference", &p.text, "--model", &model(), "--logits", &bad]),
        1,
        &[&format!("[{v}, {t}]"), "transposed?"],
    );
    let mut nan = data.clone();
    nan[5] = f32::NAN;
    let bad = as_npy("nan.npy", (t, v), &nan);
    fails_with(&kvgpt(&["verify", "reference", &p.text, "--model", &model(), "--logits", &bad]), 1, &["NaN", "finite"]);
}

// ---- 7. A tiny temperature is the T → 0 limit: greedy.

#[test]
fn a_tiny_temperature_gives_the_reference_greedy_ids() {
    let reference = Reference::load();
    let p = &reference.prompts()[0];
    let (n, m) = (p.greedy_ids.len().to_string(), model());
    for t in ["1e-38", "1e-45"] {
        for extra in [&[][..], &["--top-k", "1"][..]] {
            let mut args =
                vec!["generate", &p.text, "--model", &m, "-n", &n, "--ignore-eos", "--json", "--temperature", t];
            args.extend_from_slice(extra);
            let out = kvgpt(&args);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let ids: Vec<u32> =
                j["generated_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            assert_eq!(ids, p.greedy_ids, "T={t} {extra:?}");
        }
    }
}

// ---- 8. A user's number meeting a size: checked.

#[test]
fn huge_numbers_are_errors_not_panics() {
    let m = model();
    let max = u64::MAX.to_string();
    fails_with(
        &kvgpt(&["bench", "--model", &m, "-p", "4", "-n", &max, "-r", "1"]),
        1,
        &["does not fit the model's 128 positions", "(with -p 4, -n at most 124)"],
    );
    fails_with(&kvgpt(&["bench", "--model", &m, "--probe-mib", "17592186044415"]), 2, &["--probe-mib", "0..=65536"]);
    fails_with(
        &kvgpt(&["inspect", "cache", "x", "--model", &m, "--generate", &max]),
        1,
        &["exceeds", "--generate to at most 127"],
    );
    fails_with(&kvgpt(&["inspect", "attention", "x", "--model", &m, "--generate", &max]), 1, &["exceeds"]);
    fails_with(&kvgpt(&["generate", "x", "--model", &m, "-n", &max]), 2, &["--max-new-tokens"]);
    fails_with(&kvgpt(&["verify", "cache", "x", "--model", &m, "--steps", &max]), 2, &["--steps"]);
}

// ---- 9. Claims that are true.

#[test]
fn messages_and_limits_say_what_is_true() {
    let m = model();
    // Nothing to export from `inspect tokens`: refused, not a silent exit 0.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("ids.npy");
    fails_with(
        &kvgpt(&["inspect", "tokens", "x", "--model", &m, "--export", f.to_str().unwrap()]),
        1,
        &["no tensor to --export", "--json"],
    );
    assert!(!f.exists());
    // A 128-token prompt with one new token fits: the new token is never fed back.
    let long = vec!["a"; 128].join(" ");
    let out = kvgpt(&["generate", &long, "--model", &m, "-n", "1", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["prompt_ids"].as_array().unwrap().len(), 128);
    assert_eq!(j["generated_ids"].as_array().unwrap().len(), 1);
    fails_with(
        &kvgpt(&["generate", &long, "--model", &m, "-n", "2"]),
        1,
        &["room for 1 new tokens", "lower --max-new-tokens to at most 1"],
    );
    // Commands without a new-token flag are never told to lower one, nor to use "at most 0".
    let longer = vec!["a"; 130].join(" ");
    for cmd in [&["explain"][..], &["inspect", "logits"], &["inspect", "embeddings"]] {
        let mut args = cmd.to_vec();
        args.extend([longer.as_str(), "--model", &m]);
        let out = kvgpt(&args);
        fails_with(&out, 1, &["exceeds the model's 128 positions", "hint: shorten the prompt to at most 128 tokens"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("--max-new-tokens") && !err.contains("at most 0"), "{err}");
    }
}

// ---- 10. Messages.

#[test]
fn messages_name_the_real_problem() {
    let m = model();
    // A negative number: the option's own range error, not clap's misleading `-- -5` tip.
    for (flag, v) in [("-n", "-5"), ("--top-k", "-1")] {
        let out = kvgpt(&["generate", "x", "--model", &m, flag, v]);
        fails_with(&out, 2, &[&format!("invalid value '{v}'")]);
        assert!(!String::from_utf8_lossy(&out.stderr).contains("use '--"), "{}", String::from_utf8_lossy(&out.stderr));
    }
    // An empty or malformed model name is not tried as a URL.
    fails_with(&kvgpt(&["generate", "x", "--model", ""]), 1, &["the name is empty"]);
    fails_with(&kvgpt(&["generate", "x", "--model", "not a model?"]), 1, &["not a hub id"]);
    // A directory where a file should be.
    let dir = model_copy();
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    std::fs::create_dir(dir.path().join("config.json")).unwrap();
    fails_with(
        &kvgpt(&["generate", "x", "--model", dir.path().to_str().unwrap()]),
        1,
        &["config.json is a directory, not a file"],
    );
    let tmp = std::env::temp_dir();
    let t = tmp.to_str().unwrap();
    fails_with(&kvgpt(&["verify", "reference", "x", "--model", &m, "--logits", t]), 1, &["is a directory"]);
    // A folder as a prompt cache file is said once (the chain does not repeat it).
    let out = kvgpt(&["generate", "x", "--model", &m, "--prompt-cache", t]);
    fails_with(&out, 1, &["a prompt cache file must be a regular file, and this is a folder"]);
    assert_eq!(String::from_utf8_lossy(&out.stderr).matches("a folder").count(), 1);
}

// ---- Found by fuzzing (scripts/fuzz/fuzz.sh, target `tokenizer`): the tokenizers library panicked
// on a syntax error inside the `decoder` object.

#[test]
fn a_tokenizer_json_with_a_broken_decoder_is_an_error() {
    let bytes = br#"{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}, "post_processor": null, "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_: true}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}"#;
    let e = kvgpt_core::Tokenizer::from_json_bytes(bytes, "tokenizer.json").err().expect("refused");
    assert!(e.to_string().contains("tokenizer.json is not valid JSON"), "{e}");
    // Through the CLI, a model folder with that file: exit 1 naming it.
    let dir = model_copy();
    std::fs::write(dir.path().join("tokenizer.json"), bytes).unwrap();
    fails_with(
        &kvgpt(&["generate", "x", "--model", dir.path().to_str().unwrap()]),
        1,
        &["tokenizer.json is not valid JSON"],
    );
}
