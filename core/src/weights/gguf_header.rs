//! The GGUF header's vocabulary: metadata values, the checked little-endian reader, ggml's type
//! names, and why a header cannot be read.

/// Limits that keep a corrupt header from asking for absurd allocations.
const MAX_STRING: u64 = 1 << 20;
const MAX_ARRAY: u64 = 1 << 24;

/// One metadata value.
#[derive(Clone, Debug)]
pub enum Value {
    Int(i128),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

/// Reads little-endian values from the header bytes, every read checked.
pub(super) struct Cursor<'a> {
    pub b: &'a [u8],
    pub at: usize,
}

impl Cursor<'_> {
    pub(super) fn take(&mut self, n: usize) -> std::result::Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or("the header ends too soon")?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    pub(super) fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    pub(super) fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub(super) fn string(&mut self) -> std::result::Result<String, String> {
        let n = self.u64()?;
        if n > MAX_STRING {
            return Err(format!("a string of {n} bytes"));
        }
        String::from_utf8(self.take(n as usize)?.to_vec()).map_err(|_| "a string that is not UTF-8".into())
    }
    pub(super) fn value(&mut self, t: u32, depth: u32) -> std::result::Result<Value, String> {
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
                    return Err(format!("an array of {n} values"));
                }
                (0..n).map(|_| self.value(et, 1)).collect::<std::result::Result<_, _>>().map(Value::Array)?
            }
            _ => return Err(format!("a metadata value of type {t}")),
        })
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
