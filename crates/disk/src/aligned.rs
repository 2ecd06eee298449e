//! Heap buffers aligned to [`SECTOR`], so that direct I/O can use them without a bounce copy.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::SECTOR;

/// A zero-initialised byte buffer whose start is aligned to [`SECTOR`].
///
/// The allocation is rounded up to whole sectors (at least one, so that even an empty
/// buffer has a valid aligned pointer), but only `len` bytes are exposed.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// The buffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout_for(len: usize) -> Layout {
        let cap = len
            .max(1)
            .checked_next_multiple_of(SECTOR)
            .expect("AlignedBuf length overflows usize");
        Layout::from_size_align(cap, SECTOR).expect("AlignedBuf layout too large")
    }

    /// A buffer of `len` zero bytes (any `len`, including 0).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let layout = Self::layout_for(len);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, layout }
    }

    /// An aligned copy of `data`. The copy is the only write to the buffer: a large aligned
    /// allocation zeroed first costs a memset as long as the copy (18 % of a parity import's
    /// profile went to zeroing buffers about to be overwritten).
    pub fn from_slice(data: &[u8]) -> AlignedBuf {
        let len = data.len();
        let layout = Self::layout_for(len);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        // SAFETY: the allocation holds at least `len` bytes and does not overlap `data`. The
        // `len` bytes the buffer exposes are all initialised by the copy; the rounding beyond
        // them is never exposed.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr(), len) };
        AlignedBuf { ptr, len, layout }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` or `from_slice` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the allocation holds at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> AlignedBuf {
        AlignedBuf::from_slice(self)
    }
}

impl Default for AlignedBuf {
    fn default() -> AlignedBuf {
        AlignedBuf::zeroed(0)
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &AlignedBuf) -> bool {
        **self == **other
    }
}

impl Eq for AlignedBuf {}

impl fmt::Debug for AlignedBuf {
    // Contents can be megabytes; the length is what matters in messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_aligned(b: &AlignedBuf) -> bool {
        (b.as_ptr() as usize).is_multiple_of(SECTOR)
    }

    #[test]
    fn zeroed_is_aligned_and_zero() {
        for len in [0, 1, 511, SECTOR, SECTOR + 1, 3 * SECTOR, 1 << 20] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.is_empty(), len == 0);
            assert!(is_aligned(&b), "len {len} not aligned");
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn from_slice_copies_and_clone_is_independent() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let a = AlignedBuf::from_slice(&data);
        assert_eq!(&a[..], &data[..]);
        let mut b = a.clone();
        assert!(is_aligned(&b));
        assert_eq!(a, b);
        b[0] ^= 0xff;
        assert_ne!(a, b);
        assert_eq!(a[0], data[0]);
    }

    #[test]
    fn writes_through_deref_mut() {
        let mut b = AlignedBuf::zeroed(SECTOR);
        b[SECTOR - 1] = 9;
        b[..4].copy_from_slice(b"abcd");
        assert_eq!(&b[..4], b"abcd");
        assert_eq!(b[SECTOR - 1], 9);
    }

    #[test]
    fn debug_prints_length_only() {
        let b = AlignedBuf::from_slice(&[0xAB; 100]);
        let s = format!("{b:?}");
        assert_eq!(s, "AlignedBuf { len: 100 }");
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<AlignedBuf>();
        let b = AlignedBuf::from_slice(b"xyz");
        let h = std::thread::spawn(move || b.to_vec());
        assert_eq!(h.join().unwrap(), b"xyz");
    }
}
