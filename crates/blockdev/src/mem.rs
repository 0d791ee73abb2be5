//! RAM backend, thin: storage comes in fixed chunks allocated on first write.
//!
//! Each chunk has its own lock, so reactor threads on different chunks never
//! contend and there is no device-wide lock on the I/O path. A chunk that was
//! never written (or was wholly deallocated) reads as zeroes and costs nothing.
//! Within a chunk a read never sees part of a write: readers share the chunk's
//! lock, writers take it alone.

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;

use crate::{
    AlignedBuf, BlockDevice, BlockError, BlockOp, Geometry, IoFuture, IoRequest, check_request,
    human_size,
};

/// Bytes per lazily allocated chunk: one transparent huge page on x86-64.
const CHUNK: u64 = 2 << 20;
/// Largest device we index: 8 Mi chunk slots (~192 MiB of slots) at 2 MiB each.
const MAX_SIZE: u64 = 16 << 40;
/// How much of an I/O `prefetch` asks for: the hardware prefetcher
/// streams the rest once the first lines and the page walk are under way.
const PREFETCH_BYTES: usize = 16 << 10;

struct Chunk {
    data: RwLock<Option<ChunkMem>>,
    /// Address of `data`'s bytes (0: none), read without the lock by
    /// `prefetch`: a hint only, never dereferenced.
    addr: AtomicUsize,
}

/// One chunk's bytes, `CHUNK` long and `CHUNK` aligned, so that the kernel can
/// back it with a transparent huge page: random 4 KiB reads out of a large
/// device then rarely miss the TLB (a page walk is several dependent memory
/// reads, more under a hypervisor).
struct ChunkMem(NonNull<u8>);

const CHUNK_LAYOUT: Layout = match Layout::from_size_align(CHUNK as usize, CHUNK as usize) {
    Ok(l) => l,
    Err(_) => panic!("chunk layout"),
};

// SAFETY: ChunkMem owns its allocation exclusively, like Box<[u8]>.
unsafe impl Send for ChunkMem {}
// SAFETY: shared references only give out &[u8].
unsafe impl Sync for ChunkMem {}

impl ChunkMem {
    fn zeroed() -> ChunkMem {
        // Not alloc_zeroed: that would touch every page before the advice below.
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc(CHUNK_LAYOUT) };
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(CHUNK_LAYOUT)
        };
        // Best effort: with THP off (or not Linux) the chunk is small pages.
        #[cfg(target_os = "linux")]
        // SAFETY: advice about our own allocation; it changes how the range is
        // backed, not what it holds.
        unsafe {
            libc::madvise(raw.cast(), CHUNK as usize, libc::MADV_HUGEPAGE);
        }
        // SAFETY: raw is valid for CHUNK bytes and ours alone.
        unsafe { raw.write_bytes(0, CHUNK as usize) };
        ChunkMem(ptr)
    }

    fn addr(&self) -> usize {
        self.0.as_ptr() as usize
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: valid for CHUNK bytes, initialised in `zeroed`.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr(), CHUNK as usize) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), CHUNK as usize) }
    }
}

impl Drop for ChunkMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this very layout.
        unsafe { dealloc(self.0.as_ptr(), CHUNK_LAYOUT) }
    }
}

