//! Writing a GGUF file (version 3) laid out as gguf-py's `GGUFWriter` lays one out: the header,
//! the metadata in the order given, the tensor entries, then each tensor's data at a multiple of
//! 32 bytes (GGUF's default alignment; no `general.alignment` is written), zero-padded.

use super::gguf_header::{Kind, MAGIC};
use kvgpt_kernels::WeightType;

/// The alignment of the data section and of each tensor in it.
pub const ALIGN: u64 = 32;

/// One metadata value, with the GGUF type it is written as.
pub enum Put {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

/// A tensor's entry: its name, its ggml shape (`dims[0]` varies fastest: a row's length), its
/// type, and where its data starts (from the data section's start) and how many bytes it takes.
pub struct Slot {
    pub name: String,
    pub dims: Vec<usize>,
    pub ty: WeightType,
    pub offset: u64,
    pub bytes: u64,
}

impl Slot {
    /// Bytes of one row (`dims[0]` elements).
    pub fn row_bytes(&self) -> usize {
        (self.bytes / self.rows().max(1) as u64) as usize
    }

    pub fn rows(&self) -> usize {
        self.dims.iter().skip(1).product()
    }
}

/// What a GGUF holds before its tensors' data.
#[derive(Default)]
pub struct Layout {
    meta: Vec<(String, Put)>,
    pub tensors: Vec<Slot>,
    /// The data section's length so far (the last tensor's end, aligned).
    end: u64,
}

impl Layout {
    pub fn meta(&mut self, key: &str, v: Put) {
        self.meta.push((key.to_string(), v));
    }

    /// Adds tensor `name` of ggml shape `dims` stored as `ty`. An error says why `ty` cannot
    /// store it: not a type a GGUF holds, or rows that are not whole blocks.
    pub fn tensor(&mut self, name: &str, dims: &[usize], ty: WeightType) -> Result<(), String> {
        let kind = Kind::storing(ty).ok_or_else(|| format!("a GGUF cannot hold {}", ty.name()))?;
        let row = kind.bytes(dims[0]).ok_or_else(|| match ty.ggml_block() {
            Some((elems, _)) => {
                format!("{} stores rows in blocks of {elems} weights; the rows of `{name}` hold {}", ty.name(), dims[0])
            }
            None => format!("`{name}` is too large"),
        })?;
        let bytes = (row as u64) * dims.iter().skip(1).product::<usize>() as u64;
        self.tensors.push(Slot { name: name.to_string(), dims: dims.to_vec(), ty, offset: self.end, bytes });
        self.end = (self.end + bytes).next_multiple_of(ALIGN);
        Ok(())
    }

    /// The bytes of everything before the data section, padded to [`ALIGN`].
    pub fn header(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.meta.len() as u64).to_le_bytes());
        for (key, v) in &self.meta {
            string(&mut b, key);
            value(&mut b, v);
        }
        for t in &self.tensors {
            string(&mut b, &t.name);
            b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            t.dims.iter().for_each(|d| b.extend_from_slice(&(*d as u64).to_le_bytes()));
            let kind = Kind::storing(t.ty).expect("checked when added");
            b.extend_from_slice(&kind.id().to_le_bytes());
            b.extend_from_slice(&t.offset.to_le_bytes());
        }
        b.resize(b.len() + padding(b.len() as u64), 0);
        b
    }
}

/// The zero bytes that bring `n` to a multiple of [`ALIGN`].
pub fn padding(n: u64) -> usize {
    (n.next_multiple_of(ALIGN) - n) as usize
}

fn string(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// A value with its type id (GGUF's: 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array).
fn value(b: &mut Vec<u8>, v: &Put) {
    let array = |b: &mut Vec<u8>, of: u32, n: usize| {
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&of.to_le_bytes());
        b.extend_from_slice(&(n as u64).to_le_bytes());
    };
    match v {
        Put::U32(x) => {
            b.extend_from_slice(&4u32.to_le_bytes());
            b.extend_from_slice(&x.to_le_bytes());
        }
        Put::F32(x) => {
            b.extend_from_slice(&6u32.to_le_bytes());
            b.extend_from_slice(&x.to_le_bytes());
        }
        Put::Bool(x) => {
            b.extend_from_slice(&7u32.to_le_bytes());
            b.push(*x as u8);
        }
        Put::Str(s) => {
            b.extend_from_slice(&8u32.to_le_bytes());
            string(b, s);
        }
        Put::Strs(v) => {
            array(b, 8, v.len());
            v.iter().for_each(|s| string(b, s));
        }
        Put::I32s(v) => {
            array(b, 5, v.len());
            v.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
        }
    }
}
