//! The pool in memory: cluster maps, volumes, the cluster allocator, and
//! the shared state the metadata journal and the I/O path work on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::{ArcSwap, ArcSwapOption};
use blockdev::{BlockDevice, BlockError};
use parking_lot::Mutex;
use tokio::sync::RwLock;

use super::extent::Extent;
use super::format::{PoolGeom, Record, VolMeta, io_err, owner_code};
use super::pack::{PACK_BLOCK, PACK_OWNER, Packed, Packer};
use super::{LOCK_SHARDS, MAP_PAGE, MAX_VOLUME_CLUSTERS, MAX_VOLUMES};

/// Where a virtual cluster lives: a physical cluster of its own, or a
/// compressed chunk in a pack cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Loc {
    Raw(u32),
    Packed(Packed),
}

/// No entry in a map word.
const EMPTY: u64 = u64::MAX;
const PACKED_BIT: u64 = 1 << 63;

impl Loc {
    fn word(self) -> u64 {
        match self {
            Loc::Raw(p) => u64::from(p),
            Loc::Packed(x) => x.word() | PACKED_BIT,
        }
    }

    fn from_word(w: u64) -> Option<Loc> {
        match w {
            EMPTY => None,
            w if w & PACKED_BIT != 0 => Packed::from_word(w & !PACKED_BIT).map(Loc::Packed),
            w => Some(Loc::Raw(w as u32)),
        }
    }

    /// The raw cluster, if it is one.
    pub(crate) fn raw(self) -> Option<u32> {
        match self {
            Loc::Raw(p) => Some(p),
            Loc::Packed(_) => None,
        }
    }

    /// Bytes it takes on the device.
    pub(crate) fn stored(self, cluster_bytes: u64) -> u64 {
        match self {
            Loc::Raw(_) => cluster_bytes,
            Loc::Packed(x) => u64::from(x.blocks) * PACK_BLOCK,
        }
    }
}

/// Virtual -> physical cluster map of one thin volume: pages of atomics,
/// allocated on first use, under a directory whose parts are also made on
/// first use, so lookups take no lock, an empty volume of any size costs a
/// few KiB, and a volume grows without its map being moved.
pub(crate) struct ClusterMap {
    dirs: Box<[OnceLock<Box<[Page]>>]>,
}

type Page = OnceLock<Box<[AtomicU64]>>;

/// Pages per directory part; parts cover [`MAX_VOLUME_CLUSTERS`].
const DIR_PAGES: u64 = 1024;

impl ClusterMap {
    pub(crate) fn new() -> ClusterMap {
        let n = MAX_VOLUME_CLUSTERS.div_ceil(MAP_PAGE * DIR_PAGES) as usize;
        ClusterMap {
            dirs: (0..n).map(|_| OnceLock::new()).collect(),
        }
    }

    fn page(&self, vc: u64) -> Option<&Page> {
        let page = vc / MAP_PAGE;
        let dir = self.dirs.get((page / DIR_PAGES) as usize)?.get()?;
        dir.get((page % DIR_PAGES) as usize)
    }

    pub(crate) fn get(&self, vc: u64) -> Option<Loc> {
        let page = self.page(vc)?.get()?;
        Loc::from_word(page[(vc % MAP_PAGE) as usize].load(Ordering::Acquire))
    }

    pub(crate) fn set(&self, vc: u64, at: Loc) {
        self.store(vc, at.word());
    }

    pub(crate) fn clear(&self, vc: u64) {
        if self.page(vc).and_then(|p| p.get()).is_some() {
            self.store(vc, EMPTY);
        }
    }

    fn store(&self, vc: u64, w: u64) {
        let page = vc / MAP_PAGE;
        let dir = self.dirs[(page / DIR_PAGES) as usize]
            .get_or_init(|| (0..DIR_PAGES).map(|_| OnceLock::new()).collect());
        let page = dir[(page % DIR_PAGES) as usize]
            .get_or_init(|| (0..MAP_PAGE).map(|_| AtomicU64::new(EMPTY)).collect());
        page[(vc % MAP_PAGE) as usize].store(w, Ordering::Release);
    }

