//! kvgpt as a library: load a model, generate greedily with the KV cache, then run one forward
//! pass with a tap that records layer 0's attention weights, and print where the last token looks.
//!
//!     cargo run --release --example library -- tests/fixtures/tiny-gpt2 "The cat sat on"

use kvgpt_core::{generate, GenerateOptions, KvCache, Point, Recorder, Sampling, Scratch, Step};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let folder = args.next().unwrap_or_else(|| "tests/fixtures/tiny-gpt2".into());
    let prompt = args.next().unwrap_or_else(|| "The cat sat on".into());

    // A local folder (config.json, model.safetensors, tokenizer.json); `kvgpt_core::Locate` also
    // resolves Hugging Face Hub ids.
    let loaded = kvgpt_core::load(&kvgpt_core::hub::local_folder(std::path::Path::new(&folder))?)?;
    let (model, tok) = (&loaded.model, &loaded.tokenizer);
    let ids = tok.encode(&prompt)?;

    // Generation: prefill once, then one cached decode step per token.
    let opts = GenerateOptions { max_new_tokens: 8, sampling: Sampling::GREEDY, ..GenerateOptions::default() };
    let g = generate(model, &ids, &opts, &mut |_id, _logits| Ok(Step::Go))?;
    println!("{prompt}{}", tok.decode(&g.generated_ids));

    // Inspection: the same forward pass with a tap that records what it asks for.
    let mut cache = KvCache::new(&model.config);
    let mut scratch = Scratch::new(&model.config, ids.len());
    let mut logits = vec![0.0; model.config.vocab_size]; // the last row's logits
    let mut tap = Recorder::only(|p| p == Point::AttnProbs(0));
    model.forward(&ids, &mut cache, &mut scratch, &mut tap, &mut logits)?;
    let probs = tap.last(Point::AttnProbs(0)).expect("recorded");
    let (nh, t, kv) = (probs.shape[0], probs.shape[1], probs.shape[2]); // [NH, T, P+T]
    println!("layer 0 attention of the last token {:?} ({nh} heads):", tok.token_text(ids[t - 1]));
    for h in 0..nh {
        let row = &probs.data[(h * t + t - 1) * kv..][..kv];
        let cells: Vec<String> =
            row.iter().zip(&ids).map(|(p, &id)| format!("{:?} {p:.2}", tok.token_text(id))).collect();
        println!("  head {h}: {}", cells.join(", "));
    }
    println!("the KV cache now holds {} positions, {} bytes", cache.len(), cache.bytes());
    Ok(())
}
