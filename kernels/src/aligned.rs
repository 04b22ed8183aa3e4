//! A buffer whose start is aligned to a 64-byte cache line, so that a 64-byte panel row (or a
//! 32-byte AVX load) never straddles two lines. `Vec<f32>` from the system allocator starts 16
//! bytes into a line for large sizes, which splits every other load of a panel row.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// Element types for which every bit pattern is a valid value.
pub trait Plain: Copy + 'static {}
impl Plain for f32 {}
impl Plain for u16 {}
impl Plain for i8 {}
impl Plain for u8 {}

/// `len` values of `T`, zero-initialised, starting on a 64-byte boundary.
pub struct Aligned<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Plain> Aligned<T> {
    pub fn zeroed(len: usize) -> Aligned<T> {
        let bytes = len * std::mem::size_of::<T>();
        Aligned { lines: vec![Line([0; 64]); bytes.div_ceil(64)], len, _t: PhantomData }
    }
}

/// The bytes of plain values, in memory order (little-endian on every machine kvgpt runs on).
pub fn bytes_of_plain<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: a `Plain` type has no padding and no invalid bit patterns, so every byte of `v` is
    // initialised; u8 has alignment 1; the length is the slice's size in bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

impl<T: Plain> Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `lines` holds at least len * size_of::<T>() initialised bytes (zeroed, then
        // written only through this type), its start is 64-byte aligned (≥ align_of::<T>()), and
        // every bit pattern is a valid `T` (the `Plain` types).
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const T, self.len) }
    }
}

impl<T: Plain> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, with exclusive access through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut T, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_cache_line_and_round_trips() {
        let v: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let mut a = Aligned::zeroed(v.len());
        a.copy_from_slice(&v);
        assert_eq!(a.as_ptr() as usize % 64, 0);
        assert_eq!(&a[..], &v[..]);
        let b: Aligned<i8> = Aligned::zeroed(3);
        assert_eq!(&b[..], &[0, 0, 0]);
    }
}
