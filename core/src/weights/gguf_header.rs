//! The GGUF header: its metadata values and tensor list, read by a checked little-endian reader
//! within limits and checked as llama.cpp checks it (no key or tensor twice, every tensor aligned,
//! inside the file and apart from the others), ggml's type names, and why a header cannot be read.

use kvgpt_kernels::WeightType;
use std::collections::BTreeMap;

pub(super) const MAGIC: &[u8; 4] = b"GGUF";
/// The most of a file read as its header: the tokenizer's metadata and the tensor list.
pub(super) const HEADER_READ: u64 = 16 << 20;
/// Limits that keep a corrupt header from asking for absurd allocations. GPT-2's vocabulary,
/// the longest array, has 50257 values.
const MAX_STRING: u64 = 1 << 20;
const MAX_ARRAY: u64 = 1 << 20;
const MAX_TENSORS: u64 = 1 << 16;

/// One metadata value.
#[derive(Clone, Debug)]
pub enum Value {
    Int(i128),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

/// A tensor's type: a float type, or one of llama.cpp's block types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    F32,
    F16,
    Bf16,
    Blocks(WeightType),
}

/// ggml's type ids of the types kvgpt reads and writes.
const IDS: [(u32, Kind); 11] = [
    (0, Kind::F32),
    (1, Kind::F16),
    (2, Kind::Blocks(WeightType::Q4_0)),
    (3, Kind::Blocks(WeightType::Q4_1)),
    (6, Kind::Blocks(WeightType::Q5_0)),
    (7, Kind::Blocks(WeightType::Q5_1)),
    (8, Kind::Blocks(WeightType::Q8_0)),
    (12, Kind::Blocks(WeightType::Q4K)),
    (13, Kind::Blocks(WeightType::Q5K)),
    (14, Kind::Blocks(WeightType::Q6K)),
    (30, Kind::Bf16),
];

impl Kind {
    pub(super) fn of(t: u32) -> Option<Kind> {
        IDS.iter().find(|(id, _)| *id == t).map(|(_, k)| *k)
    }

    /// The kind that stores weights held as `ty` as they are; None for kvgpt's own types.
    pub(super) fn storing(ty: WeightType) -> Option<Kind> {
        IDS.iter().map(|(_, k)| *k).find(|k| k.held() == ty)
    }

    /// ggml's id of this type.
    pub(super) fn id(self) -> u32 {
        IDS.iter().find(|(_, k)| *k == self).map(|(id, _)| *id).expect("every kind has an id")
    }

    /// Bytes of `n` elements (None unless they are whole blocks).
    pub(super) fn bytes(self, n: usize) -> Option<usize> {
        match self {
            Kind::F32 => n.checked_mul(4),
            Kind::F16 | Kind::Bf16 => n.checked_mul(2),
            Kind::Blocks(ty) => {
                let (elems, size) = ty.ggml_block().expect("a block type");
                n.is_multiple_of(elems).then(|| (n / elems).checked_mul(size)).flatten()
            }
        }
    }

    /// The type kvgpt holds it as when it keeps the file's weights.
    pub(super) fn held(self) -> WeightType {
        match self {
            Kind::F32 => WeightType::F32,
            Kind::F16 => WeightType::F16,
            Kind::Bf16 => WeightType::Bf16,
            Kind::Blocks(ty) => ty,
        }
    }

    pub fn name(self) -> &'static str {
        self.held().name()
    }
}

pub(super) struct TensorInfo {
    /// ggml order: `dims[0]` varies fastest.
    pub dims: Vec<usize>,
    pub kind: Kind,
    pub offset: u64,
}

/// Reads little-endian values from the header bytes, every read checked.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
    /// Whether the file goes on past `b` (its first [`HEADER_READ`] bytes).
    cut: bool,
}

