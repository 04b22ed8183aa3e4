//! The storage types' names. Imports nothing; what each type is made of is
//! said where it is held (`ints`, `ggml`).

/// How weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightType {
    F32,
    F16,
    Bf16,
    /// int8 weights with one f32 scale per row and block of [`Q8_BLOCK`](super::Q8_BLOCK) columns (symmetric,
    /// max-abs), widened to f32 and multiplied with f32 activations (weight-only int8).
    Q8,
    /// int8 weights with one f32 scale per output column and block of [`W8_BLOCK`](super::W8_BLOCK) reduction rows,
    /// multiplied with activations quantized to int8 per token and block: exact integer block
    /// sums, combined in f32 in block order (integer dot products: VNNI, AVX2's `pmaddubsw`).
    W8A8,
    /// llama.cpp's block types, held as their blocks say (see `ggml`) and multiplied as W8A8 is.
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
}

impl WeightType {
    /// Every type weights can be converted to at load, in the order the CLI lists them (the
    /// others, Q5_K and Q6_K, are read from GGUF files as they are).
    pub const ALL: [WeightType; 11] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::Bf16,
        WeightType::Q8,
        WeightType::W8A8,
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
        WeightType::Q5_1,
        WeightType::Q4K,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "f32",
            WeightType::F16 => "f16",
            WeightType::Bf16 => "bf16",
            WeightType::Q8 => "q8",
            WeightType::W8A8 => "w8a8",
            WeightType::Q8_0 => "q8_0",
            WeightType::Q4_0 => "q4_0",
            WeightType::Q4_1 => "q4_1",
            WeightType::Q5_0 => "q5_0",
            WeightType::Q5_1 => "q5_1",
            WeightType::Q4K => "q4_k",
            WeightType::Q5K => "q5_k",
            WeightType::Q6K => "q6_k",
        }
    }

    /// Whether the activations are quantized too (integer dot products).
    pub fn is_integer(self) -> bool {
        self.int_shape().is_some()
    }
}
