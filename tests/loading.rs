//! Checkpoint variants (f16, bf16, the prefix-less layout with mask buffers and lm_head) and
//! every class of bad input, each with its error.

mod common;

use common::*;
use half::{bf16, f16};
use kvgpt_core::{hub, Error, KvCache, Model, NoTap, Scratch};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// The fixture's tensors as (name, dtype, shape, bytes).
fn fixture_tensors() -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(fixture_dir().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<_> =
        st.tensors().into_iter().map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn write_checkpoint(dir: &Path, tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView)> =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// A model folder holding `tensors` next to the fixture's config and tokenizer.
fn variant(tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_side_files(dir.path());
    write_checkpoint(dir.path(), tensors);
    dir
}

fn logits_of(dir: &Path, ids: &[u32]) -> Vec<f32> {
    let loaded = kvgpt_core::load(&hub::local_folder(dir).unwrap()).unwrap();
    let cfg = &loaded.model.config;
    let mut logits = vec![0.0; ids.len() * cfg.vocab_size];
    let mut cache = KvCache::new(cfg);
    loaded.model.forward(ids, &mut cache, &mut Scratch::new(cfg, ids.len()), &mut NoTap, &mut logits).unwrap();
    logits
}

#[test]
fn sixteen_bit_checkpoints_load_exactly_and_match_within_rounding() {
    let reference = Reference::load();
    let p1 = &reference.prompts()[1];
    let (_, want) = reference.tensor("p1.logits").unwrap();
    let orig = fixture_tensors();
    // Expected deviation from rounding every weight to 16 bits, measured against the f32 reference:
    // f16 keeps 11 significant bits, bf16 8, so bf16 errors are ~8x larger.
    for (dtype, tol) in [(Dtype::F16, 0.04f32), (Dtype::BF16, 0.25f32)] {
        let converted: Vec<_> = orig
            .iter()
            .map(|(n, _, s, b)| {
                let bytes: Vec<u8> = f32s(b)
                    .iter()
                    .flat_map(|&x| match dtype {
                        Dtype::F16 => f16::from_f32(x).to_le_bytes(),
                        _ => bf16::from_f32(x).to_le_bytes(),
                    })
                    .collect();
                (n.clone(), dtype, s.clone(), bytes)
            })
            .collect();
        let dir = variant(&converted);
        let model = Model::load(&dir.path().join("config.json"), &dir.path().join("model.safetensors")).unwrap();
        // Every weight is exactly the 16-bit value widened to f32.
        let wte = f32s(&orig.iter().find(|t| t.0 == "transformer.wte.weight").unwrap().3);
        let rounded: Vec<f32> = wte
            .iter()
            .map(|&x| match dtype {
                Dtype::F16 => f16::from_f32(x).to_f32(),
                _ => bf16::from_f32(x).to_f32(),
            })
            .collect();
        // wte is held transposed ([C, V]): column v of the model's matrix is row v of the file's.
        let (v, c) = (model.config.vocab_size, model.config.n_embd);
        let held = model.wte.unpack();
        assert!((0..v).all(|t| (0..c).all(|i| held[i * v + t] == rounded[t * c + i])), "{dtype:?} wte");
        let logits = logits_of(dir.path(), &p1.ids);
        let d = assert_close(&format!("{dtype:?} logits"), &logits, &want, tol);
        println!("{dtype:?}: max |Δlogit| vs f32 reference = {d:.3e} (tolerance {tol})");
        let greedy = |l: &[f32]| kvgpt_core::sampler::argmax(&l[l.len() - 50257..]);
        assert_eq!(greedy(&logits), p1.top5_ids[0], "{dtype:?} top-1");
    }
}

#[test]
fn prefixless_layout_with_mask_buffers_and_lm_head_matches() {
    let reference = Reference::load();
    let (_, want) = reference.tensor("p1.logits").unwrap();
    let mut t: Vec<_> = fixture_tensors()
        .into_iter()
        .map(|(n, d, s, b)| (n.trim_start_matches("transformer.").to_string(), d, s, b))
        .collect();
    let n_pos = 128;
    let mask: Vec<u8> =
        (0..n_pos * n_pos).flat_map(|i| (if i % n_pos <= i / n_pos { 1.0f32 } else { 0.0 }).to_le_bytes()).collect();
    for l in 0..2 {
        t.push((format!("h.{l}.attn.bias"), Dtype::F32, vec![1, 1, n_pos, n_pos], mask.clone()));
        t.push((format!("h.{l}.attn.masked_bias"), Dtype::F32, vec![], (-1e4f32).to_le_bytes().to_vec()));
    }
    let wte = t.iter().find(|x| x.0 == "wte.weight").unwrap().clone();
    t.push(("lm_head.weight".into(), wte.1, wte.2, wte.3));
    let dir = variant(&t);
    let p1 = &reference.prompts()[1];
    let logits = logits_of(dir.path(), &p1.ids);
    assert_close("prefix-less logits", &logits, &want, 1e-4);
    assert!(logits == logits_of(&fixture_dir(), &p1.ids), "same bits as the prefixed file");
}

/// The error a folder with `tensors` and the fixture's side files gives, as text.
fn load_error(dir: &Path) -> String {
    match hub::local_folder(dir).and_then(|f| kvgpt_core::load(&f)) {
        Ok(_) => panic!("{} loaded but should not", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[track_caller]
fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "error {msg:?} does not mention {p:?}");
    }
}

#[test]
fn missing_files_are_named() {
    for missing in ["config.json", "model.safetensors"] {
        let dir = variant(&fixture_tensors());
        std::fs::remove_file(dir.path().join(missing)).unwrap();
        assert_mentions(&load_error(dir.path()), &[missing, "not found"]);
    }
    let dir = variant(&fixture_tensors());
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    std::fs::remove_file(dir.path().join("merges.txt")).unwrap();
    assert_mentions(&load_error(dir.path()), &["tokenizer.json", "not found"]);
}

#[test]
fn vocab_and_merges_work_without_tokenizer_json() {
    let dir = variant(&fixture_tensors());
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    let loaded = kvgpt_core::load(&hub::local_folder(dir.path()).unwrap()).unwrap();
    for p in Reference::load().prompts() {
        assert_eq!(loaded.tokenizer.encode(&p.text).unwrap(), p.ids, "{}", p.key);
    }
}

#[test]
fn bad_tensors_are_named_with_the_file() {
    let base = fixture_tensors();
    // Missing tensor.
    let t: Vec<_> = base.iter().filter(|t| t.0 != "transformer.h.1.mlp.c_fc.bias").cloned().collect();
    assert_mentions(
        &load_error(variant(&t).path()),
        &["transformer.h.1.mlp.c_fc.bias", "missing", "model.safetensors"],
    );
    // Wrong shape: c_attn stored [out, in] as nn.Linear would.
    let t: Vec<_> = base
        .iter()
        .map(|t| {
            if t.0 == "transformer.h.0.attn.c_attn.weight" {
                (t.0.clone(), t.1, vec![192, 64], t.3.clone())
            } else {
                t.clone()
            }
        })
        .collect();
    assert_mentions(&load_error(variant(&t).path()), &["transformer.h.0.attn.c_attn.weight", "[192, 64]", "[64, 192]"]);
    // Wrong dtype.
    let t: Vec<_> = base
        .iter()
        .map(|t| {
            if t.0 == "transformer.ln_f.bias" {
                (t.0.clone(), Dtype::I32, t.2.clone(), t.3.clone())
            } else {
                t.clone()
            }
        })
        .collect();
    assert_mentions(&load_error(variant(&t).path()), &["transformer.ln_f.bias", "I32", "F32, F16 and BF16"]);
}

#[test]
fn truncated_or_corrupt_weights_are_refused() {
    let dir = variant(&fixture_tensors());
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert_mentions(&load_error(dir.path()), &["not a valid safetensors file"]);
    std::fs::write(&path, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all").unwrap();
    assert_mentions(&load_error(dir.path()), &["not a valid safetensors file"]);
    std::fs::write(&path, b"abc").unwrap();
    assert_mentions(&load_error(dir.path()), &["not a valid safetensors file", "3 bytes"]);
}

fn with_config(edit: impl Fn(&mut serde_json::Value)) -> String {
    let dir = variant(&fixture_tensors());
    let path = dir.path().join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(&path, cfg.to_string()).unwrap();
    load_error(dir.path())
}

#[test]
fn unsupported_configs_name_the_key() {
    assert_mentions(&with_config(|c| c["activation_function"] = "relu".into()), &["activation_function", "relu"]);
    assert_mentions(&with_config(|c| c["model_type"] = "bert".into()), &["model_type", "bert"]);
    assert_mentions(&with_config(|c| c["n_head"] = 5.into()), &["n_head", "multiple"]);
    assert_mentions(&with_config(|c| c["tie_word_embeddings"] = false.into()), &["tie_word_embeddings"]);
    assert_mentions(&with_config(|c| c["n_layer"] = "two".into()), &["n_layer", "positive integer"]);
    assert_mentions(
        &with_config(|c| c.as_object_mut().unwrap().remove("n_embd").map(|_| ()).unwrap()),
        &["n_embd", "missing"],
    );
    // A config whose sizes disagree with the tensors: the shape error names both.
    assert_mentions(
        &with_config(|c| c["n_positions"] = 256.into()),
        &["transformer.wpe.weight", "[128, 64]", "[256, 64]"],
    );
    // Unknown keys are ignored, and the real distilgpt2 config's extra keys load.
    let dir = variant(&fixture_tensors());
    let path = dir.path().join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    cfg["n_ctx"] = 128.into();
    cfg["task_specific_params"] = serde_json::json!({"text-generation": {"do_sample": true}});
    cfg["torch_dtype"] = "float32".into();
    cfg["something_new"] = 1.into();
    std::fs::write(&path, cfg.to_string()).unwrap();
    assert!(kvgpt_core::load(&hub::local_folder(dir.path()).unwrap()).is_ok());
}

#[test]
fn tokenizer_vocabulary_must_match_the_model() {
    let v = 1000usize;
    let t: Vec<_> =
        fixture_tensors()
            .into_iter()
            .map(|(n, d, s, b)| {
                if n == "transformer.wte.weight" {
                    (n, d, vec![v, 64], b[..v * 64 * 4].to_vec())
                } else {
                    (n, d, s, b)
                }
            })
            .collect();
    let dir = variant(&t);
    let path = dir.path().join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    cfg["vocab_size"] = v.into();
    cfg["bos_token_id"] = 0.into();
    cfg["eos_token_id"] = 0.into();
    std::fs::write(&path, cfg.to_string()).unwrap();
    assert_mentions(&load_error(dir.path()), &["50257 tokens", "1000"]);
}

#[test]
fn context_overflow_is_an_error_before_any_work() {
    let loaded = load_fixture();
    let ids = vec![464u32; 100];
    let opts = kvgpt_core::GenerateOptions { max_new_tokens: 30, ..Default::default() };
    let err =
        kvgpt_core::generate(&loaded.model, &ids, &opts, &mut |_, _| panic!("no token may be produced")).unwrap_err();
    assert!(matches!(err, Error::ContextOverflow { prompt: 100, new: 30, n_positions: 128, room: 29 }));
    assert_mentions(&err.to_string(), &["prompt of 100 tokens + 30 new tokens exceeds the model's 128 positions"]);
    // 29 fit: the last new token is sampled, never fed, so 100 + 28 positions are run.
    let opts = kvgpt_core::GenerateOptions { max_new_tokens: 29, stop_at_eos: false, ..Default::default() };
    let g = kvgpt_core::generate(&loaded.model, &ids, &opts, &mut |_, _| Ok(kvgpt_core::Step::Go)).unwrap();
    assert_eq!(g.generated_ids.len(), 29);
    // The cache refuses positions past its capacity with a typed error.
    let cfg = &loaded.model.config;
    let mut cache = KvCache::new(cfg);
    let mut scratch = Scratch::new(cfg, 1);
    let mut logits = vec![0.0; cfg.vocab_size];
    loaded.model.forward(&vec![464; 128], &mut cache, &mut scratch, &mut NoTap, &mut logits).unwrap();
    let err = loaded.model.forward(&[464], &mut cache, &mut scratch, &mut NoTap, &mut logits).unwrap_err();
    assert!(matches!(err, Error::CacheOverflow { len: 128, new: 1, capacity: 128 }), "{err}");
    let err =
        loaded.model.forward(&[50257], &mut KvCache::new(cfg), &mut scratch, &mut NoTap, &mut logits).unwrap_err();
    assert!(matches!(err, Error::BadTokenId { id: 50257, .. }), "{err}");
}

// ---- Issue #9, class 1: config sizes are checked against the file's header before anything is
// allocated; class 5: the file is read, not mapped; class 6: non-finite values are named.

#[test]
fn config_sizes_are_checked_against_the_header_before_allocating() {
    // Sizes that would ask for terabytes: refused by the shape check, naming key and shapes.
    assert_mentions(
        &with_config(|c| c["n_positions"] = 1_000_000_000_000u64.into()),
        &["transformer.wpe.weight", "[128, 64]", "[1000000000000, 64]", "n_positions × n_embd"],
    );
    assert_mentions(
        &with_config(|c| c["vocab_size"] = 1_000_000_000_000u64.into()),
        &["transformer.wte.weight", "[50257, 64]", "vocab_size × n_embd"],
    );
    assert_mentions(&with_config(|c| c["n_embd"] = (1u64 << 62).into()), &["n_embd", "too large"]);
    assert_mentions(&with_config(|c| c["n_inner"] = (1u64 << 40).into()), &["mlp.c_fc.weight", "n_inner"]);
    // HF's alternative key names, and a config without eos_token_id, load (no map index panics).
    let dir = variant(&fixture_tensors());
    let path = dir.path().join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let o = cfg.as_object_mut().unwrap();
    for (old, new) in [("n_head", "num_attention_heads"), ("n_layer", "num_hidden_layers"), ("n_embd", "hidden_size")] {
        let v = o.remove(old).unwrap();
        o.insert(new.into(), v);
    }
    o.remove("eos_token_id");
    o.remove("bos_token_id");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let loaded = kvgpt_core::load(&hub::local_folder(dir.path()).unwrap()).unwrap();
    assert_eq!((loaded.model.config.n_head, loaded.model.config.eos_token_id), (4, 50256));
    // An alias with a bad value is refused without a panic.
    assert_mentions(
        &with_config(|c| {
            let o = c.as_object_mut().unwrap();
            o.remove("n_head");
            o.insert("num_attention_heads".into(), 5.into());
        }),
        &["n_head", "multiple"],
    );
    // Fewer layers in the config than blocks in the file: refused, not silently dropped.
    assert_mentions(&with_config(|c| c["n_layer"] = 1.into()), &["n_layer = 1", "2 transformer blocks", "h.0 … h.1"]);
    // An epsilon that is finite in f64 but infinite in f32.
    assert_mentions(&with_config(|c| c["layer_norm_epsilon"] = 1e300.into()), &["layer_norm_epsilon", "f32"]);
}

#[test]
fn header_faults_name_the_tensor() {
    let dir = variant(&fixture_tensors());
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap().to_string();
    let rewrite = |h: &str| {
        let mut h = h.to_string();
        while h.len() < n {
            h.push(' ');
        }
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend(h.as_bytes());
        out.extend(&bytes[8 + n..]);
        std::fs::write(&path, out).unwrap();
        load_error(dir.path())
    };
    // data_offsets that disagree with the shape: the tensor is named.
    let mut v: serde_json::Value = serde_json::from_str(&header).unwrap();
    let t = &mut v["transformer.ln_f.bias"];
    t["shape"] = serde_json::json!([63]);
    assert_mentions(&rewrite(&v.to_string()), &["transformer.ln_f.bias", "[63]", "data_offsets"]);
    // Unknown dtype, a bad shape entry, overlapping offsets.
    let mut v: serde_json::Value = serde_json::from_str(&header).unwrap();
    v["transformer.ln_f.bias"]["dtype"] = "F33".into();
    assert_mentions(&rewrite(&v.to_string()), &["transformer.ln_f.bias", "unknown dtype \"F33\""]);
    let mut v: serde_json::Value = serde_json::from_str(&header).unwrap();
    v["transformer.ln_f.bias"]["shape"] = serde_json::json!([-64]);
    assert_mentions(&rewrite(&v.to_string()), &["transformer.ln_f.bias", "non-negative integers"]);
    // The data section cut short: truncated, with the sizes.
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    assert_mentions(&load_error(dir.path()), &["truncated", "model.safetensors"]);
    // A directory where the weights file should be.
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    assert_mentions(&load_error(dir.path()), &["model.safetensors", "is a directory"]);
}

#[test]
fn non_finite_weights_are_named_at_load() {
    for (bad, shown) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf"), (f32::NEG_INFINITY, "-inf")] {
        let t: Vec<_> = fixture_tensors()
            .into_iter()
            .map(|mut t| {
                if t.0 == "transformer.h.1.mlp.c_fc.weight" {
                    let at = (3 * 256 + 17) * 4; // element [3, 17] of [64, 256]
                    t.3[at..at + 4].copy_from_slice(&bad.to_le_bytes());
                }
                t
            })
            .collect();
        assert_mentions(&load_error(variant(&t).path()), &["transformer.h.1.mlp.c_fc.weight", shown, "[3, 17]"]);
    }
}

#[test]
fn a_weights_file_that_shrinks_while_loading_is_an_error_not_sigbus() {
    // The reader holds no map of the file: truncating it after the header was read gives a short
    // read, reported as such (a memory map would die of SIGBUS here).
    let dir = variant(&fixture_tensors());
    let path = dir.path().join("model.safetensors");
    let ck = kvgpt_core::weights::Checkpoint::open(&path).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len / 3).unwrap();
    let e = ck.tensor("wte.weight", &[50257, 64]).unwrap_err().to_string();
    assert_mentions(&e, &["model.safetensors", "ended before tensor `transformer.wte.weight`", "being written"]);
}

