//! One chunk of a RAM device's memory: `CHUNK` bytes, `CHUNK` aligned, mapped
//! straight from the kernel.
//!
//! Aligned to a transparent huge page so that random 4 KiB reads out of a
//! large device rarely miss the TLB (a page walk is several dependent memory
//! reads, more under a hypervisor). Mapped anonymous memory reads as zeroes,
//! so a new chunk needs no memset of its own: the kernel zeroes each page
//! when it is first touched. `populate` does that touching ahead of time, off
//! the I/O path.

use std::ptr::NonNull;

/// Bytes per chunk: one transparent huge page on x86-64.
pub(super) const CHUNK: usize = 2 << 20;

pub(super) struct ChunkMem(NonNull<u8>);

// SAFETY: ChunkMem owns its mapping exclusively, like Box<[u8]>.
unsafe impl Send for ChunkMem {}
// SAFETY: shared references only give out &[u8].
unsafe impl Sync for ChunkMem {}

impl ChunkMem {
    /// A zeroed chunk of small pages, each faulted in (and zeroed by the
    /// kernel) on first touch. Aborts like any allocation when memory runs
    /// out.
    pub fn zeroed() -> ChunkMem {
        // Map twice the size and keep the aligned middle: mmap only promises
        // page alignment.
        let len = 2 * CHUNK;
        // SAFETY: a fresh anonymous private mapping; no existing memory involved.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(CHUNK, CHUNK).expect("chunk layout"),
            );
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(CHUNK);
        let head = aligned - start;
        let tail = len - head - CHUNK;
        // SAFETY: both ranges lie inside the mapping made above and are not
        // the chunk kept; unmapping them touches nothing else.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + CHUNK) as *mut libc::c_void, tail);
            }
        }
        ChunkMem(NonNull::new(aligned as *mut u8).expect("mmap never returns 0 here"))
    }

    /// Asks for the chunk to be backed by a transparent huge page. Best
    /// effort: with THP off it stays small pages. Advised before its first
    /// touch, the touch faults in (and zeroes) the whole huge page: 0.1 ms
    /// on bare metal, about 3 ms in a VM whose host backs the memory lazily,
    /// so only off the I/O path ([`ChunkMem::populated`]). Advised after, the
    /// kernel's khugepaged merges the small pages in the background.
    pub fn advise_huge(&self) {
        #[cfg(target_os = "linux")]
        // SAFETY: advice about our own mapping; it changes how the range is
        // backed, not what it holds.
        unsafe {
            libc::madvise(self.0.as_ptr().cast(), CHUNK, libc::MADV_HUGEPAGE);
        }
    }

    /// A zeroed chunk whose pages are already faulted in, so that its first
    /// write costs a memcpy and no page fault.
    pub fn populated() -> ChunkMem {
        let mut c = ChunkMem::zeroed();
        c.advise_huge();
        c.populate();
        c
    }

    fn populate(&mut self) {
        // MADV_POPULATE_WRITE (Linux 5.14) faults the range in for writing in
        // one call; on older kernels touch one byte per 4 KiB page instead
        // (writing the zero it already holds).
        #[cfg(target_os = "linux")]
        {
            const MADV_POPULATE_WRITE: libc::c_int = 23;
            // SAFETY: advice about our own mapping; it does not change the bytes.
            let r = unsafe { libc::madvise(self.0.as_ptr().cast(), CHUNK, MADV_POPULATE_WRITE) };
            if r == 0 {
                return;
            }
        }
        let b = self.bytes_mut();
        for i in (0..CHUNK).step_by(4096) {
            // SAFETY: i < CHUNK; a volatile write so that the touch is not elided.
            unsafe { std::ptr::write_volatile(b.as_mut_ptr().add(i), 0) };
        }
    }

    pub fn addr(&self) -> usize {
        self.0.as_ptr() as usize
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is CHUNK bytes, readable, and lives as long as self.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr(), CHUNK) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), CHUNK) }
    }
}

impl Drop for ChunkMem {
    fn drop(&mut self) {
        // SAFETY: the CHUNK bytes mapped in `zeroed`, ours alone.
        unsafe { libc::munmap(self.0.as_ptr().cast(), CHUNK) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_writable() {
        for make in [ChunkMem::zeroed, ChunkMem::populated] {
            let mut c = make();
            assert_eq!(c.addr() % CHUNK, 0);
            assert!(c.bytes().iter().all(|&b| b == 0));
            c.bytes_mut()[CHUNK - 1] = 9;
            c.bytes_mut()[0] = 8;
            assert_eq!((c.bytes()[0], c.bytes()[CHUNK - 1]), (8, 9));
        }
    }
}
