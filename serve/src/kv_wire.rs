//! The KV-cache events' wire form (msgpack), as vllm-router 0.1.17 decodes it: a batch is the
//! array `[ts: f64, events: [event…], data_parallel_rank: 0]`, each event a map tagged by
//! `"type"`: `BlockStored {block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//! medium, lora_name}`, `BlockRemoved {block_hashes, medium}`, `AllBlocksCleared {}`; `medium` is
//! nil (the tier the engine computes from: kvgpt's K/V live in host memory and are never moved).

use kvgpt_core::engine::BlockEvent;

/// One batch of events as msgpack, in the wire form above.
pub fn encode_batch(ts: f64, events: &[BlockEvent], block_size: usize) -> Vec<u8> {
    let mut w = Msgpack(Vec::new());
    w.array(3);
    w.f64(ts);
    w.array(events.len());
    for e in events {
        match e {
            BlockEvent::Stored { hashes, parent, tokens } => {
                w.event(8, "BlockStored", hashes);
                w.str("parent_block_hash");
                match parent {
                    Some(p) => w.uint(*p),
                    None => w.nil(),
                }
                w.str("token_ids");
                w.uints(tokens.iter().map(|&t| u64::from(t)));
                w.str("block_size");
                w.uint(block_size as u64);
                for key in ["lora_id", "medium", "lora_name"] {
                    w.str(key);
                    w.nil();
                }
            }
            BlockEvent::Removed { hashes } => {
                w.event(3, "BlockRemoved", hashes);
                w.str("medium");
                w.nil();
            }
            BlockEvent::AllCleared => {
                w.map(1);
                w.str("type");
                w.str("AllBlocksCleared");
            }
        }
    }
    w.uint(0); // data_parallel_rank: kvgpt is one rank
    w.0
}

/// msgpack written into memory (which cannot fail), one value at a time.
struct Msgpack(Vec<u8>);

impl Msgpack {
    fn done<T, E: std::fmt::Debug>(r: Result<T, E>) {
        r.expect("writing msgpack into memory");
    }
    fn array(&mut self, n: usize) {
        Self::done(rmp::encode::write_array_len(&mut self.0, n as u32));
    }
    fn map(&mut self, n: usize) {
        Self::done(rmp::encode::write_map_len(&mut self.0, n as u32));
    }
    fn str(&mut self, s: &str) {
        Self::done(rmp::encode::write_str(&mut self.0, s));
    }
    fn uint(&mut self, x: u64) {
        Self::done(rmp::encode::write_uint(&mut self.0, x));
    }
    fn f64(&mut self, x: f64) {
        Self::done(rmp::encode::write_f64(&mut self.0, x));
    }
    fn nil(&mut self) {
        Self::done(rmp::encode::write_nil(&mut self.0));
    }
    fn uints(&mut self, xs: impl ExactSizeIterator<Item = u64>) {
        self.array(xs.len());
        xs.for_each(|x| self.uint(x));
    }
    /// A map of `fields` entries that starts `type: kind, block_hashes: hashes`.
    fn event(&mut self, fields: usize, kind: &str, hashes: &[u64]) {
        self.map(fields);
        self.str("type");
        self.str(kind);
        self.str("block_hashes");
        self.uints(hashes.iter().copied());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_the_msgpack_vllm_router_decodes() {
        let events = [
            BlockEvent::Stored { hashes: vec![7, 300], parent: None, tokens: vec![1, 2, 3, 70000] },
            BlockEvent::Removed { hashes: vec![7] },
            BlockEvent::AllCleared,
        ];
        let bytes = encode_batch(1.5, &events, 2);
        // Spelt out from the msgpack spec: fixarray 0x9N, float64 0xcb, fixmap 0x8N, fixstr 0xa0|len,
        // positive fixint, uint16 0xcd, uint32 0xce, nil 0xc0.
        let s = |t: &str| [vec![0xa0 | t.len() as u8], t.as_bytes().to_vec()].concat();
        let mut want = vec![0x93, 0xcb];
        want.extend(1.5f64.to_be_bytes());
        want.push(0x93);
        want.push(0x88);
        for part in [s("type"), s("BlockStored"), s("block_hashes"), vec![0x92, 7, 0xcd, 1, 44]] {
            want.extend(part);
        }
        for part in [s("parent_block_hash"), vec![0xc0], s("token_ids"), vec![0x94, 1, 2, 3, 0xce, 0, 1, 0x11, 0x70]] {
            want.extend(part);
        }
        for part in [s("block_size"), vec![2], s("lora_id"), vec![0xc0], s("medium"), vec![0xc0], s("lora_name")] {
            want.extend(part);
        }
        want.push(0xc0);
        for part in
            [vec![0x83], s("type"), s("BlockRemoved"), s("block_hashes"), vec![0x91, 7], s("medium"), vec![0xc0]]
        {
            want.extend(part);
        }
        for part in [vec![0x81], s("type"), s("AllBlocksCleared"), vec![0]] {
            want.extend(part);
        }
        assert_eq!(bytes, want);
    }
}
