//! A heap buffer aligned to 4 KiB, as O_DIRECT needs, with a settable length;
//! and views of one buffer shared by several I/Os without copying.
//!
//! An [`AlignedBuf`] either owns its allocation or is a *view*: a window of
//! another buffer that was handed to [`AlignedBuf::share`] (read-only views,
//! any number, overlapping allowed: a mirror writes the same bytes to every
//! copy) or [`AlignedBuf::split_mut`] (writable views of disjoint ranges: a
//! striped read lands each member's strip in its place in the caller's
//! buffer). The parent is reference-counted: it lives while the holder
//! ([`SharedBuf`] / [`SplitBuf`]) or any view does, whatever the order they
//! are dropped in, and the holder gives the original buffer back once every
//! view is gone (`try_unwrap`). A view never returns to a buffer pool
//! (pools check [`AlignedBuf::is_view`]).
//!
//! The type stays `AlignedBuf` so [`crate::IoRequest`] and every backend take
//! views unchanged. A read-only view cannot be written: `DerefMut`, `spare`
//! and `as_mut_ptr` panic with a "caller bug" message (a backend only writes
//! into buffers of reads, and a volume gives read-only views to writes only).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

pub const BUF_ALIGN: usize = 4096;

/// Where a view starts must be a multiple of this (the smallest block size),
/// so a view can go to O_DIRECT / io_uring like any buffer.
pub const VIEW_ALIGN: usize = 512;

/// Owned, 4 KiB-aligned bytes, or a view of a shared buffer (see the module
/// docs). `len` is how many are in use; `capacity` is fixed at allocation (a
/// multiple of 4 KiB for owned buffers, the window's size for a view) so
/// buffers can be pooled and reused.
pub struct AlignedBuf {
    /// First byte of this buffer (of the window, for a view).
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
    /// `None`: this buffer owns `ptr..ptr + cap` and frees it on drop.
    /// `Some`: a view; the parent owns the memory and outlives the view.
    parent: Option<Arc<Parent>>,
    /// False only for read-only views.
    writable: bool,
}

/// The buffer views point into. Dropping it drops `base` (freeing the
/// allocation, or releasing the grandparent when `base` is itself a view).
struct Parent {
    base: AlignedBuf,
}

// SAFETY: an owned AlignedBuf owns its allocation exclusively, like Vec<u8>.
// A writable view has exclusive access to its window (split_mut hands out
// disjoint windows and nobody else touches the parent's bytes while views
// live). A read-only view only reads, and everyone else who can reach those
// bytes (other read-only views, the SharedBuf) only reads too. The parent is
// kept alive by an Arc, which is Send + Sync.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give out &[u8] (and *const u8).
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of at least `capacity` bytes (rounded up to 4 KiB), with len 0.
    pub fn new(capacity: usize) -> Self {
        let cap = capacity.max(1).next_multiple_of(BUF_ALIGN);
        let layout = Layout::from_size_align(cap, BUF_ALIGN).expect("buffer layout");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf {
            ptr,
            cap,
            len: 0,
            parent: None,
            writable: true,
        }
    }

    /// A buffer with no storage (capacity 0), for commands that move no
    /// data; it allocates nothing.
    pub fn empty() -> Self {
        AlignedBuf {
            // An aligned, never-dereferenced address: slices of it are empty.
            ptr: NonNull::new(std::ptr::without_provenance_mut(BUF_ALIGN)).expect("non-null"),
            cap: 0,
            len: 0,
            parent: None,
            writable: true,
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
    /// Whether this is a view of a shared buffer (which must not be pooled).
    pub fn is_view(&self) -> bool {
        self.parent.is_some()
    }
    /// False for read-only views; true for owned buffers and writable views.
    pub fn is_writable(&self) -> bool {
        self.writable
    }
    /// Sets the length in use. Panics if over capacity (a view's capacity is
    /// its window): that is a caller bug, not input.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.cap,
            "AlignedBuf::set_len {len} > capacity {}{}",
            self.cap,
            if self.is_view() { " of a view" } else { "" }
        );
        self.len = len;
    }
    /// The first byte (of the window, for a view).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    /// Panics on a read-only view.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.check_writable("as_mut_ptr");
        self.ptr.as_ptr()
    }
    /// The whole allocation (the whole window, for a view), regardless of
    /// `len`. Panics on a read-only view.
    pub fn spare(&mut self) -> &mut [u8] {
        self.check_writable("spare");
        // SAFETY: ptr is valid for cap bytes; we are its only user: an owned
        // buffer is borrowed uniquely through &mut self, a writable view's
        // window is disjoint from every other live view's and the holder
        // does not touch the bytes while views live.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    #[track_caller]
    fn check_writable(&self, what: &str) {
        assert!(
            self.writable,
            "caller bug: AlignedBuf::{what} on a read-only view of a shared buffer \
             (views from SharedBuf::view are for writes to devices only)"
        );
    }

    /// Turns this buffer into a shared parent for read-only views (see
    /// [`SharedBuf::view`]). The bytes in use (`len`) are what views see.
    pub fn share(self) -> SharedBuf {
        let len = self.len;
        SharedBuf {
            parent: Arc::new(Parent { base: self }),
            len,
        }
    }

    /// Hands out writable views of the disjoint byte `ranges` of this
    /// buffer's capacity (in the order given), and the holder that gives the
    /// buffer back once they are all dropped. Each view's `len` is its
    /// range's length. Panics (caller bug) if ranges overlap, run past the
    /// capacity, start off a [`VIEW_ALIGN`] boundary, or if this buffer is a
    /// read-only view.
    pub fn split_mut(self, ranges: &[Range<usize>]) -> (SplitBuf, Vec<AlignedBuf>) {
        self.check_writable("split_mut");
        // Empty windows alias nothing.
        let mut sorted: Vec<&Range<usize>> = ranges.iter().filter(|r| !r.is_empty()).collect();
        sorted.sort_unstable_by_key(|r| r.start);
        for w in sorted.windows(2) {
            assert!(
                w[0].end <= w[1].start,
                "caller bug: AlignedBuf::split_mut ranges {:?} and {:?} overlap",
                w[0],
                w[1]
            );
        }
        let parent = Arc::new(Parent { base: self });
        let views = ranges
            .iter()
            .map(|r| view_of(&parent, r.clone(), parent.base.cap, true))
            .collect();
        (SplitBuf { parent }, views)
    }
}

