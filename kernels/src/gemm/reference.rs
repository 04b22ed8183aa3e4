//! The reference matmul's kernel: columns of `out[T, N] = inp[T, K] @ w[K, N] + bias` in register
//! tiles, every tile reducing over `i = 0..K` in order.

use crate::dispatch::kernels;

kernels! {
    // # Safety: `out` must point to `t * n` writable floats, and no other thread may touch
    // columns `c0..c1`.
    [unsafe] fn matmul_cols(out: *mut f32, inp: &[f32], w: &[f32], bias: &[f32], t: usize, k: usize, n: usize, c0: usize, c1: usize)
        = matmul_cols_body, matmul_cols_body;
}

/// Columns `c0..c1` of `out[T, N] = inp[T, K] @ w[K, N] + bias`, in register tiles of
/// `MR` rows × `NR` columns; every tile reduces over `i = 0..K` in order.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // llm.c style: outputs first, dimensions last
unsafe fn matmul_cols_body(
    out: *mut f32,
    inp: &[f32],
    w: &[f32],
    bias: &[f32],
    t: usize,
    k: usize,
    n: usize,
    c0: usize,
    c1: usize,
) {
    let mut r = 0;
    while r + 4 <= t {
        matmul_rows::<4>(out, inp, w, bias, r, k, n, c0, c1);
        r += 4;
    }
    while r < t {
        matmul_rows::<1>(out, inp, w, bias, r, k, n, c0, c1);
        r += 1;
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)] // llm.c style: outputs first, dimensions last
unsafe fn matmul_rows<const MR: usize>(
    out: *mut f32,
    inp: &[f32],
    w: &[f32],
    bias: &[f32],
    r0: usize,
    k: usize,
    n: usize,
    c0: usize,
    c1: usize,
) {
    let mut c = c0;
    if MR == 1 {
        while c + 64 <= c1 {
            matmul_tile::<MR, 64>(out, inp, w, bias, r0, k, n, c);
            c += 64;
        }
    }
    while c + 16 <= c1 {
        matmul_tile::<MR, 16>(out, inp, w, bias, r0, k, n, c);
        c += 16;
    }
    while c < c1 {
        matmul_tile::<MR, 1>(out, inp, w, bias, r0, k, n, c);
        c += 1;
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)] // llm.c style: outputs first, dimensions last
unsafe fn matmul_tile<const MR: usize, const NR: usize>(
    out: *mut f32,
    inp: &[f32],
    w: &[f32],
    bias: &[f32],
    r0: usize,
    k: usize,
    n: usize,
    c: usize,
) {
    let mut acc = [[0.0f32; NR]; MR];
    for i in 0..k {
        let wrow: &[f32; NR] = w[i * n + c..i * n + c + NR].try_into().unwrap();
        for (r, accr) in acc.iter_mut().enumerate() {
            let x = inp[(r0 + r) * k + i];
            for j in 0..NR {
                accr[j] = x.mul_add(wrow[j], accr[j]);
            }
        }
    }
    for (r, accr) in acc.iter().enumerate() {
        for j in 0..NR {
            // SAFETY (caller): row r0+r < t and column c+j < c1 <= n lie inside `out`.
            *out.add((r0 + r) * n + c + j) = accr[j] + bias[c + j];
        }
    }
}