/// Starts moving the cache line at `addr` towards L1. Any address will do.
#[inline]
fn prefetch_line(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and never faults,
    // whatever the address; SSE is part of the x86-64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// A thin RAM disk.
pub struct MemDevice {
    geo: Geometry,
    chunks: Box<[Chunk]>,
}

/// One piece of a request that falls inside a single chunk.
struct Segment {
    chunk: usize,
    /// Offset inside the chunk.
    at: usize,
    len: usize,
    /// Offset inside the request's buffer.
    buf_at: usize,
}

impl MemDevice {
    /// A zeroed device of `size_bytes` (a non-zero multiple of `block_size`,
    /// which is 512 or 4096). No memory is used until blocks are written.
    pub fn new(size_bytes: u64, block_size: u32) -> Result<MemDevice, BlockError> {
        let geo = Geometry::checked("mem device", size_bytes, block_size)?;
        if size_bytes > MAX_SIZE {
            return Err(BlockError::Config(format!(
                "mem device: size = {size_bytes} bytes is over the {} a RAM device supports; use a smaller size",
                human_size(MAX_SIZE)
            )));
        }
        let n = size_bytes.div_ceil(CHUNK) as usize;
        let chunks = (0..n)
            .map(|_| Chunk {
                data: RwLock::new(None),
                addr: AtomicUsize::new(0),
            })
            .collect();
        Ok(MemDevice { geo, chunks })
    }

    /// Bytes of RAM currently holding data (whole chunks).
    pub fn allocated_bytes(&self) -> u64 {
        let mut total = 0;
        for (i, c) in self.chunks.iter().enumerate() {
            if c.data.read().is_some() {
                total += self.chunk_len(i) as u64;
            }
        }
        total
    }

    fn chunk_len(&self, i: usize) -> usize {
        let start = i as u64 * CHUNK;
        (self.geo.size_bytes() - start).min(CHUNK) as usize
    }

    fn segments(&self, lba: u64, blocks: u32) -> impl Iterator<Item = Segment> + use<> {
        let bs = u64::from(self.geo.block_size);
        let mut pos = lba * bs;
        let end = pos + u64::from(blocks) * bs;
        let start = pos;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let chunk = pos / CHUNK;
            let at = pos % CHUNK;
            let len = (CHUNK - at).min(end - pos);
            let seg = Segment {
                chunk: chunk as usize,
                at: at as usize,
                len: len as usize,
                buf_at: (pos - start) as usize,
            };
            pos += len;
            Some(seg)
        })
    }

    fn read(&self, lba: u64, blocks: u32, buf: &mut AlignedBuf) {
        for s in self.segments(lba, blocks) {
            let dst = &mut buf[s.buf_at..s.buf_at + s.len];
            match &*self.chunks[s.chunk].data.read() {
                Some(mem) => dst.copy_from_slice(&mem.bytes()[s.at..s.at + s.len]),
                None => dst.fill(0),
            }
        }
    }

    fn write(&self, lba: u64, blocks: u32, buf: &AlignedBuf) {
        for s in self.segments(lba, blocks) {
            let src = &buf[s.buf_at..s.buf_at + s.len];
            let chunk = &self.chunks[s.chunk];
            let mut slot = chunk.data.write();
            let mem = slot.get_or_insert_with(|| {
                let mem = ChunkMem::zeroed();
                chunk.addr.store(mem.addr(), Ordering::Relaxed);
                mem
            });
            mem.bytes_mut()[s.at..s.at + s.len].copy_from_slice(src);
        }
    }

    /// Frees chunks the range covers whole, zeroes the rest of the range.
    fn zero(&self, lba: u64, blocks: u32) {
        for s in self.segments(lba, blocks) {
            let chunk = &self.chunks[s.chunk];
            let whole = s.at == 0 && s.len == self.chunk_len(s.chunk);
            if whole {
                // Check under the cheaper read lock first: never-written chunks are common.
                if chunk.data.read().is_some() {
                    let mut slot = chunk.data.write();
                    chunk.addr.store(0, Ordering::Relaxed);
                    *slot = None;
                }
                continue;
            }
            if chunk.data.read().is_none() {
                continue;
            }
            if let Some(mem) = &mut *chunk.data.write() {
                mem.bytes_mut()[s.at..s.at + s.len].fill(0);
            }
        }
    }
}

