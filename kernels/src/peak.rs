//! The FMA peak of one core, measured: independent chains of fused multiply-adds on registers,
//! enough of them to cover the instruction's latency on every port, nothing read from memory.
//! The roof a matmul's few rows are held against (`kvgpt bench --roofline`).

use crate::dispatch::kernels;
use crate::isa::{Isa, Kind};
use crate::lanes::{IntLanes, Lanes};

/// Chains per probe: 12 panel rows, 12 AVX-512 or 24 AVX2 registers' worth. AVX2's sixteen
/// registers hold 6 of them ([`fma_chains`]), which is still twice the latency × ports of the
/// CPUs measured (4 cycles × 2 FMA pipes = 8 registers).
const CHAINS: usize = 12;

kernels! {
    [unsafe] fn fma_chains(rounds: usize, x: f32) -> f32 = chains_lanes::<L>, chains_scalar;
    [unsafe] fn dot_chains(rounds: usize) -> f32 = dots_lanes::<L>, dots_scalar;
    [] fn read_streams(a: &[f32]) -> f32 = streams_lanes::<L>, streams_scalar;
}

/// Independent sums of `a` in panel rows, eight at a time: as many loads in flight as the core
/// allows, so that memory, not an addition's latency, is what is timed. (The order of the sums
/// is this probe's own; nothing else reads it.)
#[inline(always)]
fn streams_lanes<L: Lanes>(a: &[f32]) -> f32 {
    const W: usize = 16 * 8;
    // SAFETY: every load reads 16 floats at `i + 16 j` with `i + W <= a.len()`.
    unsafe {
        let mut acc = [L::zero(); 8];
        let mut i = 0;
        while i + W <= a.len() {
            for (j, c) in acc.iter_mut().enumerate() {
                *c = L::add(*c, L::load(a.as_ptr().add(i + 16 * j)));
            }
            i += W;
        }
        let mut out = [0.0f32; 16];
        let total = acc.iter().fold(L::zero(), |t, c| L::add(t, *c));
        total.store(out.as_mut_ptr());
        out.iter().sum::<f32>() + a[i..].iter().sum::<f32>()
    }
}

fn streams_scalar(a: &[f32]) -> f32 {
    a.chunks(8)
        .fold([0.0f32; 8], |mut acc, c| {
            acc.iter_mut().zip(c).for_each(|(s, x)| *s += x);
            acc
        })
        .iter()
        .sum()
}

/// Reads all of `a` as fast as the core can (a read-bandwidth probe, or a sweep that evicts the
/// caches); returns a sum of it so that nothing is optimized away.
pub fn read_all(isa: Isa, a: &[f32]) -> f32 {
    read_streams(isa, a)
}

/// `rounds` rounds of `CHAINS` FMAs on 16 lanes each (6 chains on AVX2: see [`CHAINS`]).
#[inline(always)]
unsafe fn chains_lanes<L: Lanes>(rounds: usize, x: f32) -> f32 {
    let chains = CHAINS / L::REGISTERS;
    let (a, b) = (L::splat(x), L::splat(1.0 - x));
    let mut acc = [L::zero(); CHAINS];
    for _ in 0..rounds {
        for c in acc.iter_mut().take(chains) {
            *c = L::fma(a, *c, b);
        }
    }
    let mut out = [0.0f32; 16];
    let mut total = L::zero();
    for c in acc.iter().take(chains) {
        total = L::add(total, *c);
    }
    total.store(out.as_mut_ptr());
    out.iter().sum()
}

/// `rounds` rounds of [`CHAINS`] integer dot products (each 16 lanes × 4 byte products), on
/// registers: the integer types' compute roof (`vpdpbusd`, or AVX2's three-instruction spelling).
#[inline(always)]
unsafe fn dots_lanes<L: Lanes>(rounds: usize) -> f32 {
    let chains = CHAINS / L::REGISTERS;
    let bytes = [1u8; 64 * CHAINS];
    let a = L::Int::prep(0x0101_0101);
    let mut acc = [L::Int::start(0); CHAINS];
    for _ in 0..rounds {
        // Each chain's weights loaded each round from their own line, as the kernels load
        // weights: the optimizer can neither share one product among the chains nor take it out
        // of the loop (AVX2 spells a product in three instructions, two of them on the operands).
        let w = std::hint::black_box(bytes.as_ptr());
        for (c, acc) in acc.iter_mut().take(chains).enumerate() {
            *acc = L::Int::dot4(*acc, a, L::Int::load_w(w.add(64 * c)));
        }
    }
    let mut out = [0.0f32; 16];
    let total = acc.iter().take(chains).fold(L::zero(), |t, c| L::add(t, L::Int::to_f32(*c)));
    total.store(out.as_mut_ptr());
    out.iter().sum()
}