    /// Allocated (virtual, where) pairs with `lo <= virtual < hi`.
    pub(crate) fn mapped(&self, lo: u64, hi: u64) -> Vec<(u64, Loc)> {
        let mut out = Vec::new();
        let mut vc = lo;
        while vc < hi {
            let page_end = ((vc / MAP_PAGE + 1) * MAP_PAGE).min(hi);
            match self.page(vc).and_then(|p| p.get()) {
                None => {}
                Some(page) => {
                    for v in vc..page_end {
                        let w = page[(v % MAP_PAGE) as usize].load(Ordering::Acquire);
                        if let Some(at) = Loc::from_word(w) {
                            out.push((v, at));
                        }
                    }
                }
            }
            vc = page_end;
        }
        out
    }
}

/// One thin volume's (or snapshot's) in-memory state, shared by its
/// handles and the pool.
pub(crate) struct VolInner {
    pub(crate) slot: u16,
    /// As created; the size is `size_bytes` (it grows), the parent is
    /// `parent` and hidden is `hidden` (both change).
    pub(crate) meta: VolMeta,
    /// The snapshot unwritten clusters are read from. Set before the map
    /// entries it replaces are cleared, so a lock-free reader that misses in
    /// the map finds them there.
    pub(crate) parent: ArcSwapOption<VolInner>,
    pub(crate) hidden: AtomicBool,
    size_bytes: AtomicU64,
    cluster_bytes: u64,
    pub(crate) map: ClusterMap,
    pub(crate) locks: Box<[RwLock<()>]>,
    pub(crate) deleted: AtomicBool,
    /// Committed allocated clusters (raw or compressed).
    pub(crate) allocated: AtomicU64,
    /// What they take on the device, in bytes.
    pub(crate) stored: AtomicU64,
}

impl VolInner {
    pub(crate) fn new(slot: u16, meta: VolMeta, cluster_bytes: u64) -> VolInner {
        VolInner {
            slot,
            size_bytes: AtomicU64::new(meta.size_bytes),
            cluster_bytes,
            map: ClusterMap::new(),
            locks: (0..LOCK_SHARDS).map(|_| RwLock::new(())).collect(),
            deleted: AtomicBool::new(false),
            allocated: AtomicU64::new(0),
            stored: AtomicU64::new(0),
            parent: ArcSwapOption::empty(),
            hidden: AtomicBool::new(meta.hidden),
            meta,
        }
    }

    /// The virtual size now.
    pub(crate) fn size(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    /// Clusters the virtual size spans now.
    pub(crate) fn vclusters(&self) -> u64 {
        self.size().div_ceil(self.cluster_bytes)
    }

    /// Sets the virtual size (the caller validated it and checkpoints it).
    pub(crate) fn set_size(&self, size_bytes: u64) {
        self.size_bytes.store(size_bytes, Ordering::Release);
    }

    /// What the volume table records of it now.
    pub(crate) fn meta_now(&self) -> VolMeta {
        VolMeta {
            size_bytes: self.size(),
            hidden: self.hidden.load(Ordering::Acquire),
            parent: self.parent.load().as_ref().map(|p| p.slot),
            ..self.meta.clone()
        }
    }

    pub(crate) fn has_parent(&self) -> bool {
        self.parent.load().is_some()
    }

    /// Counts a chunk in (`sign` 1) or out (-1) of its own.
    pub(crate) fn count(&self, at: Loc, sign: i64) {
        let stored = at.stored(self.cluster_bytes);
        if sign > 0 {
            self.allocated.fetch_add(1, Ordering::Relaxed);
            self.stored.fetch_add(stored, Ordering::Relaxed);
        } else {
            self.allocated.fetch_sub(1, Ordering::Relaxed);
            self.stored.fetch_sub(stored, Ordering::Relaxed);
        }
    }

    /// Where an ancestor holds `vc`: the nearest one that maps it.
    /// Ancestors are snapshots, whose clusters never change (compaction
    /// moves a chunk only with every reader's lock held) and are freed
    /// only when no descendant can read them.
    ///
    /// A snapshot deleted with one child is merged into it unlocked for the
    /// child's descendants: its clusters are copied into the child's map,
    /// then the child's parent changes. A walk that read the child's map
    /// before the copy and its parent after would miss them both, so each
    /// step reads the parent before and after the map, and starts again
    /// when it changed.
    pub(crate) fn inherited(&self, vc: u64) -> Option<Loc> {
        'walk: loop {
            let mut at = self.parent.load_full();
            while let Some(a) = at {
                let before = a.parent.load_full();
                if let Some(p) = a.map.get(vc) {
                    return Some(p);
                }
                let after = a.parent.load_full();
                if !same_parent(&before, &after) {
                    continue 'walk;
                }
                at = after;
            }
            return None;
        }
    }

