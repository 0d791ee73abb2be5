//! RAM backend, thin: storage comes in fixed chunks allocated on first write.
//!
//! Each chunk has its own lock, so reactor threads on different chunks never
//! contend and there is no device-wide lock on the I/O path. A chunk that was
//! never written (or was wholly deallocated) reads as zeroes and costs nothing.
//! Within a chunk a read never sees part of a write: readers share the chunk's
//! lock, writers take it alone.

mod chunk;
mod filler;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;

use crate::{
    AlignedBuf, BlockDevice, BlockError, BlockOp, Geometry, IoFuture, IoRequest, check_request,
    human_size,
};

use chunk::ChunkMem;
use filler::Filler;
pub use filler::MemAllocation;

/// Bytes per lazily allocated chunk: one transparent huge page on x86-64.
const CHUNK: u64 = chunk::CHUNK as u64;
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

/// MemAvailable from /proc/meminfo, in bytes (None where it cannot be read).
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
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

/// A RAM disk, thin unless made with `MemAllocation::Full`.
pub struct MemDevice {
    geo: Geometry,
    chunks: Arc<[Chunk]>,
    /// The background allocator (not for `MemAllocation::OnWrite`).
    filler: Option<Arc<Filler>>,
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
    /// which is 512 or 4096). No memory is used until blocks are written;
    /// the first write to each 2 MiB allocates it.
    pub fn new(size_bytes: u64, block_size: u32) -> Result<MemDevice, BlockError> {
        MemDevice::with_allocation(size_bytes, block_size, MemAllocation::OnWrite)
    }

    /// As `new`, with memory allocated as `alloc` says.
    pub fn with_allocation(
        size_bytes: u64,
        block_size: u32,
        alloc: MemAllocation,
    ) -> Result<MemDevice, BlockError> {
        let geo = Geometry::checked("mem device", size_bytes, block_size)?;
        if size_bytes > MAX_SIZE {
            return Err(BlockError::Config(format!(
                "mem device: size = {size_bytes} bytes is over the {} a RAM device supports; use a smaller size",
                human_size(MAX_SIZE)
            )));
        }
        // Thick memory is committed at once, by a thread nobody waits on:
        // refuse what the machine cannot hold now rather than be killed later.
        if alloc == MemAllocation::Full
            && let Some(avail) = available_memory()
            && size_bytes > avail
        {
            return Err(BlockError::Config(format!(
                "mem device: thin = false needs {} of RAM up front, but {} is available; \
                 use thin = true (RAM on first write) or a smaller size",
                human_size(size_bytes),
                human_size(avail)
            )));
        }
        let n = size_bytes.div_ceil(CHUNK) as usize;
        let chunks = (0..n)
            .map(|_| Chunk {
                data: RwLock::new(None),
                addr: AtomicUsize::new(0),
            })
            .collect::<Vec<_>>()
            .into();
        let filler = Filler::start(alloc, &chunks);
        Ok(MemDevice {
            geo,
            chunks,
            filler,
        })
    }

    /// A new chunk: a ready one from the background allocator, else mapped here.
    fn new_chunk(&self) -> ChunkMem {
        self.filler
            .as_ref()
            .and_then(|f| f.take())
            .unwrap_or_else(ChunkMem::zeroed)
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
            let fresh = slot.is_none();
            let mem = slot.get_or_insert_with(|| {
                let mem = self.new_chunk();
                chunk.addr.store(mem.addr(), Ordering::Relaxed);
                mem
            });
            mem.bytes_mut()[s.at..s.at + s.len].copy_from_slice(src);
            if fresh {
                // Touched first as small pages (a huge page's fault would
                // stall this write); merged into one in the background.
                mem.advise_huge();
            }
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
                    drop(slot);
                    if let Some(f) = &self.filler {
                        f.hole();
                    }
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
        let how = match &self.filler {
            Some(f) if f.full() => format!(
                "thick, {} allocated{}",
                human_size(self.allocated_bytes()),
                if f.filled_once() { "" } else { " so far" }
            ),
            // Chunks made ready ahead are not the device's: not shown.
            _ => format!("thin, {} allocated", human_size(self.allocated_bytes())),
        };
        format!(
            "mem ({}, {} B blocks, {how})",
            human_size(self.geo.size_bytes()),
            self.geo.block_size,
        )
    }
}