/// Four byte products a chain a round, as one lane of a SIMD dot product does.
unsafe fn dots_scalar(rounds: usize) -> f32 {
    let mut acc = [0i32; CHAINS];
    let w = [1i32; 4];
    for _ in 0..rounds {
        let a = std::hint::black_box(1i32);
        for c in acc.iter_mut() {
            *c = w.iter().fold(*c, |s, &x| s.wrapping_add(a.wrapping_mul(x)));
        }
    }
    acc.iter().map(|&c| c as f32).sum()
}

unsafe fn chains_scalar(rounds: usize, x: f32) -> f32 {
    let mut acc = [0.0f32; CHAINS];
    for _ in 0..rounds {
        for c in acc.iter_mut() {
            *c = x.mul_add(*c, 1.0 - x);
        }
    }
    acc.iter().sum()
}

/// Runs `rounds` rounds of independent integer dot-product chains on this thread; returns their
/// sum so that nothing is optimized away.
pub fn dot_peak(isa: Isa, rounds: usize) -> f32 {
    // SAFETY: the body reads and writes only its own registers and stack arrays.
    unsafe { dot_chains(isa, rounds) }
}

/// Integer operations one call of [`dot_peak`] does per round (a byte product and its addition
/// count two): 8 per lane and chain.
pub fn dot_ops_per_round(isa: Isa) -> usize {
    4 * fma_flops_per_round(isa)
}

/// Single-precision FLOPs one call of [`fma_peak`] does per round (an FMA counts two).
pub fn fma_flops_per_round(isa: Isa) -> usize {
    match isa.0 {
        Kind::Scalar => 2 * CHAINS,
        #[cfg(target_arch = "x86_64")]
        Kind::Avx2Fma => 2 * 16 * CHAINS / 2,
        #[cfg(target_arch = "x86_64")]
        Kind::Avx512 => 2 * 16 * CHAINS,
    }
}

/// Runs `rounds` rounds of independent FMA chains on this thread (x in (0, 1) keeps the values
/// bounded); returns their sum so that nothing is optimized away.
pub fn fma_peak(isa: Isa, rounds: usize, x: f32) -> f32 {
    // SAFETY: the body reads and writes only its own registers and stack arrays.
    unsafe { fma_chains(isa, rounds, x) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ISA's probes against the scalar ones: the reads sum what they read (integers, so
    /// exactly, in any order), on lengths no panel width divides; the chains reach the value
    /// their recurrence gives.
    #[test]
    fn probes_compute_what_the_scalar_ones_do() {
        for isa in Isa::available() {
            for len in [0, 1, 15, 16, 127, 128, 129, 1000, 4099] {
                let a: Vec<f32> = (0..len).map(|i| (i % 7) as f32).collect();
                assert_eq!(read_all(isa, &a), a.iter().sum::<f32>(), "{} len {len}", isa.name());
            }
            let rounds = 1000;
            let per = (fma_flops_per_round(isa) / 2) as f32; // chains × lanes
            let c = (0..rounds).fold(0.0f32, |c, _| 0.25f32.mul_add(c, 0.75));
            let got = fma_peak(isa, rounds, 0.25) / per;
            assert!((got - c).abs() < 1e-5, "{}: {got} against {c}", isa.name());
            // Four products of 1 a round, or 1 · (1 − 128) four times where the ISA's products
            // see the weights' offset of 128 (AVX2's spelling; its callers start the sums at 0).
            let dots = dot_peak(isa, rounds) / (dot_ops_per_round(isa) / 8) as f32 / rounds as f32;
            assert!(dots == 4.0 || dots == -508.0, "{}: {dots}", isa.name());
        }
    }
}
