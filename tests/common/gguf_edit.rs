//! A GGUF taken apart and put back together, for tests that make hostile files from the
//! fixture's: metadata as (key, type, raw value bytes), tensor infos, and the data section.
//! Written from the GGUF specification, apart from kvgpt's reader.

/// One metadata entry: its key, its GGUF value type and the value's bytes as stored.
pub struct Kv {
    pub key: String,
    pub ty: u32,
    pub raw: Vec<u8>,
}

/// One tensor info: name, dimensions, ggml type and offset into the data section.
pub struct TensorEntry {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: u32,
    pub offset: u64,
}

pub struct GgufFile {
    pub version: u32,
    pub kv: Vec<Kv>,
    pub tensors: Vec<TensorEntry>,
    pub data: Vec<u8>,
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        self.at += n;
        &self.b[self.at - n..self.at]
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        String::from_utf8(self.take(n).to_vec()).unwrap()
    }
    /// Steps over one value of type `ty`.
    fn skip(&mut self, ty: u32) {
        match ty {
            0 | 1 | 7 => self.at += 1,
            2 | 3 => self.at += 2,
            4..=6 => self.at += 4,
            10..=12 => self.at += 8,
            8 => {
                self.string();
            }
            9 => {
                let (et, n) = (self.u32(), self.u64());
                (0..n).for_each(|_| self.skip(et));
            }
            _ => panic!("GGUF value type {ty}"),
        }
    }
}

pub fn string_bytes(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

impl GgufFile {
    pub fn read(path: &std::path::Path) -> GgufFile {
        let b = std::fs::read(path).unwrap();
        let mut r = Reader { b: &b, at: 0 };
        assert_eq!(r.take(4), b"GGUF");
        let version = r.u32();
        let (n_tensors, n_kv) = (r.u64(), r.u64());
        let kv = (0..n_kv)
            .map(|_| {
                let key = r.string();
                let ty = r.u32();
                let start = r.at;
                r.skip(ty);
                Kv { key, ty, raw: b[start..r.at].to_vec() }
            })
            .collect();
        let tensors = (0..n_tensors)
            .map(|_| {
                let name = r.string();
                let nd = r.u32();
                let dims = (0..nd).map(|_| r.u64()).collect();
                TensorEntry { name, dims, ty: r.u32(), offset: r.u64() }
            })
            .collect();
        let mut g = GgufFile { version, kv, tensors, data: vec![] };
        let data_start = r.at.div_ceil(g.alignment());
        g.data = b[data_start * g.alignment()..].to_vec();
        g
    }

    pub fn alignment(&self) -> usize {
        self.kv
            .iter()
            .find(|k| k.key == "general.alignment")
            .map_or(32, |k| u32::from_le_bytes(k.raw[..4].try_into().unwrap()) as usize)
    }

    pub fn get(&mut self, key: &str) -> &mut Kv {
        self.kv.iter_mut().find(|k| k.key == key).unwrap_or_else(|| panic!("no key {key}"))
    }

    /// Sets `key` to a value of type `ty` with bytes `raw`, adding it if it is not there.
    pub fn set(&mut self, key: &str, ty: u32, raw: Vec<u8>) {
        match self.kv.iter_mut().find(|k| k.key == key) {
            Some(k) => (k.ty, k.raw) = (ty, raw),
            None => self.kv.push(Kv { key: key.into(), ty, raw }),
        }
    }

    pub fn write(&self, path: &std::path::Path) {
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kv.len() as u64).to_le_bytes());
        for k in &self.kv {
            b.extend(string_bytes(&k.key));
            b.extend(k.ty.to_le_bytes());
            b.extend(&k.raw);
        }
        for t in &self.tensors {
            b.extend(string_bytes(&t.name));
            b.extend((t.dims.len() as u32).to_le_bytes());
            t.dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
            b.extend(t.ty.to_le_bytes());
            b.extend(t.offset.to_le_bytes());
        }
        b.resize(b.len().div_ceil(self.alignment()) * self.alignment(), 0);
        b.extend(&self.data);
        std::fs::write(path, b).unwrap();
    }
}
