//! A heap buffer aligned to 4 KiB, as O_DIRECT needs, with a settable length.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

pub const BUF_ALIGN: usize = 4096;

/// Owned, 4 KiB-aligned bytes. `len` is how many are in use; `capacity` is fixed
/// at allocation (a multiple of 4 KiB) so buffers can be pooled and reused.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of at least `capacity` bytes (rounded up to 4 KiB), with len 0.
    pub fn new(capacity: usize) -> Self {
        let cap = capacity.max(1).next_multiple_of(BUF_ALIGN);
        let layout = Layout::from_size_align(cap, BUF_ALIGN).expect("buffer layout");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, cap, len: 0 }
    }

    /// A buffer with no storage (capacity 0), for commands that move no
    /// data; it allocates nothing.
    pub fn empty() -> Self {
        AlignedBuf {
            // An aligned, never-dereferenced address: slices of it are empty.
            ptr: NonNull::new(std::ptr::without_provenance_mut(BUF_ALIGN)).expect("non-null"),
            cap: 0,
            len: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Sets the length in use. Panics if over capacity: that is a caller bug, not input.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.cap,
            "AlignedBuf::set_len {len} > capacity {}",
            self.cap
        );
        self.len = len;
    }
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// The whole allocation, regardless of `len`.
    pub fn spare(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for cap bytes, uniquely borrowed through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len bytes, initialised (zeroed at allocation).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.cap == 0 {
            return; // `empty()`: nothing was allocated
        }
        let layout = Layout::from_size_align(self.cap, BUF_ALIGN).expect("buffer layout");
        // SAFETY: allocated in `new` with this very layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf(len {}, cap {})", self.len, self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_rounded() {
        let mut b = AlignedBuf::new(5000);
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.as_ptr() as usize % BUF_ALIGN, 0);
        b.set_len(5000);
        b[4999] = 7;
        assert_eq!(b.len(), 5000);
        assert!(b.iter().take(4999).all(|&x| x == 0));
    }

    #[test]
    fn empty_allocates_nothing() {
        let b = AlignedBuf::empty();
        assert_eq!((b.len(), b.capacity()), (0, 0));
        assert_eq!(b.as_ptr() as usize % BUF_ALIGN, 0);
        assert!(b.is_empty());
    }

    #[test]
    #[should_panic]
    fn set_len_over_capacity_panics() {
        AlignedBuf::new(4096).set_len(4097);
    }
}
