//! `PackedMatrix::converted`: a matrix held as f32, converted to another type, holds the same bytes
//! as packing the original values as that type (what loading the file as that type gives), on
//! awkward shapes and on blocks of zeros, NaNs and infinities. `--draft self:w8a8` builds its copy
//! this way.

use kvgpt_kernels::*;

mod common;
use common::Gen;

/// Every byte `m` holds, as a fingerprint reads them.
fn held_bytes(m: &PackedMatrix) -> Vec<u8> {
    let mut all = Vec::new();
    m.each_byte_run(&mut |run| all.extend_from_slice(run));
    all
}

#[test]
fn an_f32_matrix_converted_holds_what_packing_its_values_as_the_type_holds() {
    let types =
        [WeightType::W8A8, WeightType::Q8, WeightType::F16, WeightType::Bf16, WeightType::Q8_0, WeightType::Q4_0];
    for &(k, n) in &[(1usize, 1usize), (31, 17), (32, 16), (33, 47), (64, 48), (100, 70), (257, 131)] {
        let mut w = Gen((k * 1000 + n) as u64).vec(k * n);
        // Column 3's first block all zero (a zero scale); column 5 with a NaN, an infinity and -0, column
        // 6 with -infinity.
        (0..k.min(32)).for_each(|i| w[i * n + 3.min(n - 1)] = 0.0);
        if n > 5 && k > 2 {
            (w[5], w[n + 5], w[2 * n + 5]) = (f32::NAN, f32::INFINITY, -0.0);
            w[6] = f32::NEG_INFINITY;
        }
        let f32s = PackedMatrix::pack(&w, k, n, WeightType::F32);
        for ty in types {
            if ty.ggml_block().is_some_and(|(e, _)| k % e != 0) {
                continue; // llama.cpp's block types need whole blocks
            }
            let want = PackedMatrix::pack(&w, k, n, ty);
            let got = f32s.converted(ty);
            assert!(held_bytes(&got) == held_bytes(&want), "{} k={k} n={n}", ty.name());
        }
    }
}
