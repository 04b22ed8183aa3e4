//! GGUF files that llama.cpp refuses, and metadata that used to fall back to a default without a
//! word (issue #33 items 6 and 7): each is made from the fixture's Q8_0 GGUF and must end
//! `kvgpt generate` with an error that names what was wrong. On e3c743f misaligned offsets loaded
//! shifted data, duplicate keys and tensor names were accepted (the last won), a NaN epsilon
//! became 1e-5 and an eos id of −1 became 50256, all with exit 0.

mod common;

use common::gguf_edit::{string_bytes, GgufFile, Kv, TensorEntry};
use common::*;
use std::process::Command;

/// `kvgpt generate` on the fixture's Q8_0 GGUF after `edit`: (exit code, stderr).
fn generate_edited(edit: impl FnOnce(&mut GgufFile)) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut g = GgufFile::read(&gguf_fixture("q8_0"));
    edit(&mut g);
    let file = dir.path().join("edited.gguf");
    g.write(&file);
    let out = Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(["generate", "The cat", "-n", "2", "--model", &file.display().to_string()])
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn assert_refused((status, err): (Option<i32>, String), says: &str) {
    assert_eq!(status, Some(1), "refused with a clean error: {err}");
    assert!(err.contains(says), "the error says `{says}`: {err}");
}

#[test]
fn the_editor_puts_the_fixture_back_together_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("same.gguf");
    GgufFile::read(&gguf_fixture("q8_0")).write(&file);
    assert_eq!(std::fs::read(&file).unwrap(), std::fs::read(gguf_fixture("q8_0")).unwrap());
    let (status, err) = generate_edited(|_| {});
    assert_eq!(status, Some(0), "{err}");
}

#[test]
fn a_tensor_offset_off_the_alignment_is_refused() {
    for shift in [1, 4] {
        let out = generate_edited(|g| g.tensors[1].offset += shift);
        let at = 768 + shift;
        assert_refused(out, &format!("tensor `blk.0.attn_qkv.weight` starts at offset {at}, not a multiple of 32"));
    }
}

#[test]
fn overlapping_tensors_are_refused() {
    // blk.0.attn_output.bias starts inside blk.0.attn_qkv.weight (aligned, but overlapping).
    let out = generate_edited(|g| g.tensors[2].offset = 768 + 32);
    assert_refused(out, "tensors `blk.0.attn_qkv.weight` and `blk.0.attn_output.bias` overlap");
}

#[test]
fn an_alignment_that_is_not_a_power_of_two_is_refused() {
    let out = generate_edited(|g| g.set("general.alignment", 4, 48u32.to_le_bytes().to_vec()));
    assert_refused(out, "general.alignment is 48; it must be a power of two");
}

#[test]
fn a_metadata_key_given_twice_is_refused() {
    let out = generate_edited(|g| {
        let eps = g.get("gpt2.attention.layer_norm_epsilon");
        let again = Kv { key: eps.key.clone(), ty: 6, raw: 0.5f32.to_le_bytes().to_vec() };
        g.kv.push(again);
    });
    assert_refused(out, "the metadata key `gpt2.attention.layer_norm_epsilon` appears twice");
}

#[test]
fn a_tensor_name_given_twice_is_refused() {
    let out = generate_edited(|g| {
        let b1 = &g.tensors[12];
        assert_eq!(b1.name, "blk.1.attn_qkv.bias");
        let again =
            TensorEntry { name: "blk.0.attn_qkv.bias".into(), dims: b1.dims.clone(), ty: b1.ty, offset: b1.offset };
        g.tensors.push(again);
    });
    assert_refused(out, "tensor `blk.0.attn_qkv.bias` appears twice");
}

/// An array of `n` u8 values under `key`.
fn u8_array(n: u64) -> Vec<u8> {
    let mut raw = 0u32.to_le_bytes().to_vec();
    raw.extend(n.to_le_bytes());
    raw.resize(raw.len() + n as usize, 7);
    raw
}

#[test]
fn a_header_past_the_limits_says_the_limit_it_hit() {
    // The 18.8 MB header: one array of 17 million values.
    let out = generate_edited(|g| g.set("test.big", 9, u8_array(17_000_000)));
    assert_refused(out, "an array of 17000000 values; kvgpt reads arrays of at most 1048576");
    // Many arrays each under that limit, but a header past what kvgpt reads of one.
    let out = generate_edited(|g| (0..17).for_each(|i| g.set(&format!("test.big{i}"), 9, u8_array(1_000_000))));
    assert_refused(out, "its header runs past the first 16 MiB, the most kvgpt reads of a GGUF header");
    // A count that the rest of the header cannot hold is refused before anything is made for it.
    let out = generate_edited(|g| {
        let mut raw = 10u32.to_le_bytes().to_vec(); // u64 values: 8 MB, in a file of 5.3 MB
        raw.extend(1_000_000u64.to_le_bytes());
        g.set("test.short", 9, raw);
    });
    assert_refused(out, "an array of 1000000 values, more than the rest of the file holds");
}

#[test]
fn a_layer_norm_epsilon_that_is_not_a_positive_number_is_refused() {
    let key = "gpt2.attention.layer_norm_epsilon";
    for (eps, says) in [
        (f32::NAN, format!("{key} is NaN, not a finite number")),
        (f32::INFINITY, format!("{key} is inf, not a finite number")),
        (0.0, format!("`{key}` = 0.0 is not supported: expected a positive number")),
        (-1e-5, format!("`{key}` = -9.999999747378752e-6 is not supported: expected a positive number")),
    ] {
        assert_refused(generate_edited(|g| g.set(key, 6, eps.to_le_bytes().to_vec())), &says);
    }
}

#[test]
fn a_token_id_out_of_range_is_refused_naming_its_key() {
    let eos = "tokenizer.ggml.eos_token_id";
    let out = generate_edited(|g| g.set(eos, 5, (-1i32).to_le_bytes().to_vec()));
    assert_refused(out, &format!("{eos} is -1; it must be a token id"));
    let bos = "tokenizer.ggml.bos_token_id";
    let out = generate_edited(|g| g.set(bos, 10, (1u64 << 40).to_le_bytes().to_vec()));
    assert_refused(out, &format!("{bos} is 1099511627776; it must be a token id"));
    // An id past the vocabulary is no token either.
    let out = generate_edited(|g| g.set(eos, 4, 50257u32.to_le_bytes().to_vec()));
    assert_refused(out, &format!("`{eos}` = 50257 is not supported: outside the vocabulary of 50257 tokens"));
    // One that is not a number at all.
    let out = generate_edited(|g| g.set(eos, 8, string_bytes("50256")));
    assert_refused(out, &format!("{eos} is `50256`"));
}
