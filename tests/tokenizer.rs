//! The tokenizer against the reference ids, in every file form, and decoding round trips.

mod common;

use common::*;
use kvgpt_core::Tokenizer;

#[test]
fn every_fixture_prompt_gets_the_reference_ids_in_every_file_form() {
    let dir = fixture_dir();
    let json = Tokenizer::from_json_file(&dir.join("tokenizer.json")).unwrap();
    let vm = Tokenizer::from_vocab_merges(&dir.join("vocab.json"), &dir.join("merges.txt")).unwrap();
    // Newer `tokenizers` versions save merges as ["a", "b"] pairs instead of "a b" strings.
    let tmp = tempfile::tempdir().unwrap();
    let mut tj: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json")).unwrap()).unwrap();
    let pairs: Vec<serde_json::Value> = tj["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let (a, b) = m.as_str().unwrap().split_once(' ').unwrap();
            serde_json::json!([a, b])
        })
        .collect();
    tj["model"]["merges"] = pairs.into();
    std::fs::write(tmp.path().join("tokenizer.json"), tj.to_string()).unwrap();
    let pairs = Tokenizer::from_json_file(&tmp.path().join("tokenizer.json")).unwrap();
    for tok in [&json, &vm, &pairs] {
        assert_eq!(tok.vocab_size(), 50257);
        for p in Reference::load().prompts() {
            assert_eq!(tok.encode(&p.text).unwrap(), p.ids, "{}", p.key);
        }
        assert_eq!(tok.encode("The cat sat on").unwrap(), vec![464, 3797, 3332, 319]);
        assert_eq!(tok.decode(&[262]), " the");
        assert_eq!(tok.encode("<|endoftext|>").unwrap(), vec![50256]);
    }
}

#[test]
fn decoding_round_trips_and_matches_hf_decode() {
    let tok = Tokenizer::from_json_file(&fixture_dir().join("tokenizer.json")).unwrap();
    let reference = Reference::load();
    for (p, raw) in reference.prompts().iter().zip(reference.json["prompts"].as_array().unwrap()) {
        assert_eq!(tok.decode(&p.ids), p.text, "{}", p.key);
        let all: Vec<u32> = p.ids.iter().chain(&p.greedy_ids).copied().collect();
        assert_eq!(tok.decode(&all), raw["greedy"]["full_text"].as_str().unwrap(), "{} full_text", p.key);
        assert_eq!(tok.decode(&p.greedy_ids), p.greedy_text, "{} text", p.key);
    }
    for text in ["", " ", "a\nb\r\n\ttab", "émoji 🦀 and 今天天气怎么样？", "  double  spaces  ", "'s 're 've"]
    {
        assert_eq!(tok.decode(&tok.encode(text).unwrap()), text);
    }
}

#[test]
fn streaming_decode_of_split_characters_equals_whole_decode() {
    let tok = Tokenizer::from_json_file(&fixture_dir().join("tokenizer.json")).unwrap();
    for p in Reference::load().prompts() {
        let all: Vec<u32> = p.ids.iter().chain(&p.greedy_ids).copied().collect();
        let mut s = kvgpt_core::StreamDecoder::default();
        let mut out = String::new();
        for &id in &all {
            let piece = s.push(tok.token_bytes(id));
            assert!(!piece.contains('\u{FFFD}') || tok.decode(&all).contains('\u{FFFD}'));
            out.push_str(&piece);
        }
        out.push_str(&s.finish());
        assert_eq!(out, tok.decode(&all), "{}", p.key);
    }
}
