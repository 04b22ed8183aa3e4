//! The candidates' order, most likely first with ties by lower id: the order `f32::total_cmp`
//! gives the scaled logits, reversed, and the order the sampler's sums run in. Found in O(V),
//! allocated once: each candidate is one `u64`, its descending key above its id, so that the
//! order is that of the integers. All V are put in order by a least-significant-digit radix sort
//! over the key's 32 bits; only the first k (top-k, k small) by a selection, then a sort of those.
//! Each radix pass is stable and the entries start in id order, so equal keys keep the lower id
//! first; the selection compares whole entries, ids included. Either gives the order of sorting
//! by `(total_cmp reversed, id)`.

/// `f32::total_cmp`'s order as the order of unsigned integers: total_cmp's own trick (a negative
/// value has its other 31 bits flipped, so the bits compare as a signed integer), then the sign
/// bit flipped, so that negatives come first.
pub fn ascending_key(x: f32) -> u32 {
    let bits = x.to_bits();
    (bits ^ (((bits as i32 >> 31) as u32) >> 1)) ^ 0x8000_0000
}

/// The value whose [`ascending_key`] is `k` (the same bits back).
pub fn from_ascending_key(k: u32) -> f32 {
    let b = k ^ 0x8000_0000;
    f32::from_bits(b ^ (((b as i32 >> 31) as u32) >> 1))
}

/// A candidate's entry: the key of `value` reversed (most likely first) above `id`.
fn entry(value: f32, id: usize) -> u64 {
    ((!ascending_key(value) as u64) << 32) | id as u64
}

/// The candidate id of an entry.
pub fn id(e: u64) -> u32 {
    e as u32
}

/// The scaled logit of an entry.
pub fn value(e: u64) -> f32 {
    from_ascending_key(!((e >> 32) as u32))
}

/// Bits per radix digit: at most 3 passes over the key (the last of 10 bits).
const RADIX: usize = 11;
const BUCKETS: usize = 1 << RADIX;

/// Up to this many first candidates are selected and sorted, not radix-sorted with the rest.
pub const SELECT_MAX: usize = 4096;

/// The sort's buffers, allocated once for a vocabulary (and grown only for a longer one).
pub struct Order {
    /// The entries, in order once [`Order::first`] has run.
    sorted: Vec<u64>,
    /// The radix sort's other buffer; free scratch after a sort.
    spare: Vec<u64>,
    /// A digit's histogram, then its buckets' next free places.
    counts: Vec<u32>,
}

impl Order {
    pub fn new(vocab: usize) -> Order {
        Order { sorted: Vec::with_capacity(vocab), spare: Vec::with_capacity(vocab), counts: vec![0; BUCKETS] }
    }

    /// The first `k` (at least 1, at most all) of the candidates `0..logits.len()` in order, by
    /// the scaled logits `(l - shift) · inv_t`; with scratch of at least that length.
    pub fn first(&mut self, logits: &[f32], shift: f32, inv_t: f32, k: usize) -> (&[u64], &mut [u64]) {
        let n = logits.len();
        let k = k.clamp(1, n.max(1));
        self.sorted.clear();
        self.sorted.extend(logits.iter().enumerate().map(|(i, &l)| entry((l - shift) * inv_t, i)));
        self.spare.resize(n, 0);
        if k <= SELECT_MAX && k < n {
            self.sorted.select_nth_unstable(k - 1);
            self.sorted[..k].sort_unstable();
        } else {
            self.radix_sort();
        }
        (&self.sorted[..k], &mut self.spare)
    }

    /// Sorts `sorted` by the entries' top 32 bits, stably.
    fn radix_sort(&mut self) {
        // The key bits that differ between entries: a digit without any (the sign and exponent
        // bits often are the same for all) needs no pass.
        let (all, any) = self.sorted.iter().fold((u64::MAX, 0), |(a, o), &e| (a & e, o | e));
        let varying = ((all ^ any) >> 32) as usize;
        // Writing the scratch in order first brings its lines into the cache, where the scatters'
        // writes then find them: after a forward pass has streamed the weights through the
        // caches, this took a fifth off the sampling time (DESIGN.md, issue #17 item 8).
        self.spare.fill(0);
        for shift in (0..32).step_by(RADIX) {
            if (varying >> shift) & (BUCKETS - 1) == 0 {
                continue;
            }
            let digit = |e: u64| (e >> (32 + shift)) as usize & (BUCKETS - 1);
            let c = &mut self.counts[..BUCKETS];
            c.fill(0);
            for &e in &self.sorted {
                c[digit(e)] += 1;
            }
            let mut at = 0u32;
            for slot in c.iter_mut() {
                (*slot, at) = (at, at + *slot);
            }
            for &e in &self.sorted {
                let slot = &mut c[digit(e)];
                self.spare[*slot as usize] = e;
                *slot += 1;
            }
            std::mem::swap(&mut self.sorted, &mut self.spare);
        }
    }
}