    /// Where `vc` reads from: this volume's own cluster, else an ancestor's.
    /// Its own map and parent change together twice: a snapshot sets the
    /// parent, then empties the map; a merge of the parent fills the map,
    /// then changes the parent. The parent is read on both sides of the
    /// map, and a change between starts again.
    pub(crate) fn resolve(&self, vc: u64) -> Option<Loc> {
        loop {
            let before = self.parent.load_full();
            if let Some(p) = self.map.get(vc) {
                return Some(p);
            }
            if same_parent(&before, &self.parent.load_full()) {
                return self.inherited(vc);
            }
        }
    }

    /// The clusters in `first..end` that read as data: mapped here or in an
    /// ancestor, sorted. Read without locks like [`VolInner::resolve`]:
    /// each map between two reads of its parent, and a change between
    /// starts the walk again (a merge moving mappings down the chain while
    /// it ran would otherwise hide them from both reads).
    pub(crate) fn mapped_in_chain(&self, first: u64, end: u64) -> Vec<u64> {
        'walk: loop {
            let mut out: Vec<u64> = Vec::new();
            let mut ancestor: Option<Arc<VolInner>> = None;
            loop {
                let node: &VolInner = ancestor.as_deref().unwrap_or(self);
                let before = node.parent.load_full();
                out.extend(node.map.mapped(first, end).into_iter().map(|(vc, _)| vc));
                let after = node.parent.load_full();
                if !same_parent(&before, &after) {
                    continue 'walk;
                }
                match after {
                    Some(a) => ancestor = Some(a),
                    None => break,
                }
            }
            out.sort_unstable();
            out.dedup();
            return out;
        }
    }

    /// Whether `vc` is unmapped here and in every ancestor, checked without
    /// a lock: no parent before and after an own-map miss (see
    /// [`VolInner::resolve`]).
    pub(crate) fn surely_unmapped(&self, vc: u64) -> bool {
        !self.has_parent() && self.map.get(vc).is_none() && !self.has_parent()
    }

    pub(crate) fn lock(&self, vc: u64) -> &RwLock<()> {
        &self.locks[vc as usize % LOCK_SHARDS]
    }

    pub(crate) fn check_live(&self) -> Result<(), BlockError> {
        if self.deleted.load(Ordering::Acquire) {
            Err(io_err(format!(
                "thin volume {} was deleted",
                self.meta.name
            )))
        } else {
            Ok(())
        }
    }
}

/// The committed metadata: exactly what checkpoint plus journal on the
/// device say. Changed only by the task holding the journal lock.
pub(crate) struct State {
    pub(crate) owner: Vec<u64>,
    pub(crate) slots: Vec<Option<Arc<VolInner>>>,
    pub(crate) names: HashMap<String, u16>,
    pub(crate) allocated: u64,
    /// Blocks of pack clusters that committed chunks hold.
    pub(crate) pack: Packer,
    pub(crate) pack_blocks: u64,
}

impl State {
    pub(crate) fn empty(clusters: u64, pack_blocks: u64) -> State {
        State {
            owner: vec![0; clusters as usize],
            slots: vec![None; MAX_VOLUMES],
            names: HashMap::new(),
            allocated: 0,
            pack: Packer::new(pack_blocks.max(1)),
            pack_blocks,
        }
    }

    /// Takes committed chunk `at` out of the owner bookkeeping (its pack
    /// cluster's, or its raw cluster's owner entry); the volume's map and
    /// counts are the caller's.
    pub(crate) fn release(&mut self, at: Loc) {
        match at {
            Loc::Raw(p) => {
                self.owner[p as usize] = 0;
                self.allocated -= 1;
            }
            Loc::Packed(x) => {
                if let Some(p) = self.pack.put(x) {
                    self.owner[p as usize] = 0;
                    self.allocated -= 1;
                }
            }
        }
    }

