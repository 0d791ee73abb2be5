//! Write-intent bitmap: one bit per region of stripes, kept on every member
//! after the superblock. A region's bit is on disk (FUA) before any stripe in
//! it is written, and cleared lazily once no write is in flight there. At
//! assembly every region whose bit is set on any member gets its parity
//! recomputed, so a crash mid-update never leaves parity that disagrees with
//! its data.
//!
//! As in md, bits stay set while a region is busy and are cleared only after
//! it has been idle for a while (on flush or close), so a hot region costs one
//! bitmap write, not one per host write. Bigger regions mean fewer bitmap
//! writes and longer resyncs after a crash.
//!
//! This module keeps the in-memory state; the volume does the I/O. Writes of
//! one bitmap block are serialised (the volume holds `io` while writing), and
//! `persisted` tracks bits that are on disk *and* that no queued write will
//! clear, so a writer can skip the FUA write when its bit is already there.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Bytes of one bitmap block (the unit of bitmap I/O).
pub const BITMAP_BLOCK: usize = 4096;
const WORDS_PER_BLOCK: usize = BITMAP_BLOCK / 8;
pub const BITS_PER_BLOCK: u64 = (BITMAP_BLOCK * 8) as u64;

pub(crate) struct IntentLog {
    pub regions: u64,
    pub region_stripes: u64,
    state: Mutex<IntentState>,
    /// Held across a bitmap block write so writes of a block never reorder.
    pub io: tokio::sync::Mutex<()>,
}

/// Region numbers hash by one multiply: these maps are on every write's path.
#[derive(Default)]
struct RegionHasher(u64);

impl Hasher for RegionHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type RegionMap<V> = HashMap<u64, V, BuildHasherDefault<RegionHasher>>;

struct IntentState {
    mem: Vec<u64>,
    persisted: Vec<u64>,
    inflight: RegionMap<u32>,
    /// Regions with their bit set and no write in flight, and since when they
    /// are known to be (the first flush that saw them idle, before it
    /// flushed: [`IntentLog::stamp_idle`]), so the hot path never reads the
    /// clock.
    idle: RegionMap<Option<Instant>>,
    /// Set while a member is failed or being brought back: no bit is
    /// cleared, so the bitmap remembers every region written since.
    hold: bool,
}

impl IntentLog {
    pub fn new(stripes: u64, region_stripes: u64) -> IntentLog {
        let regions = stripes.div_ceil(region_stripes).max(1);
        let words = (Self::blocks_for(regions) * WORDS_PER_BLOCK as u64) as usize;
        IntentLog {
            regions,
            region_stripes,
            state: Mutex::new(IntentState {
                mem: vec![0; words],
                persisted: vec![0; words],
                inflight: RegionMap::default(),
                idle: RegionMap::default(),
                hold: false,
            }),
            io: tokio::sync::Mutex::new(()),
        }
    }

    pub fn blocks_for(regions: u64) -> u64 {
        regions.div_ceil(BITS_PER_BLOCK)
    }

    /// Bitmap bytes on disk.
    pub fn bytes(&self) -> usize {
        Self::blocks_for(self.regions) as usize * BITMAP_BLOCK
    }

    /// Smallest power-of-two region size whose bitmap fits in `bitmap_bytes`.
    pub fn region_stripes_for(stripes: u64, bitmap_bytes: u64) -> u64 {
        let bits = (bitmap_bytes / BITMAP_BLOCK as u64) * BITS_PER_BLOCK;
        let mut r = 1u64;
        while stripes.div_ceil(r) > bits.max(1) {
            r *= 2;
        }
        r
    }

    pub fn region_of(&self, stripe: u64) -> u64 {
        stripe / self.region_stripes
    }

    pub fn block_of(region: u64) -> usize {
        (region / BITS_PER_BLOCK) as usize
    }

    /// A write enters `region`. Returns true when the bit is not yet safely on
    /// disk and the caller must persist its block.
    pub fn begin(&self, region: u64) -> bool {
        let mut st = self.state.lock();
        *st.inflight.entry(region).or_insert(0) += 1;
        st.idle.remove(&region);
        let (w, bit) = ((region / 64) as usize, 1u64 << (region % 64));
        st.mem[w] |= bit;
        st.persisted[w] & bit == 0
    }