/// A view of `range` of `parent`'s bytes (bounded by `limit`).
fn view_of(parent: &Arc<Parent>, range: Range<usize>, limit: usize, writable: bool) -> AlignedBuf {
    assert!(
        range.start <= range.end && range.end <= limit,
        "caller bug: view {range:?} is outside the shared buffer's {limit} bytes"
    );
    assert!(
        range.start.is_multiple_of(VIEW_ALIGN),
        "caller bug: view {range:?} does not start on a {VIEW_ALIGN}-byte boundary"
    );
    let base = &parent.base;
    // SAFETY: range.start <= limit <= base.cap, so the result stays inside
    // (or one past the end of) base's allocation, from which base.ptr derives.
    let ptr = unsafe { base.ptr.add(range.start) };
    AlignedBuf {
        ptr,
        cap: range.len(),
        len: range.len(),
        parent: Some(parent.clone()),
        writable,
    }
}

/// A buffer lent out as read-only views ([`AlignedBuf::share`]). Dereferences
/// to its bytes in use; give it back with [`SharedBuf::try_unwrap`].
pub struct SharedBuf {
    parent: Arc<Parent>,
    len: usize,
}

impl SharedBuf {
    /// A read-only view of `range` of the bytes in use. Views may overlap.
    /// Panics (caller bug) if the range runs past `len` or does not start on
    /// a [`VIEW_ALIGN`] boundary.
    pub fn view(&self, range: Range<usize>) -> AlignedBuf {
        view_of(&self.parent, range, self.len, false)
    }

    /// How many views are alive.
    pub fn views(&self) -> usize {
        Arc::strong_count(&self.parent) - 1
    }

    /// The original buffer, once no view is alive; else `self` back.
    pub fn try_unwrap(self) -> Result<AlignedBuf, SharedBuf> {
        let len = self.len;
        Arc::try_unwrap(self.parent)
            .map(|p| p.base)
            .map_err(|parent| SharedBuf { parent, len })
    }
}

impl std::ops::Deref for SharedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.parent.base
    }
}

impl std::fmt::Debug for SharedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBuf(len {}, views {})", self.len, self.views())
    }
}