    /// Enters committed chunk `at` for volume `slot`'s `vc`, or says why it
    /// cannot be (a place taken, outside the pool).
    fn claim(&mut self, slot: u16, vc: u64, at: Loc) -> Result<(), String> {
        match at {
            Loc::Raw(p) => {
                let owner = self.owner.get(p as usize).copied();
                if owner != Some(0) {
                    return Err(format!("cluster {p} has owner {owner:?}"));
                }
                self.owner[p as usize] = owner_code(slot, vc);
                self.allocated += 1;
            }
            Loc::Packed(x) => {
                let per = self.pack_blocks;
                let p = x.cluster(per.max(1));
                let owner = self.owner.get(p as usize).copied();
                let fits = per > 0 && x.blocks > 0 && x.offset(per) + u64::from(x.blocks) <= per;
                let free = (x.first..x.first + u64::from(x.blocks)).all(|b| !self.pack.is_taken(b));
                if !fits || !free || !matches!(owner, Some(0) | Some(PACK_OWNER)) {
                    return Err(format!(
                        "chunk {x:?}: pack cluster owner {owner:?}, fits {fits}, free {free}"
                    ));
                }
                if owner == Some(0) {
                    self.owner[p as usize] = PACK_OWNER;
                    self.allocated += 1;
                }
                self.pack.mark(x);
            }
        }
        Ok(())
    }

    pub(crate) fn add_volume(&mut self, vol: Arc<VolInner>) {
        if !vol.hidden.load(Ordering::Acquire) {
            self.names.insert(vol.meta.name.clone(), vol.slot);
        }
        let slot = usize::from(vol.slot);
        self.slots[slot] = Some(vol);
    }

    /// Links each volume to the parent its entry names: a snapshot in
    /// use, no chain longer than the table (so no cycle).
    pub(crate) fn link_parents(&self) -> Result<(), String> {
        for v in self.slots.iter().flatten() {
            let Some(ps) = v.meta.parent else { continue };
            let p = self.vol(ps)?;
            if !p.meta.snapshot {
                return Err(format!(
                    "volume {:?} names slot {ps} ({:?}) as its parent, which is not a snapshot",
                    v.meta.name, p.meta.name
                ));
            }
            v.parent.store(Some(p.clone()));
        }
        for v in self.slots.iter().flatten() {
            let mut depth = 0;
            let mut at = v.parent.load_full();
            while let Some(a) = at {
                depth += 1;
                if depth > MAX_VOLUMES {
                    return Err(format!(
                        "volume {:?}: its parents form a cycle",
                        v.meta.name
                    ));
                }
                at = a.parent.load_full();
            }
        }
        Ok(())
    }

    /// Volumes whose parent is `slot`.
    pub(crate) fn children(&self, slot: u16) -> Vec<Arc<VolInner>> {
        self.slots
            .iter()
            .flatten()
            .filter(|v| v.parent.load().as_ref().is_some_and(|p| p.slot == slot))
            .cloned()
            .collect()
    }

    pub(crate) fn vol(&self, slot: u16) -> Result<&Arc<VolInner>, String> {
        self.slots
            .get(usize::from(slot))
            .and_then(|s| s.as_ref())
            .ok_or_else(|| format!("record names volume slot {slot}, which is not in use"))
    }

    /// Applies one record; returns the place it freed.
    pub(crate) fn apply(&mut self, r: &Record) -> Result<Option<Loc>, String> {
        let (slot, vc, new, gone) = match *r {
            Record::Map { slot, vc, p } => (slot, vc, Some(Loc::Raw(p)), None),
            Record::PMap { slot, vc, at } => (slot, vc, Some(Loc::Packed(at)), None),
            Record::Unmap { slot, vc, p } => (slot, vc, None, Some(Loc::Raw(p))),
            Record::PUnmap { slot, vc, at } => (slot, vc, None, Some(Loc::Packed(at))),
        };
        let vol = self.vol(slot)?.clone();
        let old = vol.map.get(vc);
        if let Some(new) = new {
            // A raw cluster is written in place, never remapped to another.
            if vc >= vol.vclusters() || matches!((old, new), (Some(Loc::Raw(_)), Loc::Raw(_))) {
                return Err(format!(
                    "{r:?}: volume has {} clusters, maps it to {old:?}",
                    vol.vclusters()
                ));
            }
            self.claim(slot, vc, new)
                .map_err(|e| format!("{r:?}: {e}"))?;
            vol.map.set(vc, new);
            vol.count(new, 1);
            if let Some(old) = old {
                vol.count(old, -1);
                self.release(old);
            }
            return Ok(old);
        }
        let gone = gone.expect("an unmap names its place");
        let owned = match gone {
            Loc::Raw(p) => self.owner.get(p as usize).copied() == Some(owner_code(slot, vc)),
            Loc::Packed(_) => true,
        };
        if old != Some(gone) || !owned {
            return Err(format!("{r:?}: volume maps it to {old:?}"));
        }
        vol.map.clear(vc);
        vol.count(gone, -1);
        self.release(gone);
        Ok(Some(gone))
    }
}

