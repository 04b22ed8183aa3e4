//! `kvgpt info` on llama.cpp's GGUF files (tests/fixtures/gguf, written by its converter): the
//! version, the architecture, the tensors counted by type, the metadata that matters and the
//! file's size, against a reading of the header done here from the GGUF format's definition.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

/// What the header says: (version, tensor types by ggml type id, metadata key count, the
/// context length, the architecture).
fn header(bytes: &[u8]) -> (u32, BTreeMap<u32, usize>, u64, u64, String) {
    let mut at = 0usize;
    let mut take = |n: usize| {
        let s = &bytes[at..at + n];
        at += n;
        s
    };
    fn u32_of(b: &[u8]) -> u32 {
        u32::from_le_bytes(b.try_into().unwrap())
    }
    fn u64_of(b: &[u8]) -> u64 {
        u64::from_le_bytes(b.try_into().unwrap())
    }
    assert_eq!(take(4), b"GGUF");
    let version = u32_of(take(4));
    let (n_tensors, n_kv) = (u64_of(take(8)), u64_of(take(8)));
    let (mut ctx, mut arch) = (0, String::new());
    // Value sizes by GGUF type: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string,
    // 9 array, 10 u64, 11 i64, 12 f64.
    fn skip(take: &mut dyn FnMut(usize) -> Vec<u8>, t: u32) -> Vec<u8> {
        match t {
            0 | 1 | 7 => take(1),
            2 | 3 => take(2),
            4..=6 => take(4),
            10..=12 => take(8),
            8 => {
                let n = u64::from_le_bytes(take(8).try_into().unwrap()) as usize;
                take(n)
            }
            9 => {
                let et = u32::from_le_bytes(take(4).try_into().unwrap());
                let n = u64::from_le_bytes(take(8).try_into().unwrap());
                for _ in 0..n {
                    skip(take, et);
                }
                vec![]
            }
            _ => panic!("GGUF value type {t}"),
        }
    }
    let mut take_vec = |n: usize| take(n).to_vec();
    let mut types = BTreeMap::new();
    for _ in 0..n_kv {
        let klen = u64_of(&take_vec(8)) as usize;
        let key = String::from_utf8(take_vec(klen)).unwrap();
        let t = u32_of(&take_vec(4));
        let v = skip(&mut take_vec, t);
        match key.as_str() {
            "gpt2.context_length" => ctx = u32_of(&v) as u64,
            "general.architecture" => arch = String::from_utf8(v).unwrap(),
            _ => {}
        }
    }
    for _ in 0..n_tensors {
        let nlen = u64_of(&take_vec(8)) as usize;
        take_vec(nlen);
        let nd = u32_of(&take_vec(4)) as usize;
        take_vec(8 * nd);
        *types.entry(u32_of(&take_vec(4))).or_insert(0) += 1;
        take_vec(8); // offset
    }
    (version, types, n_kv, ctx, arch)
}

#[test]
fn info_on_a_gguf_says_what_its_header_says_once() {
    let names = BTreeMap::from([(0u32, "f32"), (1, "f16"), (8, "q8_0")]);
    for t in ["f32", "f16", "q8_0"] {
        let path = fixture_dir().parent().unwrap().join(format!("gguf/tiny-gpt2-{t}.gguf"));
        let bytes = std::fs::read(&path).unwrap();
        let (version, types, n_kv, ctx, arch) = header(&bytes);
        let p = path.to_str().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(["info", "--model", p, "--json"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        let g = &j["gguf"];
        assert_eq!(g["version"].as_u64(), Some(u64::from(version)));
        assert_eq!(g["architecture"].as_str(), Some(arch.as_str()));
        assert_eq!(g["file_bytes"].as_u64(), Some(bytes.len() as u64));
        assert_eq!(g["metadata_keys"].as_u64(), Some(n_kv));
        let got: BTreeMap<String, u64> = g["tensor_types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_u64().unwrap()))
            .collect();
        let want: BTreeMap<String, u64> = types.iter().map(|(k, &n)| (names[k].to_string(), n as u64)).collect();
        assert_eq!(got, want, "{t}: tensors by type");
        let meta: BTreeMap<String, String> = g["metadata"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_str().unwrap().to_string()))
            .collect();
        assert_eq!(meta["gpt2.context_length"], ctx.to_string());
        // The text names the file once, with its header's facts.
        let out = Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(["info", "--model", p]).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(text.lines().filter(|l| l.contains(p)).count(), 2, "the model line and the file line: {text}");
        let line = text.lines().find(|l| l.starts_with("file ")).unwrap();
        let tensors: usize = types.values().sum();
        assert!(line.contains(&format!("GGUF version {version}, architecture {arch}, {tensors} tensors (")), "{line}");
    }
}
