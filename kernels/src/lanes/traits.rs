//! The traits every ISA's registers implement.

/// One panel row of 16 f32 lanes held in registers, as one ISA spells it (two AVX2 registers, one
/// AVX-512 register), with the few operations the tiles need. The tile bodies (`gemm`'s `Simd`) are
/// written once over it; each implementation owns its tile shape for the few-rows path.
pub(crate) trait Lanes: Copy {
    /// Rows per pass of the few-rows path (2 or 8); three panels per pass either way.
    const FEW_MR: usize;
    /// Registers one panel row takes (AVX2 2 of its 16, AVX-512 1 of its 32).
    const REGISTERS: usize;
    /// Broadcast the R activations first, then stream the panels (fewer registers for the
    /// weights: AVX2's 16), or load the G panel rows first (AVX-512's 32 hold them).
    const BROADCAST_FIRST: bool;
    /// Prefetch the weight streams ahead in the whole-reduction wide passes (decode, and the
    /// few-rows path's single passes); chunked passes always prefetch the next chunk.
    const PREFETCH: bool;
    /// Up to how many rows the few-rows path runs (see `gemm`'s `TileKernel::FEW_ROWS`).
    const FEW_ROWS: usize;
    /// Keys per step of the attention scores (4, or 16 where a key's row is one register and 16
    /// of them reduce together, then 8 and 4).
    const KEYS: usize = 4;
    /// The same ISA's integer dot products (W8A8).
    type Int: IntLanes<F = Self>;
    unsafe fn zero() -> Self;
    unsafe fn splat(a: f32) -> Self;
    /// `a * b + acc`, fused, lane by lane.
    unsafe fn fma(a: Self, b: Self, acc: Self) -> Self;
    unsafe fn add(a: Self, b: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    // Panel rows of each storage type at element `base`: 16 values read there; callers guarantee
    // `base + 16 <= d.len()` (panel and row indices are always inside the matrix), checked in debug
    // builds. AVX2 and AVX-512 use the same conversions, so the same values.
    unsafe fn f32_row(d: &[f32], base: usize) -> Self;
    unsafe fn f16_row(d: &[u16], base: usize) -> Self;
    unsafe fn bf16_row(d: &[u16], base: usize) -> Self;
    unsafe fn q8_row(d: &[i8], base: usize, scale: f32) -> Self;
}

/// Integer dot products over one panel row of 16 i32 lanes, as one ISA spells them.
pub(crate) trait IntLanes: Copy {
    /// The f32 lanes the block sums are combined in.
    type F: Lanes;
    /// Four activation bytes, broadcast and prepared for [`IntLanes::dot4`].
    type A: Copy;
    /// One group of a panel: 16 columns × 4 rows of int8 weights (64 bytes, offset by 128).
    type W: Copy;
    /// A register tile of 4 rows × 3 panels at prefill and 4 panels at decode (AVX-512's 32
    /// registers), or 2 rows × 1 panel and 2 panels (AVX2's 16).
    const WIDE: bool;
    unsafe fn prep(a4: i32) -> Self::A;
    /// Whether the products take the activations' absolute values ([`IntLanes::prep_abs`]'s
    /// `abs4`), kept beside them when they are quantized.
    const TAKES_ABS: bool = false;
    /// As [`IntLanes::prep`], given also the four bytes' absolute values (`abs4`) where
    /// [`IntLanes::TAKES_ABS`] (0 otherwise).
    #[inline(always)]
    unsafe fn prep_abs(a4: i32, _abs4: i32) -> Self::A {
        Self::prep(a4)
    }
    unsafe fn load_w(p: *const u8) -> Self::W;
    /// One 64-byte line of a 4-bit panel: the low nibbles (rows `8g..8g+4`) and the high ones
    /// (`8g+4..8g+8`), each as unsigned bytes 0..15 for [`IntLanes::dot4u`].
    unsafe fn load_w4(p: *const u8) -> (Self::W, Self::W);
    /// The block's starting sums: 0, or `-corr` (the activation block's `-128 Σ qa`) where the
    /// dot products see the weights' offset.
    unsafe fn start(corr: i32) -> Self;
    /// The starting sums `-corr` for [`IntLanes::dot4u`]'s unsigned weights stored `corr / Σ qa`
    /// above their values (every ISA sees that offset); [`IntLanes::start`]'s where that sees
    /// the offset too.
    #[inline(always)]
    unsafe fn start_u(corr: i32) -> Self {
        Self::start(corr)
    }
    /// `acc[l] += Σ_{m<4} a[m] · w[4l + m]`, exactly.
    unsafe fn dot4(acc: Self, a: Self::A, w: Self::W) -> Self;
    /// As [`IntLanes::dot4`] for weights that are unsigned bytes below 128 (nibbles); `dot4`
    /// itself where that takes unsigned weights as they are.
    #[inline(always)]
    unsafe fn dot4u(acc: Self, a: Self::A, w: Self::W) -> Self {
        Self::dot4(acc, a, w)
    }
    /// The block sums (exact integers) as f32.
    unsafe fn to_f32(acc: Self) -> Self::F;
}