impl Cursor<'_> {
    /// Why the header holds fewer bytes than it claims.
    fn short(&self) -> String {
        if self.cut {
            format!("its header runs past the first {} MiB, the most kvgpt reads of a GGUF header", HEADER_READ >> 20)
        } else {
            "the header ends too soon".into()
        }
    }
    fn take(&mut self, n: usize) -> std::result::Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or_else(|| self.short())?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        let n = self.u64()?;
        if n > MAX_STRING {
            return Err(format!("a string of {n} bytes; kvgpt reads strings of at most {MAX_STRING}"));
        }
        String::from_utf8(self.take(n as usize)?.to_vec()).map_err(|_| "a string that is not UTF-8".into())
    }
    fn value(&mut self, t: u32, depth: u32) -> std::result::Result<Value, String> {
        let int = |b: &[u8], signed: bool| -> i128 {
            let mut v = [0u8; 16];
            v[..b.len()].copy_from_slice(b);
            if signed && b.last().is_some_and(|x| x & 0x80 != 0) {
                v[b.len()..].fill(0xff);
            }
            i128::from_le_bytes(v)
        };
        Ok(match t {
            0 | 2 | 4 | 10 => Value::Int(int(self.take([1, 0, 2, 0, 4, 0, 0, 0, 0, 0, 8][t as usize])?, false)),
            1 | 3 | 5 | 11 => Value::Int(int(self.take([0, 1, 0, 2, 0, 4, 0, 0, 0, 0, 0, 8][t as usize])?, true)),
            6 => Value::Float(f32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as f64),
            12 => Value::Float(f64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes"))),
            7 => Value::Bool(self.take(1)?[0] != 0),
            8 => Value::Str(self.string()?),
            9 if depth == 0 => {
                let (et, n) = (self.u32()?, self.u64()?);
                if n > MAX_ARRAY {
                    return Err(format!("an array of {n} values; kvgpt reads arrays of at most {MAX_ARRAY}"));
                }
                // Nothing is made for values the rest of the header cannot hold.
                if n.saturating_mul(least_bytes(et)) > (self.b.len() - self.at) as u64 {
                    return Err(match self.cut {
                        true => self.short(),
                        false => format!("an array of {n} values, more than the rest of the file holds"),
                    });
                }
                (0..n).map(|_| self.value(et, 1)).collect::<std::result::Result<_, _>>().map(Value::Array)?
            }
            _ => return Err(format!("a metadata value of type {t}")),
        })
    }
}

/// The fewest bytes a metadata value of type `t` takes.
fn least_bytes(t: u32) -> u64 {
    match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        _ => 12,
    }
}

/// A GGUF header, read and checked.
pub(super) struct Header {
    pub version: u32,
    pub meta: BTreeMap<String, Value>,
    pub tensors: BTreeMap<String, TensorInfo>,
    /// Where the data section starts: the header's end, aligned.
    pub data_start: u64,
}

impl Header {
    /// Reads the header from `head`, the first bytes of a file of `file_len` bytes.
    pub fn parse(head: &[u8], file_len: u64) -> std::result::Result<Header, Bad> {
        let mut c = Cursor { b: head, at: 0, cut: (head.len() as u64) < file_len };
        if c.take(4)? != MAGIC {
            return Err("it does not start with GGUF".to_string().into());
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(Bad::Unsupported(format!("it is GGUF version {version}; kvgpt reads versions 2 and 3")));
        }
        let (n_tensors, n_kv) = (c.u64()?, c.u64()?);
        if n_tensors > MAX_TENSORS || n_kv > MAX_TENSORS {
            return Err(format!(
                "{n_tensors} tensors and {n_kv} metadata keys; kvgpt reads at most {MAX_TENSORS} of each"
            )
            .into());
        }
        let mut meta = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string()?;
            let t = c.u32()?;
            if meta.insert(key.clone(), c.value(t, 0)?).is_some() {
                return Err(format!("the metadata key `{key}` appears twice").into());
            }
        }
        let mut tensors = BTreeMap::new();
        for _ in 0..n_tensors {
            let (name, info) = tensor_info(&mut c)?;
            if tensors.insert(name.clone(), info).is_some() {
                return Err(format!("tensor `{name}` appears twice").into());
            }
        }
        let align = match meta.get("general.alignment") {
            Some(Value::Int(a)) if *a > 0 && *a <= 1 << 16 && (*a as u64).is_power_of_two() => *a as u64,
            None => 32,
            Some(v) => {
                return Err(format!("general.alignment is {}; it must be a power of two", describe(Some(v))).into())
            }
        };
        let data_start = (c.at as u64).div_ceil(align) * align;
        check_layout(&tensors, align, file_len.saturating_sub(data_start))?;
        Ok(Header { version, meta, tensors, data_start })
    }
}

