//! The files a run reads and writes itself (issue #33 items 4 and 5). No output goes onto a file
//! the run reads: on e3c743f `chat --history M/config.json` rewrote the model's config and
//! `/save` overwrote the draft model's weights or the chat's own history. What is read must be a
//! regular file within a size: a FIFO as `--history`, `/load` or `--prompt-cache` hung forever,
//! `/dev/zero` aborted or took 2 GB, and a 1 GB `--api-key-file` became the key.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `kvgpt args` with `input` on stdin; fails the test if it runs past 60 s (a hang).
fn run(args: &[&str], input: &str) -> Output {
    kvgpt_within(args, &[], input)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A copy of the fixture model in a folder of its own.
fn model_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_side_files(dir.path());
    std::fs::copy(fixture_dir().join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    dir
}

fn fifo(dir: &Path) -> PathBuf {
    let path = dir.join("fifo");
    assert!(Command::new("mkfifo").arg(&path).status().unwrap().success());
    path
}

fn chat(model: &Path, extra: &[&str], input: &str) -> Output {
    let m = model.display().to_string();
    run(&[&["chat", "--model", &m, "-n", "3"], extra].concat(), input)
}

#[test]
fn a_chat_history_on_a_model_file_is_refused_and_the_file_kept() {
    let model = model_copy();
    let config = model.path().join("config.json");
    let before = std::fs::read(&config).unwrap();
    let out = chat(model.path(), &["--history", config.to_str().unwrap()], "Hi\n/quit\n");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let says = format!("{} is the model's config, which this run reads", config.display());
    assert!(err.contains(&says) && err.contains("this session keeps no history"), "{err}");
    assert_eq!(std::fs::read(&config).unwrap(), before, "the config is untouched");
}

#[test]
fn save_refuses_the_draft_models_weights_and_the_chats_own_history() {
    let (model, draft, dir) = (model_copy(), random_model::small_draft_model(), tempfile::tempdir().unwrap());
    let history = dir.path().join("history");
    let draft_weights = draft.path().join("model.safetensors");
    let before = std::fs::read(&draft_weights).unwrap();
    let saved = dir.path().join("saved.kvc");
    let input = format!(
        "Hi\n/save {}\n/save {}\n/save {}\n/quit\n",
        draft_weights.display(),
        history.display(),
        saved.display()
    );
    let d = draft.path().display().to_string();
    let out = chat(model.path(), &["--draft-model", &d, "--history", history.to_str().unwrap()], &input);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&format!("{} is the draft model's weights", draft_weights.display())), "{err}");
    assert!(err.contains(&format!("{} is the chat's input history", history.display())), "{err}");
    assert_eq!(std::fs::read(&draft_weights).unwrap(), before, "the draft's weights are untouched");
    let kept = std::fs::read_to_string(&history).unwrap();
    assert!(kept.contains("Hi") && kept.contains("/save"), "the history is still the history: {kept:?}");
    assert!(saved.exists(), "a /save elsewhere works");
}

#[test]
fn a_prompt_cache_on_the_draft_models_weights_is_refused() {
    let draft = random_model::small_draft_model();
    let weights = draft.path().join("model.safetensors");
    let before = std::fs::read(&weights).unwrap();
    let d = draft.path().display().to_string();
    let w = weights.display().to_string();
    let out =
        run(&["generate", "The cat", "-n", "3", "--model", &model(), "--draft-model", &d, "--prompt-cache", &w], "");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("is the draft model's weights, which this run reads"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&weights).unwrap(), before);
}

#[test]
fn a_chat_history_that_is_a_fifo_or_a_device_is_refused_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = fifo(dir.path());
    for (path, kind) in [(fifo.as_path(), "a pipe (FIFO)"), (Path::new("/dev/zero"), "a device")] {
        let out = chat(&fixture_dir(), &["--history", path.to_str().unwrap()], "Hi\n/quit\n");
        let err = stderr(&out);
        assert!(out.status.success(), "{err}");
        let says = format!("the chat history must be a regular file, and this is {kind}");
        assert!(err.contains(&says) && err.contains("this session keeps no history"), "{err}");
        assert!(err.contains("ended: --max-new-tokens"), "the chat went on: {err}");
    }
}

#[test]
fn load_and_prompt_cache_refuse_fifos_and_devices_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = fifo(dir.path());
    for (path, kind) in [(fifo.as_path(), "a pipe (FIFO)"), (Path::new("/dev/zero"), "a device")] {
        let says = format!("{}: a prompt cache file must be a regular file, and this is {kind}", path.display());
        let out = chat(&fixture_dir(), &["--no-history"], &format!("/load {}\nHi\n/quit\n", path.display()));
        let err = stderr(&out);
        assert!(out.status.success() && err.contains(&says), "{err}");
        assert!(err.contains("ended: --max-new-tokens"), "the chat went on: {err}");
        let p = path.display().to_string();
        let out = run(&["generate", "The cat", "-n", "3", "--model", &model(), "--prompt-cache", &p], "");
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(stderr(&out).contains(&says), "{}", stderr(&out));
    }
}

#[test]
fn a_prompt_cache_file_larger_than_the_models_context_can_fill_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.kvc");
    // A sparse file of 1 GB: the fixture's full context of K/V is under 1 MB.
    std::fs::File::create(&big).unwrap().set_len(1 << 30).unwrap();
    let b = big.display().to_string();
    let out = run(&["generate", "The cat", "-n", "3", "--model", &model(), "--prompt-cache", &b], "");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("a prompt cache file is larger than"), "{}", stderr(&out));
}

#[test]
fn an_api_key_file_must_be_small_and_not_a_device() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("key");
    std::fs::write(&big, "k".repeat(1 << 20)).unwrap();
    for (file, says) in [
        (big.as_path(), "an API key file is larger than 4096 bytes".to_string()),
        (Path::new("/dev/zero"), "an API key file must be a regular file, and this is a device".to_string()),
    ] {
        let f = file.display().to_string();
        let out = run(&["serve", "--model", &model(), "--port", "0", "--api-key-file", &f], "");
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(stderr(&out).contains(&says), "{}", stderr(&out));
    }
}

#[test]
fn model_files_that_are_fifos_or_devices_are_refused_without_hanging() {
    let model = model_copy();
    std::fs::remove_file(model.path().join("model.safetensors")).unwrap();
    assert!(Command::new("mkfifo").arg(model.path().join("model.safetensors")).status().unwrap().success());
    let m = model.path().display().to_string();
    let out = run(&["generate", "The cat", "-n", "3", "--model", &m], "");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("model.safetensors of a model folder must be a regular file, and this is a pipe (FIFO)"),
        "{}",
        stderr(&out)
    );
    let model = model_copy();
    std::fs::remove_file(model.path().join("config.json")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", model.path().join("config.json")).unwrap();
    let m = model.path().display().to_string();
    let out = run(&["generate", "The cat", "-n", "3", "--model", &m], "");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("config.json of a model folder must be a regular file, and this is a device"),
        "{}",
        stderr(&out)
    );
    // A FIFO named as a GGUF file.
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("model.gguf");
    assert!(Command::new("mkfifo").arg(&gguf).status().unwrap().success());
    let out = run(&["generate", "The cat", "-n", "3", "--model", gguf.to_str().unwrap()], "");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("a model file must be a regular file, and this is a pipe (FIFO)"),
        "{}",
        stderr(&out)
    );
}
