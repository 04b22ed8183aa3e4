//! Checks against the real distilbert/distilgpt2. They run only where the model is in the local
//! Hugging Face cache (HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub) and print
//! "SKIPPED" otherwise: nothing here is faked.

use kvgpt_core::{KvCache, Locate, NoTap, Point, Recorder, Scratch};

fn real_model() -> Option<kvgpt_core::Loaded> {
    let loc = Locate::from_env(true);
    match loc.resolve(kvgpt_core::hub::DEFAULT_MODEL) {
        Ok(files) => Some(kvgpt_core::load(&files).expect("the cached distilgpt2 loads")),
        Err(e) => {
            println!("SKIPPED: distilbert/distilgpt2 is not in the local HF cache ({e})");
            eprintln!("SKIPPED real-model test: distilbert/distilgpt2 is not in the local HF cache");
            None
        }
    }
}

fn last_logits(m: &kvgpt_core::Model, ids: &[u32], tap: &mut dyn kvgpt_core::Tap) -> Vec<f32> {
    let cfg = &m.config;
    let mut logits = vec![0.0; cfg.vocab_size];
    m.forward(ids, &mut KvCache::new(cfg), &mut Scratch::new(cfg, ids.len()), tap, &mut logits).unwrap();
    logits
}

#[test]
fn distilgpt2_matches_transformers() {
    let Some(l) = real_model() else { return };
    let ids = l.tokenizer.encode("The cat sat on").unwrap();
    assert_eq!(ids, vec![464, 3797, 3332, 319]);
    let row = &l.model.wte.column(464)[..3];
    for (got, want) in row.iter().zip([-0.06264858692884445f64, -0.04490645229816437, 0.0558876097202301]) {
        assert!((*got as f64 - want).abs() < 1e-7, "wte[464]: {got} vs {want}");
    }
    let mut rec = Recorder::only(|p| p == Point::AttnProbs(0));
    let logits = last_logits(&l.model, &ids, &mut rec);
    assert_eq!(kvgpt_core::sampler::argmax(&logits), 262, "greedy next token of 'The cat sat on'");
    let att = rec.last(Point::AttnProbs(0)).unwrap();
    let t = ids.len();
    let on_row = &att.data[3 * t..4 * t]; // head 0, query 3 (" on")
    for (got, want) in on_row.iter().zip([0.4397f32, 0.2247, 0.2872, 0.0484]) {
        assert!((got - want).abs() <= 1e-4, "layer 0 head 0 row of ' on': {on_row:?}");
    }
    let ids = l.tokenizer.encode("One two three four five six seven eight nine ten eleven").unwrap();
    let logits = last_logits(&l.model, &ids, &mut NoTap);
    assert_eq!(kvgpt_core::sampler::argmax(&logits), 14104, "' twelve'");
    assert!((logits[14104] - -48.7065).abs() < 1e-3, "logit of ' twelve': {}", logits[14104]);
}
