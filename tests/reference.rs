//! The engine against Hugging Face transformers on the tiny-gpt2 fixture: every tensor the
//! reference holds, greedy continuations cached and uncached, the loss, and cached ≡ uncached.

mod common;

use common::*;
use kvgpt_core::{generate, GenerateOptions, KvCache, KvPart, Model, NoTap, Point, Recorder, Scratch};

const TOL: f32 = 1e-4;

/// One forward over the prompt with everything recorded; logits for every row.
fn run_all(model: &Model, ids: &[u32]) -> (Recorder, KvCache, Vec<f32>) {
    let cfg = &model.config;
    let mut cache = KvCache::new(cfg);
    let mut scratch = Scratch::new(cfg, ids.len());
    let mut rec = Recorder::all();
    let mut logits = vec![0.0; ids.len() * cfg.vocab_size];
    model.forward(ids, &mut cache, &mut scratch, &mut rec, &mut logits).unwrap();
    (rec, cache, logits)
}

#[test]
fn every_reference_tensor_matches() {
    let loaded = load_fixture();
    let reference = Reference::load();
    let model = &loaded.model;
    let v = model.config.vocab_size;
    for p in reference.prompts() {
        let ids = loaded.tokenizer.encode(&p.text).unwrap();
        assert_eq!(ids, p.ids, "{}: ids", p.key);
        assert_eq!(ids, reference.input_ids(&p.key), "{}: ids", p.key);
        let t = ids.len();
        let (rec, cache, logits) = run_all(model, &ids);
        let got = |point| &rec.last(point).unwrap().data;

        let dlogit = if let Some((shape, want)) = reference.tensor(&format!("{}.logits", p.key)) {
            assert_eq!(shape, vec![t, v]);
            assert_close(&format!("{} logits", p.key), &logits, &want, TOL)
        } else {
            let (_, want) = reference.tensor(&format!("{}.last_logits", p.key)).unwrap();
            assert_close(&format!("{} last logits", p.key), &logits[(t - 1) * v..], &want, TOL)
        };
        println!("{}: T={t:3} max |Δlogit| = {dlogit:.2e}", p.key);

        let want = |name: &str| reference.tensor(&format!("{}.{name}", p.key)).unwrap().1;
        assert_close("hidden.0", got(Point::Embed), &want("hidden.0"), TOL);
        assert_close("hidden.1", got(Point::Block(0)), &want("hidden.1"), TOL);
        assert_close("hidden.2 (ln_f)", got(Point::LnF), &want("hidden.2"), TOL);
        assert_close("pre_lnf", got(Point::Block(1)), &want("pre_lnf"), TOL);
        assert_close("ln1.0", got(Point::Ln1(0)), &want("ln1.0"), TOL);
        assert_close("qkv.0", got(Point::CAttn(0)), &want("qkv.0"), TOL);
        for l in 0..model.config.n_layer {
            assert_eq!(rec.last(Point::AttnProbs(l)).unwrap().shape, vec![4, t, t]);
            assert_close(&format!("attn.{l}"), got(Point::AttnProbs(l)), &want(&format!("attn.{l}")), TOL);
            assert_close(&format!("k.{l}"), &cache.gather(l, KvPart::K), &want(&format!("k.{l}")), TOL);
            assert_close(&format!("v.{l}"), &cache.gather(l, KvPart::V), &want(&format!("v.{l}")), TOL);
        }

        // Top-5 next tokens and their probabilities (softmax over the whole vocabulary).
        let last = &logits[(t - 1) * v..];
        let mut order: Vec<u32> = (0..v as u32).collect();
        order.sort_by(|a, b| last[*b as usize].total_cmp(&last[*a as usize]));
        assert_eq!(&order[..5], &p.top5_ids[..], "{} top-5", p.key);
        let mut probs = last.to_vec();
        kvgpt_kernels::softmax_inplace(model.isa(), &mut probs);
        for (i, &id) in p.top5_ids.iter().enumerate() {
            assert!((probs[id as usize] as f64 - p.top5_probs[i]).abs() < 1e-4, "{} top-5 prob {i}", p.key);
            assert!((last[id as usize] as f64 - p.top5_logits[i]).abs() < 1e-4, "{} top-5 logit {i}", p.key);
        }

        // Loss: mean cross-entropy of ids[1..] predicted from positions 0..T-2.
        if let Some(want_loss) = p.loss {
            let loss = (0..t - 1)
                .map(|i| {
                    let row = &logits[i * v..(i + 1) * v];
                    let m = row.iter().fold(f64::MIN, |a, &x| a.max(x as f64));
                    let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
                    lse - row[ids[i + 1] as usize] as f64
                })
                .sum::<f64>()
                / (t - 1) as f64;
            println!("{}: loss {loss:.6} (reference {want_loss:.6})", p.key);
            assert!((loss - want_loss).abs() < 1e-4, "{} loss {loss} vs {want_loss}", p.key);
        }
    }
}

