//! Work split between threads: when it pays, and the pointer through which tasks write their
//! disjoint parts of one output.

/// Below this many multiply-adds a kernel runs on the calling thread.
pub(crate) const PAR_MIN_WORK: usize = 1 << 16;

/// A raw pointer that may be sent to other threads; each task writes a disjoint region.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: used only to hand disjoint sub-regions of one `&mut [f32]` to rayon tasks that all end
// before the borrow does.
unsafe impl Send for SendPtr {}
// SAFETY: as above; the pointer is only read (copied) from shared references.
unsafe impl Sync for SendPtr {}