impl BlockDevice for MemDevice {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn submit(&self, req: IoRequest) -> IoFuture {
        if let Err(e) = check_request(self.geo, &req) {
            return IoFuture::ready(req.buf, Err(e));
        }
        let IoRequest {
            op,
            lba,
            blocks,
            mut buf,
        } = req;
        match op {
            BlockOp::Read => self.read(lba, blocks, &mut buf),
            BlockOp::Write { .. } => self.write(lba, blocks, &buf),
            BlockOp::Flush => {}
            BlockOp::WriteZeroes | BlockOp::Deallocate => self.zero(lba, blocks),
        }
        IoFuture::ready(buf, Ok(()))
    }

    fn prefetch(&self, lba: u64, blocks: u32) {
        let bs = self.geo.block_size;
        let end = lba.checked_add(u64::from(blocks));
        if end.is_none_or(|e| e > self.geo.num_blocks) {
            return;
        }
        let blocks = blocks.min((PREFETCH_BYTES as u32 / bs).max(1));
        for s in self.segments(lba, blocks) {
            let base = self.chunks[s.chunk].addr.load(Ordering::Relaxed);
            if base == 0 {
                continue;
            }
            // Two lines per 4 KiB page: the page walk, and a head start on each half.
            for off in (0..s.len).step_by(2048) {
                prefetch_line(base + s.at + off);
            }
        }
    }

    fn deallocate_reads_zeroes(&self) -> bool {
        true
    }

    fn allocated_blocks(&self) -> Option<u64> {
        Some(self.allocated_bytes() / u64::from(self.geo.block_size))
    }