#[test]
fn finite_weights_that_overflow_give_an_error_not_garbage() {
    // One huge (finite) weight in the first MLP: the activations overflow to inf, the logits to NaN.
    let t: Vec<_> = fixture_tensors()
        .into_iter()
        .map(|mut t| {
            if t.0 == "transformer.h.0.mlp.c_fc.weight" {
                for i in 0..64 {
                    let at = (i * 256 + 5) * 4;
                    t.3[at..at + 4].copy_from_slice(&3e38f32.to_le_bytes());
                }
            }
            t
        })
        .collect();
    let dir = variant(&t);
    let loaded = kvgpt_core::load(&hub::local_folder(dir.path()).unwrap()).unwrap();
    let opts = kvgpt_core::GenerateOptions::default();
    let err =
        kvgpt_core::generate(&loaded.model, &[464, 3797], &opts, &mut |_, _| Ok(kvgpt_core::Step::Go)).unwrap_err();
    assert!(matches!(err, Error::NonFiniteLogits { position: 1, .. }), "{err}");
    assert_mentions(&err.to_string(), &["not finite", "overflowed f32"]);
    // verify cache says so too, instead of blaming the cache.
    let e = kvgpt_views::verify::cache_vs_recompute(&loaded.model, &[464, 3797], 3, 0.0).unwrap_err();
    assert_mentions(&e.to_string(), &["not finite"]);
}
