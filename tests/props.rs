//! Property tests (issue #9): real inputs — the fixture's safetensors header, config.json,
//! tokenizer.json, a saved prompt cache, a .npy file — mutated at random; every reader must return
//! `Ok` or an `Err` with a message, never panic. (Request bodies: core/src/openai/request/tests.rs.)

mod common;

use common::*;
use kvgpt_core::weights::{parse_header, Checkpoint};
use proptest::prelude::*;
use std::sync::OnceLock;

/// The first bytes of the fixture's weights: the 8-byte length and the header, and the file's length.
fn header_bytes() -> &'static (Vec<u8>, u64) {
    static H: OnceLock<(Vec<u8>, u64)> = OnceLock::new();
    H.get_or_init(|| {
        let bytes = std::fs::read(fixture_dir().join("model.safetensors")).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        (bytes[..8 + n].to_vec(), bytes.len() as u64)
    })
}

fn model() -> &'static kvgpt_core::Loaded {
    static M: OnceLock<kvgpt_core::Loaded> = OnceLock::new();
    M.get_or_init(load_fixture)
}

/// Edits applied to a byte string: overwrite, insert or delete at a position (scaled to its length).
#[derive(Clone, Debug)]
enum Edit {
    Set(f64, u8),
    Insert(f64, Vec<u8>),
    Delete(f64, usize),
    Truncate(f64),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (0.0..1.0f64, any::<u8>()).prop_map(|(p, b)| Edit::Set(p, b)),
        (0.0..1.0f64, prop::collection::vec(any::<u8>(), 1..8)).prop_map(|(p, b)| Edit::Insert(p, b)),
        (0.0..1.0f64, 1..16usize).prop_map(|(p, n)| Edit::Delete(p, n)),
        (0.0..1.0f64).prop_map(Edit::Truncate),
    ]
}

/// Like `edit`, but also writes JSON-significant text (digits, quotes, brackets, big numbers).
fn json_edit() -> impl Strategy<Value = Edit> {
    let tokens = prop::sample::select(vec![
        "0",
        "-1",
        "1e300",
        "18446744073709551616",
        "4611686018427387904",
        "\"",
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "null",
        "true",
        "\"F33\"",
        "[1,2]",
        "é",
        "\\u0000",
    ]);
    prop_oneof![edit(), (0.0..1.0f64, tokens).prop_map(|(p, t)| Edit::Insert(p, t.as_bytes().to_vec()))]
}

fn apply(mut v: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let at = |p: f64, len: usize| ((p * len as f64) as usize).min(len);
        match e {
            Edit::Set(p, b) if !v.is_empty() => {
                let i = at(*p, v.len() - 1);
                v[i] = *b;
            }
            Edit::Insert(p, b) => {
                let i = at(*p, v.len());
                v.splice(i..i, b.iter().copied());
            }
            Edit::Delete(p, n) => {
                let i = at(*p, v.len());
                v.drain(i..(i + n).min(v.len()));
            }
            Edit::Truncate(p) => {
                let n = at(*p, v.len());
                v.truncate(n);
            }
            _ => {}
        }
    }
    v
}

/// Edits that keep the 8-byte length field consistent with the edited header text, so that the
/// mutations reach the JSON and the offsets, not only the length check.
fn reheader(head: &[u8]) -> Vec<u8> {
    let text = head.get(8..).unwrap_or(&[]);
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn safetensors_headers_never_panic(edits in prop::collection::vec(json_edit(), 1..6), fix_len in any::<bool>()) {
        let (head, len) = header_bytes();
        let mutated = apply(head.clone(), &edits);
        let mutated = if fix_len { reheader(&mutated) } else { mutated };
        let file_len = len - head.len() as u64 + mutated.len() as u64;
        if let Err(e) = parse_header(&mutated, file_len) {
            prop_assert!(!e.is_empty());
        }
    }

    #[test]
    fn configs_never_panic_and_agree_with_the_file_or_say_why(edits in prop::collection::vec(json_edit(), 1..5)) {
        let text = std::fs::read(fixture_dir().join("config.json")).unwrap();
        let mutated = apply(text, &edits);
        let path = std::path::Path::new("config.json");
        let parsed = serde_json::from_slice::<serde_json::Value>(&mutated);
        if let Ok(json) = parsed {
            match kvgpt_core::Config::from_json(&json, path) {
                Ok(cfg) => {
                    // A config that parses is checked against the header before anything is allocated.
                    let ck = Checkpoint::open(&fixture_dir().join("model.safetensors")).unwrap();
                    if let Err(e) = ck.check(&cfg) {
                        prop_assert!(!e.to_string().is_empty());
                    }
                }
                Err(e) => prop_assert!(e.to_string().contains("config.json")),
            }
        }
    }

    #[test]
    fn npy_files_never_panic(edits in prop::collection::vec(json_edit(), 1..6)) {
        let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }          \n";
        let mut good = b"\x93NUMPY\x01\x00".to_vec();
        good.extend((dict.len() as u16).to_le_bytes());
        good.extend(dict.as_bytes());
        good.extend((0..6).flat_map(|i| (i as f32).to_le_bytes()));
        if let Err(e) = kvgpt_core::export::read_npy(&apply(good, &edits)) {
            prop_assert!(!e.is_empty());
        }
    }

    #[test]
    fn prompt_cache_files_never_panic(edits in prop::collection::vec(json_edit(), 1..5), fix_sum in any::<bool>()) {
        let loaded = model();
        let m = &loaded.model;
        let ids = [464u32, 3797, 3332, 319];
        let mut seq = kvgpt_core::Sequence::new(m, &ids, 1, kvgpt_core::Sampling::GREEDY).unwrap();
        seq.feed(m, &mut kvgpt_core::Scratch::new(&m.config, ids.len())).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.kvpc");
        kvgpt_core::prompt_file::save(&path, m, &ids, seq.cache()).unwrap();
        let mut bytes = apply(std::fs::read(&path).unwrap(), &edits);
        if fix_sum && bytes.len() >= 8 {
            // A hostile file can carry a correct checksum: recompute it so the parser goes deeper.
            let n = bytes.len() - 8;
            let sum = kvgpt_core::prompt_file::fnv1a(kvgpt_core::prompt_file::FNV_OFFSET, &bytes[..n]);
            bytes[n..].copy_from_slice(&sum.to_le_bytes());
        }
        if let Err(e) = kvgpt_core::prompt_file::parse(&bytes, m, &path) {
            prop_assert!(e.to_string().contains("p.kvpc"));
        }
    }
}

proptest! {
    // tokenizer.json is 2 MB: fewer cases.
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn tokenizer_files_never_panic(edits in prop::collection::vec(json_edit(), 1..4)) {
        let text = std::fs::read(fixture_dir().join("tokenizer.json")).unwrap();
        let mutated = apply(text, &edits);
        match kvgpt_core::Tokenizer::from_json_bytes(&mutated, "tokenizer.json") {
            Ok(t) => { let _ = t.encode("The cat sat on the mat"); }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
