//! Where each element of a packed matrix lives: the panel width, the int8 blocks, and the one
//! spelling of each layout's index. Imports nothing.

/// Columns per panel.
pub const NR: usize = 16;
/// Columns sharing one int8 scale (per row): two panels.
pub const Q8_BLOCK: usize = 32;
/// Reduction rows sharing one W8A8 scale: per output column for the weights, per token for the
/// activations (llama.cpp's Q8_0 block).
pub const W8_BLOCK: usize = 32;

/// Where panel `p`'s row `i` starts in a `K`-row matrix's storage: panel-major, then row, then
/// the panel's 16 lanes. The one place the layout is spelled.
#[inline(always)]
pub(crate) fn panel_index(k: usize, p: usize, i: usize) -> usize {
    (p * k + i) * NR
}

/// Which int8 scale covers row `i`, column `c` (one per row and [`Q8_BLOCK`] columns).
#[inline(always)]
pub(crate) fn scale_index(k: usize, c: usize, i: usize) -> usize {
    (c / Q8_BLOCK) * k + i
}

/// Where W8A8 element (row `i`, lane `j`) of panel `p` lives, in a matrix padded to `kp` rows:
/// panel-major, then groups of four rows, then the lane, then the row within its group, so that
/// one group of a panel is 64 bytes holding each column's four consecutive weights together (what
/// one 32-bit lane of an integer dot-product instruction takes).
#[inline(always)]
pub(crate) fn w8_index(kp: usize, p: usize, i: usize, j: usize) -> usize {
    (p * kp + (i & !3)) * NR + 4 * j + (i & 3)
}

/// Where 4-bit element (row `i`, lane `j`) of panel `p` lives, in a matrix padded to `kp` rows:
/// the byte (laid out as [`w8_index`] lays out rows `i & !7 ..` of a half-height panel) and the
/// nibble's shift. Rows in groups of eight: one 64-byte line of a panel holds each column's rows
/// `8g..8g+4` in its low nibbles and `8g+4..8g+8` in its high ones, so one load and two masks
/// give the operands of two integer dot products.
#[inline(always)]
pub(crate) fn w4_index(kp: usize, p: usize, i: usize, j: usize) -> (usize, u32) {
    ((p * kp / 2 + (i & !7) / 2) * NR + 4 * j + (i & 3), if i & 4 == 0 { 0 } else { 4 })
}

/// A stored W8A8 weight's int8 value.
#[inline(always)]
pub(crate) fn w8_value(u: u8) -> i8 {
    (u ^ 0x80) as i8
}

/// Where the [`NR`] scales (and minimums) of panel `p`'s sub-block `s` start, for sub-blocks of
/// `sub` rows (32, or 16 for Q6_K).
#[inline(always)]
pub(crate) fn sub_block_index(kp: usize, sub: usize, p: usize, s: usize) -> usize {
    (p * (kp / sub) + s) * NR
}
