//! Writing tensors for numpy (`.npy`, `.safetensors`) and reading golden logits back.

use crate::error::{Error, Result};
use std::path::Path;

/// A named f32 tensor to write.
pub struct Named<'a> {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: &'a [f32],
}

/// The file formats `--export` writes, chosen by extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Npy,
    Safetensors,
}

impl Format {
    pub fn of(path: &Path) -> Result<Format> {
        match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
            Some("npy") => Ok(Format::Npy),
            Some("safetensors") => Ok(Format::Safetensors),
            _ => Err(Error::Invalid(format!(
                "{}: the export file must end in .safetensors (all tensors) or .npy (the first one)",
                path.display()
            ))),
        }
    }
}

/// Writes `bytes` to a temporary file beside `path`, then renames it over `path`: a failed write
/// (a full disk, a signal) leaves `path` as it was and no half file behind. A symlink at `path`
/// is replaced, never written through.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| Error::Invalid(format!("{} is not a file name", path.display())))?;
    let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let res = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::Write { what: path.display().to_string(), source: e });
    }
    Ok(())
}

/// Writes `tensors` to `path`: all of them as safetensors, or the first as `.npy`.
/// Returns the names written.
pub fn write(path: &Path, tensors: &[Named]) -> Result<Vec<String>> {
    let bytes = match Format::of(path)? {
        Format::Npy => {
            let t = tensors.first().ok_or_else(|| Error::Invalid("nothing to export".into()))?;
            let mut out = npy_header(&t.shape);
            out.extend(t.data.iter().flat_map(|x| x.to_le_bytes()));
            write_atomic(path, &out)?;
            return Ok(vec![t.name.clone()]);
        }
        Format::Safetensors => {
            let raw: Vec<Vec<u8>> =
                tensors.iter().map(|t| t.data.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
            let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
                .iter()
                .zip(&raw)
                .map(|(t, bytes)| {
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, t.shape.clone(), bytes)
                        .map(|v| (t.name.clone(), v))
                        .map_err(|e| Error::Invalid(format!("tensor {}: {e}", t.name)))
                })
                .collect::<Result<_>>()?;
            safetensors::serialize(views, None).map_err(|e| Error::Invalid(format!("safetensors: {e}")))?
        }
    };
    write_atomic(path, &bytes)?;
    Ok(tensors.iter().map(|t| t.name.clone()).collect())
}

/// NPY version 1.0 header for a little-endian f32 C-order array.
fn npy_header(shape: &[usize]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + length (2) + dict + '\n' must be a multiple of 64.
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((dict.len() as u16).to_le_bytes());
    out.extend(dict.as_bytes());
    out
}

/// Reads a float tensor: a `.npy` file (f4 or f8, C order), or tensor `name` of a safetensors
/// file (F32/F16/BF16/F64; the only tensor when `name` is None). Returns (shape, data).
pub fn read(path: &Path, name: Option<&str>) -> Result<(Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let bad = |why: String| Error::Invalid(format!("{}: {why}", path.display()));
    if bytes.starts_with(b"\x93NUMPY") {
        return read_npy(&bytes).map_err(bad);
    }
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| bad(format!("neither .npy nor a valid safetensors file ({e})")))?;
    let names = st.names();
    let name = match name {
        Some(n) => n.to_string(),
        None if names.len() == 1 => names[0].to_string(),
        None => {
            let mut all: Vec<String> = names.iter().map(|s| s.to_string()).collect();
            all.sort();
            return Err(Error::WhichTensor { file: path.to_path_buf(), names: all });
        }
    };
    let t = st.tensor(&name).map_err(|_| bad(format!("no tensor named {name}")))?;
    let b = t.data();
    let data: Vec<f32> = match t.dtype() {
        safetensors::Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        safetensors::Dtype::F64 => {
            b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect()
        }
        safetensors::Dtype::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        safetensors::Dtype::BF16 => {
            b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
        }
        other => return Err(bad(format!("tensor {name} has dtype {other:?}; expected a float type"))),
    };
    Ok((t.shape().to_vec(), data))
}

