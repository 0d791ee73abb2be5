//! `pool check`: the metadata cross-checked in memory (no cluster in two
//! maps, no cluster taken that no map holds, the volume tree sound) and
//! against what the device says (checkpoint plus journal, read afresh).

use std::sync::atomic::Ordering;

use super::extent::ExtentHeader;
use super::format::owner_code;
use super::pack::PACK_OWNER;
use super::state::{Loc, State};
use super::{ThinError, ThinPool};

/// What a passing check saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolCheck {
    pub volumes: usize,
    pub snapshots: usize,
    pub hidden_snapshots: usize,
    pub allocated_clusters: u64,
    pub total_clusters: u64,
    /// Journal blocks replayed from the device to compare.
    pub journal_blocks: u64,
}

/// The tree: names index the visible volumes; parents exist and are
/// snapshots; a hidden snapshot has two or more children (with fewer it
/// would hold clusters nothing reads: a leak).
fn check_state(st: &State) -> Result<(), String> {
    for (slot, vol) in st.slots.iter().enumerate() {
        let Some(vol) = vol else { continue };
        let hidden = vol.hidden.load(Ordering::Acquire);
        let indexed = st.names.get(&vol.meta.name) == Some(&(slot as u16));
        if indexed == hidden {
            return Err(format!(
                "volume {} (hidden {hidden}) is {}in the name index",
                vol.meta.name,
                if indexed { "" } else { "not " }
            ));
        }
        if let Some(p) = vol.parent.load_full() {
            let same = st.slots[usize::from(p.slot)]
                .as_ref()
                .is_some_and(|q| std::sync::Arc::ptr_eq(q, &p));
            if !same || !p.meta.snapshot {
                return Err(format!(
                    "volume {}: its parent {} is not a snapshot of this pool",
                    vol.meta.name, p.meta.name
                ));
            }
        }
        if hidden {
            let n = st.children(slot as u16).len();
            if n < 2 {
                return Err(format!(
                    "deleted snapshot {} still holds {} clusters with {n} clone(s) reading it \
                     (leak)",
                    vol.meta.name,
                    vol.allocated.load(Ordering::Relaxed)
                ));
            }
        }
    }
    if st.names.len()
        != st
            .slots
            .iter()
            .flatten()
            .filter(|v| !v.hidden.load(Ordering::Acquire))
            .count()
    {
        return Err("the name index holds names of no volume".into());
    }
    Ok(())
}

impl ThinPool {
    /// Cross-checks the in-memory metadata: the volume tree, every map
    /// entry owned by its volume in the owner table and the other way
    /// round, no physical cluster in two maps, counts and the free bitmap
    /// agreeing. Call it with no I/O in flight (a write allocating a
    /// cluster holds one the bitmap counts).
    pub fn check(&self) -> Result<(), String> {
        let st = self.inner.state.lock();
        let a = self.inner.alloc.lock();
        check_state(&st)?;
        let mut seen = vec![false; st.owner.len()];
        let mut total = 0u64;
        let mut blocks = std::collections::HashSet::new();
        let mut packs: std::collections::HashMap<u32, u32> = Default::default();
        let cb = self.inner.geom.cluster_bytes;
        let per = self.inner.geom.pack_blocks;
        let packer = self.inner.packer.lock();
        for (slot, vol) in st.slots.iter().enumerate() {
            let Some(vol) = vol else { continue };
            let mapped = vol.map.mapped(0, vol.vclusters());
            let mut stored = 0;
            for &(vc, at) in &mapped {
                stored += at.stored(cb);
                let x = match at {
                    Loc::Raw(p) => {
                        if std::mem::replace(&mut seen[p as usize], true) {
                            return Err(format!("cluster {p} is in two maps"));
                        }
                        if st.owner[p as usize] != owner_code(slot as u16, vc) {
                            return Err(format!(
                                "volume {} maps {vc} to {p}, whose owner entry is {:#x}",
                                vol.meta.name, st.owner[p as usize]
                            ));
                        }
                        continue;
                    }
                    Loc::Packed(x) => x,
                };
                for b in x.first..x.first + u64::from(x.blocks) {
                    if !blocks.insert(b) || !st.pack.is_taken(b) || !packer.is_taken(b) {
                        return Err(format!(
                            "volume {} maps {vc} to {x:?}: block {b} is in two chunks or \
                             not taken",
                            vol.meta.name
                        ));
                    }
                }
                *packs.entry(x.cluster(per)).or_default() += x.blocks;
            }
            let n = mapped.len() as u64;
            if vol.allocated.load(Ordering::Relaxed) != n
                || vol.stored.load(Ordering::Relaxed) != stored
            {
                return Err(format!(
                    "volume {} counts {} clusters and {} bytes stored but maps {n} and {stored}",
                    vol.meta.name,
                    vol.allocated.load(Ordering::Relaxed),
                    vol.stored.load(Ordering::Relaxed)
                ));
            }
            total += mapped.iter().filter(|m| m.1.raw().is_some()).count() as u64;
        }
        for (&p, &used) in &packs {
            if std::mem::replace(&mut seen[p as usize], true)
                || st.owner[p as usize] != PACK_OWNER
                || st.pack.used(p) != Some(used)
                || packer.used(p) != Some(used)
            {
                return Err(format!(
                    "pack cluster {p}: chunks hold {used} blocks, the pool counts {:?} (being \
                     written included: {:?}), owner entry {:#x}",
                    st.pack.used(p),
                    packer.used(p),
                    st.owner[p as usize]
                ));
            }
            total += 1;
        }
        if packer.fill().len() != packs.len() {
            return Err(format!(
                "{} pack clusters hold blocks, but chunks lie in {}",
                packer.fill().len(),
                packs.len()
            ));
        }
        for (p, &code) in st.owner.iter().enumerate() {
            if (code != 0) != seen[p] {
                return Err(format!("cluster {p}: owner entry {code:#x} but in no map"));
            }
            let taken = a.bits[p / 64] & (1 << (p % 64)) != 0;
            if taken != seen[p] {
                return Err(format!(
                    "cluster {p}: free bitmap says taken = {taken}, maps say {}",
                    seen[p]
                ));
            }
        }
        if total != st.allocated || a.used != total {
            return Err(format!(
                "maps hold {total} clusters, pool counts {}, bitmap {}",
                st.allocated, a.used
            ));
        }
        Ok(())
    }

