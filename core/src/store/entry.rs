//! A stored block, as bytes: a header that says what it is, its positions' tokens, its rows as
//! held, and a checksum over everything before it.
//!
//! ```text
//! "KVGPTBLK" · version u32 · K/V fingerprint [32] · block size u32 · K/V type u8 · L u32 · NH u32
//! · HS u32 · first position u32 · n u32 · parent key [32] · tokens [n] u32 · rows [L·2·NH][n][W]
//! f32 words · BLAKE3 of all the above [32]                                   (little-endian)
//! ```

use super::{BlockKey, Keying};
use crate::kv_cache::{Block, BlockShape};
use kvgpt_kernels::KvType;

const MAGIC: &[u8; 8] = b"KVGPTBLK";
/// Bumped whenever the layout above changes: a store of another version is refused by its header.
/// It is part of every key too ([`super::Keying::key`]): another version's blocks are not found.
pub(super) const VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 32 + 4 + 1 + 4 * 3 + 4 + 4 + 32;

/// The longest stored form of a block of `shape` (all `block` positions).
pub(super) fn max_len(shape: BlockShape, block: usize) -> usize {
    HEADER + 4 * (block + shape.n_layer * 2 * shape.n_head * block * shape.row_words()) + 32
}

/// A stored block read back and checked: positions `first..first + tokens.len()`.
#[derive(Debug)]
pub struct Entry {
    pub key: BlockKey,
    pub first: usize,
    pub parent: BlockKey,
    pub tokens: Vec<u32>,
    /// The stored bytes, as read (the rows are taken from them as they are: no copy).
    bytes: Vec<u8>,
    rows_at: usize,
}

impl Entry {
    /// Rows as held, `[L, 2, NH][n][W]` little-endian words (`KvCache::append_held`).
    pub fn rows(&self) -> &[u8] {
        &self.bytes[self.rows_at..self.bytes.len() - 32]
    }

    /// The checksum the bytes carry (checked): BLAKE3 of everything before it, so equal sums
    /// are equal bytes.
    pub fn sum(&self) -> [u8; 32] {
        self.bytes[self.bytes.len() - 32..].try_into().expect("32 bytes")
    }

    /// How many bytes were read.
    pub fn len_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Whether `block` holds exactly this entry's rows, bit for bit (a recomputed block: the
    /// proof of a stored one).
    pub fn same_rows(&self, block: &Block) -> bool {
        let (rows, stored) = (block.held_rows(self.tokens.len()), self.rows());
        rows.len() * 4 == stored.len() && rows.iter().zip(stored.chunks_exact(4)).all(|(a, b)| a.to_le_bytes() == b)
    }
}

/// Why stored bytes were not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not a block of this format, or of another version of it.
    Header,
    /// Shorter or longer than its header says.
    Truncated,
    /// The bytes are not the ones the checksum was made over.
    Checksum,
    /// Another model, K/V type, block size or shape, or not the key it was asked for.
    Mismatch,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Header => "header",
            Refusal::Truncated => "truncated",
            Refusal::Checksum => "checksum",
            Refusal::Mismatch => "mismatch",
        }
    }
}

fn type_byte(ty: KvType) -> u8 {
    KvType::ALL.iter().position(|&t| t == ty).expect("every type is listed") as u8
}

/// The stored form of `block`'s first `tokens.len()` positions, which start at `first` after the
/// block keyed `parent`.
pub(super) fn encode(keying: &Keying, parent: BlockKey, first: usize, tokens: &[u32], block: &Block) -> Vec<u8> {
    let s = block.shape();
    let words = block.held_rows(tokens.len());
    let mut out = Vec::with_capacity(HEADER + 4 * (tokens.len() + words.len()) + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&keying.kv.0);
    out.extend_from_slice(&(keying.block as u32).to_le_bytes());
    out.push(type_byte(s.ty));
    for x in [s.n_layer, s.n_head, s.head_dim, first, tokens.len()] {
        out.extend_from_slice(&(x as u32).to_le_bytes());
    }
    out.extend_from_slice(&parent.0);
    tokens.iter().for_each(|t| out.extend_from_slice(&t.to_le_bytes()));
    words.iter().for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    out
}

/// Whether `bytes` are a block of this format and version under `keying`, of `shape` (another
/// model's, type's or block size's are not; nor is anything else).
pub(super) fn is_of(bytes: &[u8], keying: &Keying, shape: BlockShape) -> bool {
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes")) as usize;
    bytes.len() >= HEADER
        && &bytes[..8] == MAGIC
        && u32_at(8) == VERSION as usize
        && bytes[12..44] == keying.kv.0
        && u32_at(44) == keying.block
        && bytes[48] == type_byte(shape.ty)
}

/// Reads `bytes` back as the block keyed `key`, for blocks of `shape` under `keying`: checks the
/// header, the length, the checksum, and that the key made from what it holds is `key`.
pub(super) fn decode(bytes: Vec<u8>, keying: &Keying, shape: BlockShape, key: BlockKey) -> Result<Entry, Refusal> {
    if bytes.len() < HEADER + 32 || &bytes[..8] != MAGIC {
        return Err(if bytes.len() < HEADER + 32 && bytes.starts_with(MAGIC) {
            Refusal::Truncated
        } else {
            Refusal::Header
        });
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes")) as usize;
    if u32_at(8) != VERSION as usize {
        return Err(Refusal::Header);
    }
    let (n, first) = (u32_at(HEADER - 36), u32_at(HEADER - 40));
    let words = shape.n_layer * 2 * shape.n_head * n * shape.row_words();
    if bytes.len() != HEADER + 4 * (n + words) + 32 {
        return Err(Refusal::Truncated);
    }
    let (body, sum) = bytes.split_at(bytes.len() - 32);
    if blake3::hash(body).as_bytes() != sum {
        return Err(Refusal::Checksum);
    }
    let dims = [shape.n_layer, shape.n_head, shape.head_dim];
    let same = bytes[12..44] == keying.kv.0
        && u32_at(44) == keying.block
        && bytes[48] == type_byte(shape.ty)
        && (0..3).all(|i| u32_at(49 + 4 * i) == dims[i])
        && n >= 1
        && n <= keying.block
        && first.is_multiple_of(keying.block);
    if !same {
        return Err(Refusal::Mismatch);
    }
    let parent = BlockKey(bytes[HEADER - 32..HEADER].try_into().expect("32 bytes"));
    let word = |at: usize| [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]];
    let tokens: Vec<u32> = (0..n).map(|i| u32::from_le_bytes(word(HEADER + 4 * i))).collect();
    if keying.key(parent, first, &tokens) != key {
        return Err(Refusal::Mismatch);
    }
    Ok(Entry { key, first, parent, tokens, bytes, rows_at: HEADER + 4 * n })
}