#[test]
fn greedy_continuations_match_cached_and_uncached() {
    let loaded = load_fixture();
    let reference = Reference::load();
    for p in reference.prompts() {
        for use_cache in [true, false] {
            let opts = GenerateOptions {
                max_new_tokens: p.greedy_ids.len(),
                stop_at_eos: false,
                use_cache,
                ..GenerateOptions::default()
            };
            let g = generate(&loaded.model, &p.ids, &opts, &mut |_, _| Ok(kvgpt_core::Step::Go)).unwrap();
            assert_eq!(g.generated_ids, p.greedy_ids, "{} greedy (cache: {use_cache})", p.key);
            assert_eq!(loaded.tokenizer.decode(&g.generated_ids), p.greedy_text, "{} text", p.key);
        }
    }
}

/// At every step of a 40-token greedy run, the cached logits equal the uncached ones bit for bit.
#[test]
fn cached_and_uncached_logits_are_bit_identical_at_every_step() {
    let loaded = load_fixture();
    let reference = Reference::load();
    let cfg = &loaded.model.config;
    let v = cfg.vocab_size;
    for isa in kvgpt_kernels::Isa::available() {
        let model_isa = Model::load(&loaded.files.config, &loaded.files.weights).unwrap().with_isa(isa);
        for p in reference.prompts().iter().filter(|p| p.ids.len() + 40 <= cfg.n_positions) {
            let mut cached = KvCache::new(cfg);
            let mut uncached = KvCache::new(cfg);
            let mut s1 = Scratch::new(cfg, cfg.n_positions);
            let mut s2 = Scratch::new(cfg, cfg.n_positions);
            let (mut l1, mut l2) = (vec![0.0; v], vec![0.0; v]);
            let mut seq = p.ids.clone();
            let mut max_diff = 0.0f32;
            model_isa.forward(&seq, &mut cached, &mut s1, &mut NoTap, &mut l1).unwrap();
            for step in 0..40 {
                uncached.reset();
                model_isa.forward(&seq, &mut uncached, &mut s2, &mut NoTap, &mut l2).unwrap();
                max_diff = max_diff.max(max_abs_diff(&l1, &l2));
                assert!(
                    l1.iter().zip(&l2).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} step {step} ({}): cached and uncached logits differ",
                    p.key,
                    isa.name()
                );
                let next = kvgpt_core::sampler::argmax(&l1);
                seq.push(next);
                if step + 1 < 40 {
                    model_isa.forward(&[next], &mut cached, &mut s1, &mut NoTap, &mut l1).unwrap();
                }
            }
            println!("{} ({}): 40 steps, cached vs uncached max |Δlogit| = {max_diff}", p.key, isa.name());
        }
    }
}

/// The scalar kernels and the SIMD kernels give the same logits bit for bit on the real model.
#[test]
fn every_kernel_path_gives_the_same_logits() {
    let loaded = load_fixture();
    let reference = Reference::load();
    let p = &reference.prompts()[1];
    let logits = |isa| {
        let m = Model::load(&loaded.files.config, &loaded.files.weights).unwrap().with_isa(isa);
        run_all(&m, &p.ids).2
    };
    let scalar = logits(kvgpt_kernels::Isa::scalar());
    for isa in kvgpt_kernels::Isa::available() {
        let got = logits(isa);
        assert!(got.iter().zip(&scalar).all(|(a, b)| a.to_bits() == b.to_bits()), "{}", isa.name());
    }
}

/// `Model::run` over chunks of 1, 7 and 16 tokens (a small scratch) gives the same logits and
/// the same K/V bits as one forward call, hence the reference's values, including when the last
/// chunk must hold logits for every row.
#[test]
fn chunked_runs_equal_one_call_bit_for_bit() {
    let loaded = load_fixture();
    let reference = Reference::load();
    let model = &loaded.model;
    let cfg = &model.config;
    let v = cfg.vocab_size;
    let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for p in reference.prompts().iter().filter(|p| p.ids.len() > 16) {
        let (_, whole_cache, whole) = run_all(model, &p.ids);
        let t = p.ids.len();
        let want = match reference.tensor(&format!("{}.logits", p.key)) {
            Some((_, w)) => w[(t - 1) * v..].to_vec(),
            None => reference.tensor(&format!("{}.last_logits", p.key)).unwrap().1,
        };
        for chunk in [1, 7, 16] {
            for rows in [1, t] {
                let mut cache = KvCache::new(cfg);
                let mut scratch = Scratch::new(cfg, chunk);
                let mut logits = vec![0.0; rows * v];
                model.run(&p.ids, &mut cache, &mut scratch, &mut logits).unwrap();
                let what = format!("{} chunk {chunk}, {rows} rows", p.key);
                assert_eq!(bits(&logits), bits(&whole[(t - rows) * v..]), "{what}: logits");
                assert_close(&what, &logits[(rows - 1) * v..], &want, TOL);
                for l in 0..cfg.n_layer {
                    for part in [KvPart::K, KvPart::V] {
                        assert_eq!(
                            bits(&cache.gather(l, part)),
                            bits(&whole_cache.gather(l, part)),
                            "{what}: layer {l}"
                        );
                    }
                }
            }
        }
    }
}