impl Drop for MemDevice {
    fn drop(&mut self) {
        if let Some(f) = &self.filler {
            f.stop();
        }
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

    /// Waits (up to 10 s) for the background allocator to get `dev` to `want`.
    fn wait_for(dev: &MemDevice, want: impl Fn(&MemDevice) -> bool) -> bool {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < until {
            if want(dev) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn ahead_stays_thin_and_hands_out_zeroed_chunks() {
        // 16 chunks: two kept ready (an eighth)
        let dev = MemDevice::with_allocation(16 * CHUNK, 4096, MemAllocation::Ahead).unwrap();
        let ready = |d: &MemDevice| d.filler.as_ref().unwrap().ready_bytes();
        assert!(wait_for(&dev, |d| ready(d) == 2 * CHUNK));
        assert!(
            dev.describe().contains("thin, 0 bytes allocated"),
            "{}",
            dev.describe()
        );
        assert_eq!(
            dev.allocated_bytes(),
            0,
            "ready chunks are not the device's"
        );
        // every chunk written once: the ready ones are used and made again
        for c in 0..8 {
            write(&dev, c * CHUNK / 4096 + 5, &[c as u8 + 1; 4096]);
        }
        assert_eq!(dev.allocated_bytes(), 8 * CHUNK);
        for c in 0..8 {
            assert_eq!(read(&dev, c * CHUNK / 4096 + 5, 1), vec![c as u8 + 1; 4096]);
            assert!(read(&dev, c * CHUNK / 4096 + 6, 1).iter().all(|&b| b == 0));
        }
        check_zeroing(&dev, 5);
        check_bad_requests(&dev);
    }

    #[test]
    fn full_allocates_everything_and_maps_freed_chunks_again() {
        let dev = MemDevice::with_allocation(3 * CHUNK + 8192, 4096, MemAllocation::Full).unwrap();
        let all = 3 * CHUNK + 8192;
        assert!(wait_for(&dev, |d| d.allocated_bytes() == all));
        assert!(dev.describe().contains("thick"), "{}", dev.describe());
        assert!(!dev.describe().contains("so far"), "{}", dev.describe());
        assert!(read(&dev, 0, 4).iter().all(|&b| b == 0));
        write(&dev, 700, &[4u8; 4096]);
        let per = (CHUNK / 4096) as u32;
        io(&dev, BlockOp::Deallocate, 0, per, AlignedBuf::new(0))
            .result
            .unwrap();
        assert!(read(&dev, 0, 1).iter().all(|&b| b == 0));
        assert!(
            wait_for(&dev, |d| d.allocated_bytes() == all),
            "mapped again"
        );
        assert_eq!(read(&dev, 700, 1), vec![4u8; 4096]);
        check_zeroing(&dev, 7);
    }

    #[test]
    fn thick_more_than_the_machine_holds_is_refused() {
        let avail = available_memory().expect("Linux has /proc/meminfo");
        let size = (avail / CHUNK + 16) * CHUNK;
        let e = MemDevice::with_allocation(size, 4096, MemAllocation::Full)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("thin = false needs") && e.contains("available"),
            "{e}"
        );
        // thin: only a promise, accepted
        assert!(MemDevice::with_allocation(size, 4096, MemAllocation::Ahead).is_ok());
    }

    #[test]
    fn a_dropped_device_stops_its_allocator() {
        for mode in [MemAllocation::Ahead, MemAllocation::Full] {
            let dev = MemDevice::with_allocation(64 * CHUNK, 4096, mode).unwrap();
            drop(dev);
        }
        // the threads end on their own; nothing to join, nothing leaks into other tests
    }
}