/// One entry of the tensor list.
fn tensor_info(c: &mut Cursor) -> std::result::Result<(String, TensorInfo), Bad> {
    let name = c.string()?;
    let nd = c.u32()?;
    if nd > 4 {
        return Err(format!("tensor `{name}` has {nd} dimensions").into());
    }
    let dims = (0..nd).map(|_| c.u64().map(|d| d as usize)).collect::<std::result::Result<Vec<_>, _>>()?;
    let t = c.u32()?;
    let kind = Kind::of(t).ok_or_else(|| {
        Bad::Unsupported(format!(
            "tensor `{name}` is {}, which kvgpt does not read; it reads F32, F16, BF16, Q8_0, Q4_0, \
             Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K (llama-quantize writes them)",
            ggml_type_name(t)
        ))
    })?;
    Ok((name, TensorInfo { dims, kind, offset: c.u64()? }))
}

/// Every tensor starts on the alignment, holds whole blocks, ends inside the `data_bytes` of the
/// data section and overlaps no other.
fn check_layout(tensors: &BTreeMap<String, TensorInfo>, align: u64, data_bytes: u64) -> Result<(), String> {
    let mut spans = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if t.offset % align != 0 {
            return Err(format!(
                "tensor `{name}` starts at offset {}, not a multiple of {align} (the file's alignment)",
                t.offset
            ));
        }
        if t.kind.bytes(t.dims.first().copied().unwrap_or(1)).is_none() {
            let (kind, row) = (t.kind.name(), t.dims[0]);
            return Err(format!("tensor `{name}` is {kind} with rows of {row} elements, not whole blocks"));
        }
        let n = t.dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let end = n.and_then(|n| t.kind.bytes(n)).and_then(|b| t.offset.checked_add(b as u64));
        match end {
            Some(end) if end <= data_bytes => spans.push((t.offset, end, name)),
            _ => return Err(format!("tensor `{name}` lies beyond the end of the file")),
        }
    }
    spans.sort();
    match spans.windows(2).find(|w| w[1].0 < w[0].1) {
        Some(w) => Err(format!("tensors `{}` and `{}` overlap", w[0].2, w[1].2)),
        None => Ok(()),
    }
}

/// Why a GGUF header cannot be read: it is damaged, or it is sound but of a kind kvgpt does not
/// read.
pub(super) enum Bad {
    Corrupt(String),
    Unsupported(String),
}

impl From<String> for Bad {
    fn from(s: String) -> Bad {
        Bad::Corrupt(s)
    }
}

/// ggml's name of tensor type `t` (its `ggml_type` numbering), as llama.cpp prints it.
pub(super) fn ggml_type_name(t: u32) -> String {
    const NAMES: [&str; 40] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
    ];
    match NAMES.get(t as usize) {
        Some(n) => format!("{n} (ggml type {t})"),
        None => format!("ggml type {t}, which this kvgpt does not know"),
    }
}

/// A metadata value as an error message shows it.
pub(super) fn describe(v: Option<&Value>) -> String {
    match v {
        None => "missing".into(),
        Some(Value::Int(i)) => i.to_string(),
        Some(Value::Float(x)) => x.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Str(s)) => format!("`{s}`"),
        Some(Value::Array(a)) => format!("a list of {} values", a.len()),
    }
}