/// Free-cluster bitmap for allocation: a set bit is a cluster that is
/// allocated, being allocated, or freed but not yet durably so.
pub(crate) struct Alloc {
    pub(crate) bits: Vec<u64>,
    pub(crate) total: u64,
    pub(crate) used: u64,
    pub(crate) hint: usize,
}

impl Alloc {
    pub(crate) fn new(total: u64) -> Alloc {
        let words = total.div_ceil(64).max(1) as usize;
        let mut bits = vec![0u64; words];
        // Bits past the end read as taken, so the scan needs no bound check.
        for p in total..words as u64 * 64 {
            bits[(p / 64) as usize] |= 1 << (p % 64);
        }
        Alloc {
            bits,
            total,
            used: 0,
            hint: 0,
        }
    }

    pub(crate) fn mark(&mut self, p: u32) {
        self.bits[p as usize / 64] |= 1 << (p % 64);
        self.used += 1;
    }

    /// Takes `n` free clusters, or none if fewer are free. Scans on from the
    /// last allocation, so a sequential writer gets contiguous clusters.
    pub(crate) fn take(&mut self, n: usize) -> Option<Vec<u32>> {
        if self.total - self.used < n as u64 {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        let mut w = self.hint;
        loop {
            let mut free = !self.bits[w];
            while free != 0 && out.len() < n {
                let b = free.trailing_zeros();
                free &= free - 1;
                self.bits[w] |= 1 << b;
                out.push((w * 64) as u32 + b);
            }
            if out.len() == n {
                break;
            }
            w = (w + 1) % self.bits.len();
        }
        self.hint = w;
        self.used += n as u64;
        Some(out)
    }

    /// Makes clusters `total..new_total` (a new extent) allocatable.
    pub(crate) fn grow(&mut self, new_total: u64) {
        let words = new_total.div_ceil(64).max(1) as usize;
        self.bits.resize(words, u64::MAX);
        for p in self.total..words as u64 * 64 {
            let bit = 1 << (p % 64);
            if p < new_total {
                self.bits[(p / 64) as usize] &= !bit;
            } else {
                self.bits[(p / 64) as usize] |= bit;
            }
        }
        self.total = new_total;
    }

    pub(crate) fn put(&mut self, p: u32) {
        let (w, b) = (p as usize / 64, p % 64);
        debug_assert!(self.bits[w] & (1 << b) != 0, "cluster {p} freed twice");
        self.bits[w] &= !(1 << b);
        self.used -= 1;
    }
}

pub(crate) struct Pending {
    pub(crate) records: Vec<Record>,
    /// The batch that records queued now will be committed in.
    pub(crate) open: u64,
}

/// Journal position; its async mutex serialises commits and checkpoints.
pub(crate) struct Journal {
    pub(crate) epoch: u64,
    pub(crate) next_block: u64,
    /// Last batch that is durable.
    pub(crate) durable: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) commits: AtomicU64,
    pub(crate) records: AtomicU64,
    pub(crate) journal_blocks: AtomicU64,
    pub(crate) checkpoints: AtomicU64,
}

pub(crate) struct PoolInner {
    pub(crate) dev: Arc<dyn BlockDevice>,
    pub(crate) dev_bs: u64,
    pub(crate) geom: PoolGeom,
    /// The extents after the base (pool growth), in cluster order.
    pub(crate) ext: ArcSwap<Vec<Extent>>,
    pub(crate) state: Mutex<State>,
    pub(crate) alloc: Mutex<Alloc>,
    pub(crate) pending: Mutex<Pending>,
    pub(crate) journal: tokio::sync::Mutex<Journal>,
    pub(crate) poisoned: AtomicBool,
    pub(crate) counters: Counters,
    /// Blocks of pack clusters taken: committed, being written, or freed
    /// but not yet durably (a superset of `State::pack`).
    pub(crate) packer: Mutex<Packer>,
}

/// Whether two reads of a parent found the same volume (or none).
fn same_parent(a: &Option<Arc<VolInner>>, b: &Option<Arc<VolInner>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}
