//! One allocation for a pool's K/V blocks, laid out so that a head's rows of consecutive blocks
//! are neighbours in memory (as one contiguous cache's were): `[segment][block][len]`, a segment
//! being one layer's K or V of one head. [`Slab::blocks`] hands out one [`SlabBlock`] per block, and
//! no other: holding `&mut` of a block's token is the only way to write its memory, so the borrow
//! checker keeps writers and readers of one block apart, and different blocks never overlap.
//!
//! The memory is zeroed by the allocator (pages the OS commits as they are first written), and an
//! allocation that fails is reported, not aborted on.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::Arc;

/// The memory of `blocks` blocks of `segments` segments of `len` floats.
pub struct Slab {
    ptr: *mut f32,
    layout: Layout,
    blocks: usize,
    segments: usize,
    len: usize,
}

// SAFETY: the slab is only reached through its blocks' tokens: a segment is read through `&`
// of its block's token and written through `&mut` of it, and each block has exactly one token,
// so no two threads can write, or write and read, the same floats.
unsafe impl Send for Slab {}
// SAFETY: as above.
unsafe impl Sync for Slab {}

impl Drop for Slab {
    fn drop(&mut self) {
        if self.layout.size() > 0 {
            // SAFETY: `ptr` came from `alloc_zeroed(layout)` and is freed once, here.
            unsafe { dealloc(self.ptr as *mut u8, self.layout) }
        }
    }
}

/// The only handle on one block of a [`Slab`] (with where its segments are, so that reaching
/// one reads nothing but the handle).
pub struct SlabBlock {
    slab: Arc<Slab>,
    index: usize,
    /// Segment 0 of this block, and the floats from one segment to the next.
    first: *mut f32,
    stride: usize,
    segments: usize,
    len: usize,
}

// SAFETY: `first` points into the slab the handle keeps alive; the handle is the only way to its
// block's floats (see `Slab`), so moving or sharing it between threads is as safe as the slab.
unsafe impl Send for SlabBlock {}
// SAFETY: as above.
unsafe impl Sync for SlabBlock {}

impl Slab {
    /// `blocks` blocks of `segments` segments of `len` floats each, all zero; one token per block,
    /// in order. None when the memory cannot be had (or its size overflows).
    pub fn blocks(blocks: usize, segments: usize, len: usize) -> Option<Vec<SlabBlock>> {
        let floats = blocks.checked_mul(segments)?.checked_mul(len)?;
        let layout = Layout::array::<f32>(floats).ok()?;
        let ptr = if layout.size() == 0 {
            std::ptr::NonNull::<f32>::dangling().as_ptr()
        } else {
            // SAFETY: the layout has a non-zero size (checked just above).
            let p = unsafe { alloc_zeroed(layout) } as *mut f32;
            if p.is_null() {
                return None;
            }
            p
        };
        let slab = Arc::new(Slab { ptr, layout, blocks, segments, len });
        let stride = blocks * len;
        // SAFETY: index * len < blocks * len floats lie inside the allocation (or it is empty).
        let first = |index: usize| unsafe { ptr.add(index * len) };
        Some(
            (0..blocks)
                .map(|index| SlabBlock { slab: slab.clone(), index, first: first(index), stride, segments, len })
                .collect(),
        )
    }
}

impl SlabBlock {
    /// Which block of its slab this is.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Floats per segment.
    pub fn segment_len(&self) -> usize {
        self.len
    }

    /// Where segment `s` of this block starts, from its first.
    #[inline]
    fn at(&self, s: usize) -> usize {
        assert!(s < self.segments, "segment {s} of a block of {}", self.segments);
        debug_assert!(self.slab.blocks * self.slab.segments * self.slab.len >= s * self.stride + self.len);
        s * self.stride
    }

    /// Segment `s` of this block.
    #[inline]
    pub fn segment(&self, s: usize) -> &[f32] {
        let at = self.at(s);
        // SAFETY: segment s < segments of block index < blocks lies inside the allocation; only
        // this token reaches these floats, and it is borrowed shared, so nothing writes them now.
        unsafe { std::slice::from_raw_parts(self.first.add(at), self.len) }
    }

    /// Segment `s` of this block, to write.
    #[inline]
    pub fn segment_mut(&mut self, s: usize) -> &mut [f32] {
        let at = self.at(s);
        // SAFETY: as in `segment`, and the token is borrowed exclusively, so nothing else reads
        // or writes these floats while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.first.add(at), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_disjoint_zeroed_and_laid_out_segment_major() {
        let mut blocks = Slab::blocks(3, 2, 4).unwrap();
        assert!(blocks.iter().all(|b| (0..2).all(|s| b.segment(s).iter().all(|&x| x == 0.0))));
        for b in &mut blocks {
            for s in 0..2 {
                let v = (10 * b.index() + s) as f32;
                b.segment_mut(s).fill(v);
            }
        }
        for b in &blocks {
            for s in 0..2 {
                assert!(b.segment(s).iter().all(|&x| x == (10 * b.index() + s) as f32));
            }
        }
        // Segment 0 of blocks 0, 1, 2 are neighbours, then segment 1 of each.
        let base = blocks[0].segment(0).as_ptr() as usize;
        assert_eq!(blocks[1].segment(0).as_ptr() as usize - base, 4 * 4);
        assert_eq!(blocks[0].segment(1).as_ptr() as usize - base, 3 * 4 * 4);
        assert!(Slab::blocks(usize::MAX, 2, 4).is_none(), "a size that overflows is refused");
        assert!(Slab::blocks(0, 2, 4).unwrap().is_empty());
    }
}
