//! K/V held as f16, bf16 and q8_0 (`--kv-dtype`, issue #34): near Hugging Face's logits, the same
//! bits cached or recomputed and on every instruction set (tests/kv_pool.rs's property test runs
//! every type batched, preempted and from shared prompt-cache blocks against `generate()` alone),
//! `score --kv-dtype` reporting KL, top-1 agreement and perplexity against f32 K/V, and the bytes
//! per position llama.cpp's types take.

mod common;

use common::*;
use kvgpt_core::{Isa, KvCache, KvSpec, KvType, Model};

fn model_as(ty: KvType) -> Model {
    let loaded = load_fixture();
    Model::load(&loaded.files.config, &loaded.files.weights).unwrap().with_kv(KvSpec::default().with_type(ty))
}

#[test]
fn every_kv_type_stays_near_hf_and_keeps_its_bits_cached_and_on_every_isa() {
    let reference = Reference::load();
    let prompts = reference.prompts();
    for (ty, tol) in [(KvType::F32, 1e-4), (KvType::F16, 1e-2), (KvType::Bf16, 8e-2), (KvType::Q8_0, 0.2)] {
        let model = model_as(ty);
        let (worst, agree, n) = against_hf(&model, &reference);
        println!("K/V {}: max |Δlogit| vs HF {worst:.2e}, argmax {agree}/{n}", ty.name());
        assert!(worst <= tol, "{}: max |Δlogit| {worst} vs HF", ty.name());
        assert_eq!(agree, n, "{}: every position's top token is HF's", ty.name());
        let c = kvgpt_views::verify::cache_vs_recompute(&model, &prompts[1].ids, 20, 0.0).unwrap();
        assert!(c.passes() && c.max_abs_diff == 0.0, "{} cached vs recomputed: {c:?}", ty.name());
        let want = bits(&all_logits(&model.with_isa(Isa::scalar()), &prompts[2].ids));
        for isa in Isa::available() {
            let got = bits(&all_logits(&model_as(ty).with_isa(isa), &prompts[2].ids));
            assert!(got == want, "{} on {}: the scalar path's bits", ty.name(), isa.name());
        }
    }
}

#[test]
fn kv_types_take_llama_cpp_s_bytes_per_position() {
    // DistilGPT-2's shape: 6 layers, 12 heads of 64. ggml's row sizes: f16 2 bytes a value,
    // q8_0 34 bytes a block of 32.
    let cfg = kvgpt_core::config::Config { n_layer: 6, n_head: 12, n_embd: 768, ..load_fixture().model.config };
    let per = |ty| KvCache::bytes_per_position_as(&cfg, ty);
    assert_eq!([KvType::F32, KvType::F16, KvType::Bf16, KvType::Q8_0].map(per), [36_864, 18_432, 18_432, 9_792]);
    assert!(per(KvType::F32) as f64 / per(KvType::Q8_0) as f64 >= 3.5, "positions per MB ≥ 3.5× f32's");
}

#[test]
fn score_reports_what_each_kv_type_costs_against_f32() {
    let (reference, m) = (Reference::load(), model());
    let text = &reference.prompts().into_iter().max_by_key(|p| p.ids.len()).unwrap().text;
    let (out, _) = ok(&kvgpt_within(&["score", "--model", &m, "--json", text], &[], ""));
    let f32_run: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(f32_run["kv_dtype"], "f32");
    assert!(f32_run.get("kl_mean").is_none(), "f32 K/V compares with nothing");
    for (ty, max_kl, min_agree) in [("f16", 1e-5, 1.0), ("bf16", 1e-3, 0.98), ("q8_0", 1e-3, 0.98)] {
        let (out, _) = ok(&kvgpt_within(&["score", "--model", &m, "--json", "--kv-dtype", ty, text], &[], ""));
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        let f = |k: &str| j[k].as_f64().unwrap_or_else(|| panic!("{ty}: {k} in {j}"));
        assert_eq!(j["kv_dtype"], ty);
        assert!(f("kl_mean") > 0.0 && f("kl_mean") <= max_kl && f("kl_max") >= f("kl_mean"), "{ty}: {j}");
        assert!(f("top1_agreement") >= min_agree, "{ty}: {j}");
        // The f32-K/V perplexity it compares with is plain `score`'s, and the change is theirs.
        assert!((f("perplexity_f32_kv") - f32_run["perplexity"].as_f64().unwrap()).abs() < 1e-9 * f("perplexity"));
        assert!((f("perplexity_change") - (f("perplexity") / f("perplexity_f32_kv") - 1.0)).abs() < 1e-12);
        assert!((f("perplexity") - j["mean_loss"].as_f64().unwrap().exp()).abs() < 1e-9 * f("perplexity"));
    }
    let (text_out, _) = ok(&kvgpt_within(&["score", "--model", &m, "--kv-dtype", "q8_0", "Hello there you"], &[], ""));
    assert!(text_out.contains("K/V as q8_0 against f32 K/V: KL mean"), "{text_out}");
}

/// The server on K/V held as q8_0 in blocks of 4: it says so (`/server_info`, the block gauge),
/// and its answers are `generate --kv-dtype q8_0`'s, greedy, alone or as the `n` choices of one
/// prompt sharing its blocks.
#[test]
fn serve_holds_k_v_as_asked_and_answers_as_generate_does() {
    let m = model();
    let args = ["--kv-dtype", "q8_0", "--kv-block-size", "4"];
    let (out, _) = ok(&kvgpt_within(
        &["generate", "The cat sat on", "--model", &m, "-n", "12", "--ignore-eos", "--json", args[0], args[1]],
        &[],
        "",
    ));
    let want: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = common::server::Server::start(&args);
    let (_, info) = s.get("/server_info");
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!((info["kv_cache_dtype"].as_str(), info["kv_block_size"].as_u64()), (Some("q8_0"), Some(4)), "{info}");
    let (_, metrics) = s.get("/metrics");
    assert!(metrics.contains("vllm:cache_config_info{block_size=\"4\""), "{metrics}");
    let body =
        serde_json::json!({"prompt": "The cat sat on", "max_tokens": 12, "temperature": 0, "ignore_eos": true, "n": 3});
    let (code, got) = s.post("/v1/completions", &body);
    assert_eq!(code, 200, "{got}");
    for c in got["choices"].as_array().unwrap() {
        assert_eq!(c["text"], want["text"], "{got}");
    }
}