    /// With `io` held: the block to write for `region`, or None when another
    /// writer's snapshot already put the bit on disk.
    pub fn snapshot_for(&self, region: u64) -> Option<(usize, Vec<u8>)> {
        let mut st = self.state.lock();
        let (w, bit) = ((region / 64) as usize, 1u64 << (region % 64));
        if st.persisted[w] & bit != 0 {
            return None;
        }
        let block = Self::block_of(region);
        Some((block, Self::snapshot_locked(&mut st, block)))
    }

    /// With `io` held: the current contents of `block`. Taken without it
    /// (a joining member's first image), it only makes later bitmap writes
    /// write more: it marks the block's bits as persisted no further than
    /// they are set in memory.
    pub fn snapshot_block(&self, block: usize) -> Vec<u8> {
        let mut st = self.state.lock();
        Self::snapshot_locked(&mut st, block)
    }

    fn snapshot_locked(st: &mut IntentState, block: usize) -> Vec<u8> {
        let words = block * WORDS_PER_BLOCK..(block + 1) * WORDS_PER_BLOCK;
        let mut out = Vec::with_capacity(BITMAP_BLOCK);
        for w in words {
            // A bit this write clears is no longer known to be on disk.
            st.persisted[w] &= st.mem[w];
            out.extend_from_slice(&st.mem[w].to_le_bytes());
        }
        out
    }

    /// A snapshot of `block` reached the disk.
    pub fn written(&self, block: usize, snapshot: &[u8]) {
        let mut st = self.state.lock();
        for (i, chunk) in snapshot.chunks_exact(8).enumerate() {
            let w = block * WORDS_PER_BLOCK + i;
            st.persisted[w] = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        }
    }