/// A buffer lent out as disjoint writable views ([`AlignedBuf::split_mut`]).
/// It gives no access to the bytes while views live (they may be being
/// written); [`SplitBuf::try_unwrap`] gives the buffer back, with what the
/// views wrote, once they are all dropped.
pub struct SplitBuf {
    parent: Arc<Parent>,
}

impl SplitBuf {
    /// How many views are alive.
    pub fn views(&self) -> usize {
        Arc::strong_count(&self.parent) - 1
    }

    /// The original buffer, once no view is alive; else `self` back.
    pub fn try_unwrap(self) -> Result<AlignedBuf, SplitBuf> {
        Arc::try_unwrap(self.parent)
            .map(|p| p.base)
            .map_err(|parent| SplitBuf { parent })
    }
}

impl std::fmt::Debug for SplitBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SplitBuf(views {})", self.views())
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len bytes, initialised (zeroed at
        // allocation). Nobody writes them while we read: an owned buffer is
        // borrowed through &self, a writable view's window is its own, and a
        // read-only view's bytes are only read by anyone while it lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.check_writable("deref_mut");
        // SAFETY: as `spare`: the window is ours alone, borrowed uniquely.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.parent.is_some() || self.cap == 0 {
            // A view: the parent frees the memory when its last user drops
            // (the Arc drops after this). `empty()`: nothing was allocated.
            return;
        }
        let layout = Layout::from_size_align(self.cap, BUF_ALIGN).expect("buffer layout");
        // SAFETY: an owned buffer allocated in `new` with this very layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.parent, self.writable) {
            (None, _) => write!(f, "AlignedBuf(len {}, cap {})", self.len, self.cap),
            (Some(_), w) => write!(
                f,
                "AlignedBuf({} view, len {}, cap {})",
                if w { "writable" } else { "read-only" },
                self.len,
                self.cap
            ),
        }
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // `&[a..b]`: one window is a real case
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

    fn filled(len: usize) -> AlignedBuf {
        let mut b = AlignedBuf::new(len);
        b.set_len(len);
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i / 512) as u8;
        }
        b
    }

    #[test]
    fn views_read_the_parents_bytes() {
        let b = filled(16384);
        let base = b.as_ptr();
        let s = b.share();
        let v1 = s.view(4096..12288);
        let v2 = s.view(512..8192); // overlaps v1: fine for read-only views
        assert_eq!(v1.as_ptr(), base.wrapping_add(4096));
        assert_eq!((v1.len(), v1.capacity()), (8192, 8192));
        assert!(v1.is_view() && !v1.is_writable());
        assert_eq!(&v1[..], &s[4096..12288]);
        assert_eq!(v2[0], 1);
        assert_eq!(v2[8191 - 512], 15);
        assert_eq!(s.views(), 2);
        drop((v1, v2));
        let back = s.try_unwrap().expect("no views left");
        assert_eq!(back.as_ptr(), base);
        assert!(!back.is_view());
        assert_eq!(back.len(), 16384);
    }

    #[test]
    fn try_unwrap_fails_while_a_view_lives() {
        let s = filled(8192).share();
        let v = s.view(0..4096);
        let s = s.try_unwrap().expect_err("a view is alive");
        assert_eq!(s.views(), 1);
        drop(v);
        assert!(s.try_unwrap().is_ok());

        let (h, mut views) = filled(8192).split_mut(&[0..4096, 4096..8192]);
        let last = views.pop().unwrap();
        drop(views);
        let h = h.try_unwrap().expect_err("a view is alive");
        drop(last);
        assert_eq!(h.try_unwrap().unwrap().len(), 8192);
    }

    #[test]
    fn disjoint_mut_views_write_into_the_parent() {
        let b = filled(3 * 4096);
        let base = b.as_ptr();
        // Out of order, not covering everything, one not 4 KiB aligned.
        let (h, mut views) = b.split_mut(&[8192..12288, 512..1024, 4096..8192]);
        assert_eq!(views[1].as_ptr(), base.wrapping_add(512));
        assert!(views.iter().all(|v| v.is_view() && v.is_writable()));
        // Views may be written from other threads at once.
        std::thread::scope(|sc| {
            for (i, v) in views.iter_mut().enumerate() {
                sc.spawn(move || v.fill(0xa0 + i as u8));
            }
        });
        views[2].set_len(100);
        views[2].spare()[4095] = 0xff; // the whole window, not beyond
        drop(views);
        let b = h.try_unwrap().unwrap();
        assert_eq!(b[0], 0);
        assert!(b[512..1024].iter().all(|&x| x == 0xa1));
        assert_eq!(b[1024], 2);
        assert!(b[4096..8191].iter().all(|&x| x == 0xa2));
        assert_eq!(b[8191], 0xff);
        assert!(b[8192..].iter().all(|&x| x == 0xa0));
    }

    #[test]
    fn drop_order_any_frees_once() {
        // Holder first, then views; views in reverse; nested views outliving
        // their parent view. A double free or use after free would crash
        // (and shows under Miri / ASan).
        let s = filled(8192).share();
        let a = s.view(0..4096);
        let b = s.view(0..8192);
        drop(s);
        assert_eq!(b[4096], 8);
        drop(b);
        assert_eq!(a[0], 0);
        drop(a);

        let (h, views) = filled(8192).split_mut(&[0..4096, 4096..8192]);
        let mut it = views.into_iter();
        let (v0, v1) = (it.next().unwrap(), it.next().unwrap());
        // A view shared again (a volume whose member is a volume).
        let inner = v1.share();
        let w = inner.view(512..1024);
        drop(inner);
        drop(h);
        drop(v0);
        assert_eq!(w[0], 9);
        drop(w);

        // Nested split of a view, given back level by level.
        let (h, mut views) = filled(8192).split_mut(&[0..8192]);
        let (h2, mut inner) = views.pop().unwrap().split_mut(&[4096..8192]);
        inner[0].fill(7);
        drop(inner);
        let v = h2.try_unwrap().unwrap();
        assert!(v.is_view());
        drop(v);
        let b = h.try_unwrap().unwrap();
        assert!(b[4096..].iter().all(|&x| x == 7));
    }

    #[test]
    #[should_panic(expected = "caller bug")]
    fn read_only_view_refuses_deref_mut() {
        let s = filled(4096).share();
        let mut v = s.view(0..4096);
        v[0] = 1;
    }

    #[test]
    #[should_panic(expected = "caller bug")]
    fn read_only_view_refuses_as_mut_ptr() {
        let s = filled(4096).share();
        s.view(0..4096).as_mut_ptr();
    }

    #[test]
    #[should_panic(expected = "caller bug")]
    fn read_only_view_refuses_spare() {
        let s = filled(4096).share();
        s.view(0..512).spare();
    }

    #[test]
    #[should_panic(expected = "capacity 512 of a view")]
    fn view_set_len_beyond_window_panics() {
        let s = filled(4096).share();
        s.view(0..512).set_len(513);
    }

    #[test]
    fn empty_windows_overlap_nothing() {
        let (h, views) = filled(8192).split_mut(&[0..4096, 0..0, 4096..4096]);
        assert_eq!(
            views.iter().map(|v| v.len()).collect::<Vec<_>>(),
            [4096, 0, 0]
        );
        drop(views);
        assert!(h.try_unwrap().is_ok());
    }

    #[test]
    #[should_panic(expected = "caller bug")]
    fn overlapping_mut_views_refused() {
        let _ = filled(8192).split_mut(&[0..4096, 3584..8192]);
    }

    #[test]
    #[should_panic(expected = "caller bug")]
    fn view_off_block_boundary_refused() {
        let _ = filled(8192).share().view(100..612);
    }

    #[test]
    #[should_panic(expected = "caller bug")]
    fn view_past_len_refused() {
        let mut b = AlignedBuf::new(8192);
        b.set_len(4096);
        let _ = b.share().view(0..8192);
    }

    #[test]
    #[should_panic(expected = "caller bug")]
    fn read_only_view_cannot_be_split_mut() {
        let s = filled(4096).share();
        let _ = s.view(0..4096).split_mut(&[0..512]);
    }

    #[test]
    fn send_and_sync() {
        fn both<T: Send + Sync>() {}
        both::<AlignedBuf>();
        both::<SharedBuf>();
        both::<SplitBuf>();
        // Views of one parent dropped on several threads at once.
        let s = filled(1 << 16).share();
        let views: Vec<_> = (0..8).map(|i| s.view(i * 8192..(i + 1) * 8192)).collect();
        std::thread::scope(|sc| {
            for v in views {
                sc.spawn(move || assert_eq!(v[0] as usize % 16, 0));
            }
        });
        assert!(s.try_unwrap().is_ok());
    }
}