/// Parses a `.npy` file (versions 1–3) holding little-endian f4 or f8 in C order. Every fault is
/// an error saying what is wrong; the data must be exactly as long as the header's shape says.
pub fn read_npy(bytes: &[u8]) -> std::result::Result<(Vec<usize>, Vec<f32>), String> {
    if bytes.len() < 8 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (the magic \\x93NUMPY and version are missing or cut short)".into());
    }
    let (hlen, start) = match bytes[6] {
        1 => (bytes.get(8..10).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize), 10usize),
        2 | 3 => (bytes.get(8..12).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize), 12),
        v => return Err(format!(".npy version {v} is not supported (1, 2 and 3 are)")),
    };
    let hlen = hlen.ok_or("the .npy header length is cut short")?;
    let end = start.checked_add(hlen).filter(|&e| e <= bytes.len()).ok_or_else(|| {
        format!("the .npy header says it is {hlen} bytes long but the file has only {} after it", bytes.len() - start)
    })?;
    let header = std::str::from_utf8(&bytes[start..end]).map_err(|_| "the .npy header is not text")?;
    let dict = NpyDict::parse(header)?;
    let width = match dict.descr.as_str() {
        "<f4" => 4,
        "<f8" => 8,
        d => return Err(format!("dtype {d:?} is not supported; save the logits as float32 or float64 (<f4, <f8)")),
    };
    if dict.fortran_order {
        return Err("Fortran-order arrays are not supported; save with np.ascontiguousarray".into());
    }
    let n = dict.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or("the shape is too large")?;
    let want = n.checked_mul(width).ok_or("the shape is too large")?;
    let body = &bytes[end..];
    if body.len() != want {
        return Err(format!(
            "holds {} bytes of data, but shape {:?} of {} needs exactly {want}",
            body.len(),
            dict.shape,
            dict.descr
        ));
    }
    let data = match width {
        4 => body.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        _ => body.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect(),
    };
    Ok((dict.shape, data))
}

/// The header of a `.npy` file: a Python dict literal with `descr`, `fortran_order`, `shape`.
struct NpyDict {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

impl NpyDict {
    fn parse(text: &str) -> std::result::Result<NpyDict, String> {
        let mut p = Cursor { s: text.trim_end(), at: 0 };
        let (mut descr, mut fortran, mut shape) = (None, None, None);
        p.expect('{')?;
        loop {
            if p.eat('}') {
                break;
            }
            let key = p.string()?;
            p.expect(':')?;
            match key.as_str() {
                "descr" => descr = Some(p.string()?),
                "fortran_order" => fortran = Some(p.boolean()?),
                "shape" => shape = Some(p.tuple()?),
                k => return Err(format!("unknown key {k:?} in the .npy header")),
            }
            if !p.eat(',') {
                p.expect('}')?;
                break;
            }
        }
        if !p.rest().is_empty() {
            return Err("unexpected text after the .npy header's dict".into());
        }
        Ok(NpyDict {
            descr: descr.ok_or("no descr in the .npy header")?,
            fortran_order: fortran.ok_or("no fortran_order in the .npy header")?,
            shape: shape.ok_or("no shape in the .npy header")?,
        })
    }
}

/// A cursor over a Python literal (only what `.npy` headers hold).
struct Cursor<'a> {
    s: &'a str,
    at: usize,
}

impl Cursor<'_> {
    fn rest(&mut self) -> &str {
        self.at += self.s[self.at..].len() - self.s[self.at..].trim_start().len();
        &self.s[self.at..]
    }
    fn eat(&mut self, c: char) -> bool {
        let hit = self.rest().starts_with(c);
        if hit {
            self.at += c.len_utf8();
        }
        hit
    }
    fn expect(&mut self, c: char) -> std::result::Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            let got: String = self.rest().chars().take(12).collect();
            Err(format!("malformed .npy header: expected '{c}' at {:?}", got))
        }
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        let q = self.rest().chars().next().filter(|c| *c == '\'' || *c == '"').ok_or_else(|| {
            let got: String = self.rest().chars().take(12).collect();
            format!("malformed .npy header: expected a quoted string at {got:?}")
        })?;
        self.at += 1;
        let len = self.s[self.at..].find(q).ok_or("malformed .npy header: an unterminated string")?;
        let v = self.s[self.at..self.at + len].to_string();
        self.at += len + 1;
        Ok(v)
    }
    fn boolean(&mut self) -> std::result::Result<bool, String> {
        for (word, v) in [("True", true), ("False", false)] {
            if self.rest().starts_with(word) {
                self.at += word.len();
                return Ok(v);
            }
        }
        Err("malformed .npy header: fortran_order must be True or False".into())
    }
    fn tuple(&mut self) -> std::result::Result<Vec<usize>, String> {
        self.expect('(')?;
        let mut dims = Vec::new();
        loop {
            if self.eat(')') {
                return Ok(dims);
            }
            let r = self.rest();
            let len = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            let d = r[..len].parse().map_err(|_| {
                let got: String = r.chars().take(12).collect();
                format!("malformed .npy header: a shape entry must be a non-negative integer, got {got:?}")
            })?;
            self.at += len;
            dims.push(d);
            if !self.eat(',') {
                self.expect(')')?;
                return Ok(dims);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_round_trip_and_header_alignment() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.npy");
        let data: Vec<f32> = (0..24).map(|i| i as f32 * 0.5).collect();
        write(&p, &[Named { name: "x".into(), shape: vec![2, 3, 4], data: &data }]).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!((bytes.len() - 24 * 4) % 64, 0);
        assert_eq!(read(&p, None).unwrap(), (vec![2, 3, 4], data));
    }
}