    /// A write left `region`; its bit stays set until the region has been
    /// idle long enough for [`IntentLog::clear_idle`].
    pub fn end(&self, region: u64) {
        let mut st = self.state.lock();
        let Some(n) = st.inflight.get_mut(&region) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            st.inflight.remove(&region);
            st.idle.insert(region, None);
        }
    }

    /// Whether some region written since its bit was last cleared has no
    /// write in flight now (and no hold keeps the bits): a flush would start
    /// or finish clearing it.
    pub fn has_idle(&self) -> bool {
        let st = self.state.lock();
        !st.hold && !st.idle.is_empty()
    }

    /// Starts the idle time of every region idle now and not yet timed.
    /// Call before the members are flushed, then [`IntentLog::clear_idle`]
    /// with when that flush was issued.
    pub fn stamp_idle(&self) {
        let mut st = self.state.lock();
        let now = Instant::now();
        for t in st.idle.values_mut() {
            t.get_or_insert(now);
        }
    }

    /// Clears in memory the bits of regions idle for at least `age` and
    /// since before `flushed` (when a member flush that has completed was
    /// issued: every write to them had completed by then, so it is on the
    /// members for good); returns the bitmap blocks to write. A region
    /// that went idle later keeps its bit until the next flush.
    pub fn clear_idle(&self, age: Duration, flushed: Instant) -> Vec<usize> {
        let mut st = self.state.lock();
        if st.hold {
            return Vec::new();
        }
        let now = Instant::now();
        let mut old: Vec<u64> = Vec::new();
        for (r, t) in st.idle.iter() {
            if let Some(t) = *t
                && t <= flushed
                && now.duration_since(t) >= age
            {
                old.push(*r);
            }
        }
        let mut blocks: Vec<usize> = Vec::new();
        for r in old {
            st.idle.remove(&r);
            let (w, bit) = ((r / 64) as usize, 1u64 << (r % 64));
            st.mem[w] &= !bit;
            blocks.push(Self::block_of(r));
        }
        blocks.sort_unstable();
        blocks.dedup();
        blocks
    }

    /// Keeps every set bit (true) until released (false). Under the same
    /// lock as [`IntentLog::end`] and [`IntentLog::clear_idle`], so a region
    /// a write left after the hold began is never cleared under it.
    pub fn set_hold(&self, hold: bool) {
        self.state.lock().hold = hold;
    }

    pub fn held(&self) -> bool {
        self.state.lock().hold
    }

    /// Adopts the bits of an on-disk bitmap image (`bytes` from offset 0,
    /// already on the members): they stay set, and once no hold keeps them,
    /// flushes clear them like any idle region.
    pub fn load(&self, bytes: &[u8]) {
        let regions = self.dirty_regions(bytes);
        let mut st = self.state.lock();
        for r in regions {
            let (w, bit) = ((r / 64) as usize, 1u64 << (r % 64));
            st.mem[w] |= bit;
            st.persisted[w] |= bit;
            if !st.inflight.contains_key(&r) {
                st.idle.entry(r).or_insert(None);
            }
        }
    }

    /// The bits set now (in memory: on disk or about to be), one per region.
    pub fn set_bits(&self) -> Vec<u64> {
        self.state.lock().mem.clone()
    }

    /// Regions set in an on-disk bitmap image (`bytes` from offset 0).
    pub fn dirty_regions(&self, bytes: &[u8]) -> Vec<u64> {
        let mut out = Vec::new();
        for (i, chunk) in bytes.chunks_exact(8).enumerate() {
            let mut w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            while w != 0 {
                let b = w.trailing_zeros() as u64;
                let region = i as u64 * 64 + b;
                if region < self.regions {
                    out.push(region);
                }
                w &= w - 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_size_fits_bitmap() {
        assert_eq!(IntentLog::region_stripes_for(1000, 4096), 1);
        assert_eq!(IntentLog::region_stripes_for(32768, 4096), 1);
        assert_eq!(IntentLog::region_stripes_for(32769, 4096), 2);
        // 16 TiB member, 64 KiB strips, 1 MiB - 4 KiB of bitmap.
        let r = IntentLog::region_stripes_for(1 << 28, (1 << 20) - 4096);
        assert_eq!(r, 64);
    }

    #[test]
    fn bit_is_written_once_and_cleared_lazily() {
        let log = IntentLog::new(100, 1);
        assert!(log.begin(5), "first writer persists");
        let (blk, snap) = log.snapshot_for(5).expect("needs a write");
        assert_eq!(blk, 0);
        assert_eq!(snap[0], 1 << 5);
        log.written(blk, &snap);
        assert!(!log.begin(5), "bit already on disk");
        log.end(5);
        log.end(5);
        assert!(!log.begin(5), "an idle bit stays set");
        log.end(5);
        assert!(
            log.clear_idle(Duration::ZERO, Instant::now()).is_empty(),
            "not seen idle before a flush"
        );
        log.stamp_idle();
        let flushed = Instant::now();
        assert!(
            log.clear_idle(Duration::from_secs(60), flushed).is_empty(),
            "not idle long enough"
        );
        assert_eq!(log.clear_idle(Duration::ZERO, flushed), vec![0]);
        // A clear snapshot drops the persisted flag, so a new writer writes again.
        let snap = log.snapshot_block(0);
        assert_eq!(snap[0], 0);
        assert!(log.begin(5));
        assert!(log.snapshot_for(5).is_some());
    }

    /// A region whose last write completes while a flush is on its way is
    /// not cleared by that flush, which may not hold the write.
    #[test]
    fn a_region_idle_only_after_the_flush_was_issued_keeps_its_bit() {
        let log = IntentLog::new(100, 1);
        assert!(log.begin(7));
        let (b, s) = log.snapshot_for(7).unwrap();
        log.written(b, &s);
        log.stamp_idle();
        let flushed = Instant::now();
        log.end(7); // completes after the flush was issued
        assert!(log.clear_idle(Duration::ZERO, flushed).is_empty());
        log.stamp_idle();
        let flushed = Instant::now();
        assert_eq!(log.clear_idle(Duration::ZERO, flushed), vec![0]);
    }

    #[test]
    fn clear_racing_a_new_writer_never_loses_the_bit() {
        let log = IntentLog::new(100, 1);
        assert!(log.begin(3));
        let (b, s) = log.snapshot_for(3).unwrap();
        log.written(b, &s);
        log.end(3);
        log.stamp_idle();
        assert_eq!(log.clear_idle(Duration::ZERO, Instant::now()), vec![0]);
        // Clear snapshot taken (bit 3 off) ...
        let clear = log.snapshot_block(0);
        // ... then a writer enters before the clear lands: it must write.
        assert!(log.begin(3));
        log.written(0, &clear);
        let (_, s2) = log.snapshot_for(3).expect("must rewrite");
        assert_eq!(s2[0], 1 << 3);
        assert_eq!(log.dirty_regions(&s2), vec![3]);
    }
}
