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

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes)
        .map_err(|e| Error::Invalid(format!("could not write {}: {e}; choose a writable path", path.display())))
}

/// Writes `tensors` to `path`: all of them as safetensors, or the first as `.npy`.
/// Returns the names written.
pub fn write(path: &Path, tensors: &[Named]) -> Result<Vec<String>> {
    let bytes = match Format::of(path)? {
        Format::Npy => {
            let t = tensors.first().ok_or_else(|| Error::Invalid("nothing to export".into()))?;
            let mut out = npy_header(&t.shape);
            out.extend(t.data.iter().flat_map(|x| x.to_le_bytes()));
            write_file(path, &out)?;
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
    write_file(path, &bytes)?;
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

fn read_npy(bytes: &[u8]) -> std::result::Result<(Vec<usize>, Vec<f32>), String> {
    let (hlen, start) = match bytes.get(6) {
        Some(1) => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        Some(2) | Some(3) => (u32::from_le_bytes(bytes[8..12].try_into().map_err(|_| "truncated")?) as usize, 12),
        _ => return Err("unsupported .npy version".into()),
    };
    let header = std::str::from_utf8(bytes.get(start..start + hlen).ok_or("truncated .npy header")?)
        .map_err(|_| "the .npy header is not text")?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}'"))? + key.len() + 2;
        Some(header[at..].trim_start().trim_start_matches(':').trim_start())
    };
    let descr = field("descr").ok_or("no descr in the .npy header")?;
    let width = if descr.starts_with("'<f4'") {
        4
    } else if descr.starts_with("'<f8'") {
        8
    } else {
        return Err(format!(
            "dtype {} is not supported; save the logits as float32 or float64",
            &descr[..6.min(descr.len())]
        ));
    };
    if field("fortran_order").is_some_and(|f| f.starts_with("True")) {
        return Err("Fortran-order arrays are not supported; save with np.ascontiguousarray".into());
    }
    let shape_txt = field("shape").ok_or("no shape in the .npy header")?;
    let inner = &shape_txt[1..shape_txt.find(')').ok_or("bad shape")?];
    let shape: Vec<usize> = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| "bad shape"))
        .collect::<std::result::Result<_, _>>()?;
    let n: usize = shape.iter().product();
    let body = &bytes[start + hlen..];
    if body.len() < n * width {
        return Err(format!("holds {} bytes of data, shape {shape:?} needs {}", body.len(), n * width));
    }
    let data = match width {
        4 => body[..n * 4].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        _ => body[..n * 8].chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect(),
    };
    Ok((shape, data))
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