    fn describe(&self) -> String {
        format!(
            "mem ({}, {} B blocks, thin, {} allocated)",
            human_size(self.geo.size_bytes()),
            self.geo.block_size,
            human_size(self.allocated_bytes())
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::testutil::*;

    #[test]
    fn config_errors_say_what_to_do() {
        let e = MemDevice::new(1000, 512)
            .err()
            .expect("size not a multiple")
            .to_string();
        assert!(e.contains("1000") && e.contains("1024"), "{e}");
        let e = MemDevice::new(0, 4096)
            .err()
            .expect("zero size")
            .to_string();
        assert!(e.contains("size = 0"), "{e}");
        let e = MemDevice::new(1 << 20, 1024)
            .err()
            .expect("bad block size")
            .to_string();
        assert!(e.contains("1024") && e.contains("512 or 4096"), "{e}");
        assert!(MemDevice::new(32 << 40, 4096).is_err());
    }

    #[test]
    fn roundtrip_across_chunks() {
        // 3.5 chunks with 512 B blocks: a partial last chunk, many boundaries.
        let dev = MemDevice::new(3 * CHUNK + CHUNK / 2, 512).unwrap();
        assert_eq!(dev.geometry().num_blocks, (3 * CHUNK + CHUNK / 2) / 512);
        check_random_roundtrip(&dev, 1, 300);
        // One write straddling two chunks.
        let bs = 512usize;
        let lba = CHUNK / 512 - 3;
        let mut data = vec![0u8; 8 * bs];
        Rng::new(9).fill(&mut data);
        write(&dev, lba, &data);
        assert_eq!(read(&dev, lba, 8), data);
    }

    #[test]
    fn thin_until_written() {
        let dev = MemDevice::new(1 << 30, 4096).unwrap();
        assert_eq!(dev.allocated_bytes(), 0);
        assert!(read(&dev, 1000, 4).iter().all(|&b| b == 0));
        assert_eq!(dev.allocated_bytes(), 0, "reads allocate nothing");
        assert_eq!(dev.allocated_blocks(), Some(0));
        write(&dev, 300, &[7u8; 4096]);
        assert_eq!(dev.allocated_bytes(), CHUNK);
        assert_eq!(dev.allocated_blocks(), Some(CHUNK / 4096));
        // Zeroing part of the chunk keeps it; zeroing all of it frees it.
        let blocks_per_chunk = (CHUNK / 4096) as u32;
        io(&dev, BlockOp::WriteZeroes, 300, 1, AlignedBuf::new(0))
            .result
            .unwrap();
        assert_eq!(dev.allocated_bytes(), CHUNK);
        write(&dev, 300, &[7u8; 4096]);
        io(
            &dev,
            BlockOp::Deallocate,
            0,
            3 * blocks_per_chunk,
            AlignedBuf::new(0),
        )
        .result
        .unwrap();
        assert_eq!(dev.allocated_bytes(), 0);
        assert!(read(&dev, 300, 1).iter().all(|&b| b == 0));
        assert!(dev.describe().contains("1 GiB"), "{}", dev.describe());
    }

    #[test]
    fn bad_requests_error_not_panic() {
        check_bad_requests(&MemDevice::new(64 * 4096, 4096).unwrap());
        check_bad_requests(&MemDevice::new(64 * 512, 512).unwrap());
    }

    #[test]
    fn zeroing_reads_back_zeroes() {
        assert!(
            MemDevice::new(CHUNK, 512)
                .unwrap()
                .deallocate_reads_zeroes()
        );
        // Spans three chunks so whole-chunk frees and partial zeroing both happen.
        check_zeroing(&MemDevice::new(3 * CHUNK, 4096).unwrap(), 2);
        check_zeroing(&MemDevice::new(CHUNK + 64 * 512, 512).unwrap(), 3);
    }

    #[test]
    fn concurrent_threads() {
        // Small chunks of the device are shared between threads' regions, so the
        // per-chunk locks see contention.
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(2 * CHUNK, 4096).unwrap());
        check_concurrent(dev, 8, 200);
    }

    #[test]
    fn reads_never_see_half_a_write() {
        // A 4 KiB block read while another thread rewrites it, or frees its whole
        // chunk, comes back whole: all of one write, or all zeroes.
        use std::sync::atomic::AtomicBool;
        let dev = Arc::new(MemDevice::new(2 * CHUNK, 4096).unwrap());
        let per_chunk = CHUNK / 4096;
        let lbas = [0, 1, per_chunk - 1, per_chunk, 2 * per_chunk - 1];
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (dev, stop) = (Arc::clone(&dev), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut round = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    let fill = (round % 255 + 1) as u8;
                    for lba in lbas {
                        write(&*dev, lba, &[fill; 4096]);
                    }
                    if round.is_multiple_of(7) {
                        let whole = per_chunk as u32;
                        let done = io(
                            &*dev,
                            BlockOp::Deallocate,
                            per_chunk,
                            whole,
                            AlignedBuf::new(0),
                        );
                        done.result.unwrap();
                    }
                }
                round
            })
        };
        let mut reads = 0u32;
        while reads < 20_000 {
            for lba in lbas {
                dev.prefetch(lba, 1);
                let got = read(&*dev, lba, 1);
                assert!(
                    got.iter().all(|&b| b == got[0]),
                    "lba {lba}: a torn block (starts with {}, holds {})",
                    got[0],
                    got.iter().find(|&&b| b != got[0]).unwrap()
                );
                reads += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let rounds = writer.join().unwrap();
        assert!(rounds > 1, "the writer ran alongside the reads");
    }

    #[test]
    fn prefetch_ignores_bad_ranges_and_holes() {
        let dev = MemDevice::new(2 * CHUNK, 512).unwrap();
        let n = dev.geometry().num_blocks;
        for (lba, blocks) in [(n, 1), (n - 1, 2), (u64::MAX, 1), (0, u32::MAX), (0, 0)] {
            dev.prefetch(lba, blocks);
        }
        dev.prefetch(0, 8); // never written
        write(&dev, 8, &[3u8; 4096]);
        dev.prefetch(0, (n - 1) as u32);
        assert_eq!(read(&dev, 8, 8), vec![3u8; 4096]);
    }

    #[test]
    fn chunks_are_huge_page_aligned() {
        let mem = ChunkMem::zeroed();
        assert_eq!(mem.addr() % CHUNK as usize, 0);
        assert!(mem.bytes().iter().all(|&b| b == 0));
    }
}
