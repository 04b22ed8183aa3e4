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

/// A stored W8A8 weight's int8 value.
#[inline(always)]
pub(crate) fn w8_value(u: u8) -> i8 {
    (u ^ 0x80) as i8
}

/// Where the [`NR`] scales of panel `p`'s block `b` start.
#[inline(always)]
pub(crate) fn w8_block_index(kp: usize, p: usize, b: usize) -> usize {
    (p * (kp / W8_BLOCK) + b) * NR
}