    /// `check`, then the metadata on the device read afresh (newest
    /// checkpoint plus journal) compared with memory: volume table, tree
    /// and owner table. Commits wait while it reads (the journal lock).
    pub async fn check_with_device(&self) -> Result<PoolCheck, ThinError> {
        let p = &self.inner;
        let j = p.journal.lock().await;
        self.check().map_err(ThinError::Corrupt)?;
        let ext = p.ext.load_full();
        let found: Vec<_> = ext
            .iter()
            .map(|e| {
                let h = ExtentHeader {
                    pool: p.geom.uuid,
                    uuid: e.uuid,
                    cluster_bytes: p.geom.cluster_bytes,
                    clusters: e.clusters,
                };
                (h, e.dev.clone())
            })
            .collect();
        let (epoch, mut disk, disk_ext) = p.load_checkpoint(&found).await?;
        let uuids = |x: &[super::extent::Extent]| x.iter().map(|e| e.uuid).collect::<Vec<_>>();
        if uuids(&disk_ext) != uuids(&ext) {
            return Err(ThinError::Corrupt(
                "the device's checkpoint names other extents than memory holds".into(),
            ));
        }
        if epoch != j.epoch {
            return Err(ThinError::Corrupt(format!(
                "the newest valid checkpoint on the device is epoch {epoch}, memory is at {}",
                j.epoch
            )));
        }
        let blocks = p.replay(epoch, &mut disk).await?;
        if blocks != j.next_block {
            return Err(ThinError::Corrupt(format!(
                "the device's journal replays {blocks} blocks, memory wrote {}",
                j.next_block
            )));
        }
        let st = p.state.lock();
        if st.owner != disk.owner {
            let first = st.owner.iter().zip(&disk.owner).position(|(a, b)| a != b);
            return Err(ThinError::Corrupt(format!(
                "owner table differs from the device's from cluster {first:?}"
            )));
        }
        for (slot, (m, d)) in st.slots.iter().zip(&disk.slots).enumerate() {
            let (m, d) = (
                m.as_ref().map(|v| v.meta_now()),
                d.as_ref().map(|v| v.meta_now()),
            );
            if m != d {
                return Err(ThinError::Corrupt(format!(
                    "volume slot {slot}: memory has {m:?}, the device {d:?}"
                )));
            }
        }
        for (m, d) in st.slots.iter().zip(&disk.slots) {
            if let (Some(m), Some(d)) = (m, d)
                && m.map.mapped(0, m.vclusters()) != d.map.mapped(0, d.vclusters())
            {
                return Err(ThinError::Corrupt(format!(
                    "volume {}: its map in memory differs from the device's",
                    m.meta.name
                )));
            }
        }
        let u = self.usage_of(&st);
        Ok(PoolCheck {
            volumes: u.volumes,
            snapshots: u.snapshots,
            hidden_snapshots: u.hidden_snapshots,
            allocated_clusters: st.allocated,
            total_clusters: st.owner.len() as u64,
            journal_blocks: blocks,
        })
    }
}
