//! What `kvgpt info` says of a GGUF file, as llama.cpp's loader prints it: the version, the
//! architecture, how many tensors of each type, the metadata keys that matter, the file's size.

use super::{describe, Gguf, Value};
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct GgufFacts {
    pub version: u32,
    pub architecture: Option<String>,
    pub file_bytes: u64,
    pub tensors: usize,
    /// `(type, count)`, the most common first (ties by name).
    pub tensor_types: Vec<(&'static str, usize)>,
    pub metadata_keys: usize,
    /// The keys that describe the model and its tokenizer, with their values as text (a list as
    /// its length).
    pub metadata: Vec<(String, String)>,
    /// The type most matrices are stored as (`Gguf::main_type`): what the file is held as
    /// unless `--dtype` says otherwise.
    #[serde(skip)]
    pub main_type: Option<kvgpt_kernels::WeightType>,
}

/// `general.file_type` with llama.cpp's name for it (its `llama_ftype`).
fn file_type(t: i128) -> String {
    let name = match t {
        0 => "ALL_F32",
        1 => "MOSTLY_F16",
        2 => "MOSTLY_Q4_0",
        3 => "MOSTLY_Q4_1",
        7 => "MOSTLY_Q8_0",
        8 => "MOSTLY_Q5_0",
        9 => "MOSTLY_Q5_1",
        10 => "MOSTLY_Q2_K",
        11 => "MOSTLY_Q3_K_S",
        12 => "MOSTLY_Q3_K_M",
        13 => "MOSTLY_Q3_K_L",
        14 => "MOSTLY_Q4_K_S",
        15 => "MOSTLY_Q4_K_M",
        16 => "MOSTLY_Q5_K_S",
        17 => "MOSTLY_Q5_K_M",
        18 => "MOSTLY_Q6_K",
        32 => "MOSTLY_BF16",
        _ => return t.to_string(),
    };
    format!("{t} ({name})")
}

impl Gguf {
    pub fn facts(&self) -> GgufFacts {
        let architecture = match self.meta.get("general.architecture") {
            Some(Value::Str(s)) => Some(s.clone()),
            _ => None,
        };
        let arch = architecture.clone().unwrap_or_else(|| "gpt2".into());
        let mut counts = std::collections::BTreeMap::<&'static str, usize>::new();
        for t in self.tensors.values() {
            *counts.entry(t.kind.name()).or_default() += 1;
        }
        let mut tensor_types: Vec<_> = counts.into_iter().collect();
        tensor_types.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let keys = [
            "general.name".to_string(),
            "general.file_type".to_string(),
            format!("{arch}.context_length"),
            format!("{arch}.embedding_length"),
            format!("{arch}.block_count"),
            format!("{arch}.feed_forward_length"),
            format!("{arch}.attention.head_count"),
            format!("{arch}.attention.layer_norm_epsilon"),
            "tokenizer.ggml.model".to_string(),
            "tokenizer.ggml.tokens".to_string(),
            "tokenizer.ggml.merges".to_string(),
            "tokenizer.ggml.bos_token_id".to_string(),
            "tokenizer.ggml.eos_token_id".to_string(),
        ];
        let metadata = keys
            .into_iter()
            .filter_map(|k| {
                let v = self.meta.get(&k)?;
                let text = match v {
                    Value::Str(s) => s.clone(),
                    Value::Array(a) => format!("{} entries", a.len()),
                    Value::Float(x) => (*x as f32).to_string(), // stored as f32
                    Value::Int(t) if k == "general.file_type" => file_type(*t),
                    other => describe(Some(other)),
                };
                Some((k, text))
            })
            .collect();
        GgufFacts {
            version: self.version,
            architecture,
            file_bytes: self.file_bytes,
            tensors: self.tensors.len(),
            tensor_types,
            metadata_keys: self.meta.len(),
            metadata,
            main_type: self.main_type(),
        }
    }
}
