//! What the CLI says in words: `--help` wrapped to the terminal's width (clap's wrap_help reads
//! it, or COLUMNS), and counts of one in the singular.

mod common;

use common::*;
use std::process::Command;

fn run(args: &[&str], columns: &str) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(args).env("COLUMNS", columns).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).unwrap(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn help_wraps_at_the_width_between_words() {
    for cmd in [&["generate"][..], &["chat"], &["serve"], &["bench"], &["inspect", "cache"], &["cache", "diff"]] {
        for width in [60usize, 100] {
            let (help, _) = run(&[cmd, &["--help"]].concat(), &width.to_string());
            for line in help.lines() {
                assert!(line.chars().count() <= width, "{cmd:?} at {width}: {line:?}");
            }
            // Wrapped between words: every word of the unwrapped text is still whole.
            let (wide, _) = run(&[cmd, &["--help"]].concat(), "1000");
            let words = |t: &str| t.split_whitespace().map(str::to_string).collect::<Vec<_>>();
            assert_eq!(words(&help), words(&wide), "{cmd:?} at {width}: a word was broken");
        }
    }
}

#[test]
fn counts_of_one_are_singular() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let (_, err) = run(&["generate", "x", "--model", &m, "-n", "2", "-t", "1"], "80");
    assert!(err.contains("prefill 1 token ") && err.contains("decode 1 token "), "{err}");
    assert!(err.contains(" 1 thread ") && !err.contains("1 threads"), "{err}");
    let (out, _) = run(&["inspect", "tokens", "a", "--model", &m], "80");
    assert!(out.starts_with("1 token, 1 byte "), "{out}");
    // The fixture has two layers: after layer 0 comes layer 1, not "layers 1 to 1".
    let (out, _) = run(&["explain", "The cat", "--model", &m], "80");
    assert!(out.contains("4. The same for layer 1. Then ln_f") && !out.contains("layers 1 to 1"), "{out}");
}
