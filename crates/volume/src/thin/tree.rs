//! Snapshots and clones: the pool's volumes form a tree.
//!
//! A snapshot takes the clusters its volume holds (their owner entries move
//! to the snapshot's slot; no data moves) and becomes the volume's parent:
//! the volume starts with an empty map and reads what it has not written
//! since from the snapshot, and from the snapshot's parent, and so on. The
//! first write to such a cluster copies it (copy-on-write, one cluster).
//! A clone is a new volume whose parent is a snapshot. So every physical
//! cluster still has exactly one owner (the owner table needs no reference
//! counts, and `check` proves no cluster is in two maps); sharing is the
//! tree itself.
//!
//! Deleting a snapshot with one child merges it into the child (the
//! child's own clusters win, the others move to it, the rest are freed);
//! with none, frees its clusters; with two or more, hides it (no name, not
//! listed, writes and reads through its handles fail) until a later delete
//! leaves it one child or none, when it is merged or freed in turn. Every
//! such change is one checkpoint, so a crash leaves it done or not done.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::RwLockWriteGuard;

use super::format::{VolMeta, owner_code, validate_name};
use super::state::{Loc, State, VolInner};
use super::{MAX_VOLUMES, ThinError, ThinPool, ThinVolume};
use crate::superblock::new_uuid;

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Waits out the I/O on `vols` and holds new I/O off: every shard lock of
/// each, volumes in slot order (as every multi-volume change takes them).
async fn quiesce(vols: &[Arc<VolInner>]) -> Vec<RwLockWriteGuard<'_, ()>> {
    let mut order: Vec<&Arc<VolInner>> = vols.iter().collect();
    order.sort_by_key(|v| v.slot);
    order.dedup_by_key(|v| v.slot);
    let mut guards = Vec::with_capacity(order.len() * super::LOCK_SHARDS);
    for v in order {
        for l in v.locks.iter() {
            guards.push(l.write().await);
        }
    }
    guards
}

/// Whether `vol` is still the volume in its slot (a delete that raced may
/// have removed it, and a create reused the slot).
fn current(st: &State, vol: &Arc<VolInner>) -> bool {
    in_slot(st, vol) && !vol.deleted.load(Ordering::Acquire)
}

fn is_ancestor(vol: &VolInner, of: &Arc<VolInner>) -> bool {
    let mut at = vol.parent.load_full();
    while let Some(a) = at {
        if Arc::ptr_eq(&a, of) {
            return true;
        }
        at = a.parent.load_full();
    }
    false
}

/// Enters a new volume (or snapshot) in the first free slot: its name must
/// be free. Nothing is durable until the caller's checkpoint.
pub(crate) fn new_entry(
    st: &mut State,
    name: &str,
    (size_bytes, block_size): (u64, u32),
    snapshot: bool,
    parent: Option<Arc<VolInner>>,
    cluster_bytes: u64,
) -> Result<Arc<VolInner>, ThinError> {
    if st.names.contains_key(name) {
        return Err(ThinError::NameTaken(name.to_string()));
    }
    let slot = st
        .slots
        .iter()
        .position(|s| s.is_none())
        .ok_or(ThinError::TooManyVolumes(MAX_VOLUMES))?;
    let meta = VolMeta {
        name: name.to_string(),
        uuid: new_uuid(),
        size_bytes,
        block_size,
        snapshot,
        hidden: false,
        parent: None,
        created: now_secs(),
    };
    let v = Arc::new(VolInner::new(slot as u16, meta, cluster_bytes));
    v.parent.store(parent);
    st.add_volume(v.clone());
    Ok(v)
}

/// Whether `vol` still holds its slot (deleted or not).
fn in_slot(st: &State, vol: &Arc<VolInner>) -> bool {
    st.slots[usize::from(vol.slot)]
        .as_ref()
        .is_some_and(|v| Arc::ptr_eq(v, vol))
}

/// Moves every cluster of `from` to `to` (owner entries and maps; a
/// compressed chunk's block codes follow the maps at the checkpoint).
fn move_clusters(st: &mut State, from: &VolInner, to: &VolInner) {
    for (vc, at) in from.map.mapped(0, from.vclusters()) {
        to.map.set(vc, at);
        if let Loc::Raw(p) = at {
            st.owner[p as usize] = owner_code(to.slot, vc);
        }
    }
    let n = from.allocated.swap(0, Ordering::Relaxed);
    to.allocated.fetch_add(n, Ordering::Relaxed);
    let n = from.stored.swap(0, Ordering::Relaxed);
    to.stored.fetch_add(n, Ordering::Relaxed);
}

/// Takes cluster `vc` (at `at`) out of `vol`'s map and the owner
/// bookkeeping; the place is freed once the change is durable.
fn drop_one(st: &mut State, vol: &VolInner, vc: u64, at: Loc) {
    vol.map.clear(vc);
    vol.count(at, -1);
    st.release(at);
}

/// Takes every cluster of `vol` out of the maps; returns them (to be
/// freed once the change is durable).
fn drop_clusters(st: &mut State, vol: &VolInner) -> Vec<Loc> {
    let mapped = vol.map.mapped(0, vol.vclusters());
    for &(vc, at) in &mapped {
        drop_one(st, vol, vc, at);
    }
    mapped.into_iter().map(|(_, at)| at).collect()
}

impl ThinPool {
    fn lookup(&self, name: &str) -> Result<Arc<VolInner>, ThinError> {
        self.volume(name)
            .map(|v| v.vol)
            .ok_or_else(|| ThinError::NoSuchVolume(name.to_string()))
    }

    /// Takes a snapshot of each `(volume, snapshot name)` pair at one
    /// instant (a consistency group when there are several): I/O in flight
    /// on them finishes, new I/O waits, and one checkpoint records every
    /// snapshot. Instant otherwise: no data is copied. A refused request
    /// (a name taken, a volume that is a snapshot, too many volumes)
    /// changes nothing.
    pub async fn snapshot(&self, pairs: &[(&str, &str)]) -> Result<Vec<ThinVolume>, ThinError> {
        let p = &self.inner;
        if pairs.is_empty() {
            return Err(ThinError::Config("no volume to snapshot".into()));
        }
        let mut origins = Vec::with_capacity(pairs.len());
        for (i, &(vol, snap)) in pairs.iter().enumerate() {
            validate_name(snap)?;
            if pairs[..i].iter().any(|&(_, s)| s == snap) {
                return Err(ThinError::Config(format!(
                    "snapshot name {} is given twice",
                    super::shown(snap)
                )));
            }
            if pairs[..i].iter().any(|&(v, _)| v == vol) {
                return Err(ThinError::Config(format!(
                    "volume {} is listed twice; one snapshot per volume at a time",
                    super::shown(vol)
                )));
            }
            let o = self.lookup(vol)?;
            if o.meta.snapshot {
                return Err(ThinError::Config(format!(
                    "{} is a snapshot already; clone it to get a volume to snapshot",
                    super::shown(vol)
                )));
            }
            origins.push(o);
        }
        let guards = quiesce(&origins).await;
        let mut j = p.journal.lock().await;
        p.check_poisoned().map_err(|_| ThinError::Poisoned)?;
        let snaps = {
            let mut st = p.state.lock();
            for (o, &(vol, snap)) in origins.iter().zip(pairs) {
                if !current(&st, o) {
                    return Err(ThinError::NoSuchVolume(vol.to_string()));
                }
                if st.names.contains_key(snap) {
                    return Err(ThinError::NameTaken(snap.to_string()));
                }
            }
            let free = st.slots.iter().filter(|s| s.is_none()).count();
            if free < pairs.len() {
                return Err(ThinError::TooManyVolumes(MAX_VOLUMES));
            }
            let cb = p.geom.cluster_bytes;
            let mut snaps = Vec::with_capacity(pairs.len());
            for (o, &(_, snap)) in origins.iter().zip(pairs) {
                let size = (o.size(), o.meta.block_size);
                let s = new_entry(&mut st, snap, size, true, o.parent.load_full(), cb)?;
                // The snapshot's map first, then the parent, then the clear:
                // a reader that misses in the volume's map finds the parent.
                move_clusters(&mut st, o, &s);
                o.parent.store(Some(s.clone()));
                for (vc, _) in o.map.mapped(0, o.vclusters()) {
                    o.map.clear(vc);
                }
                snaps.push(s);
            }
            snaps
        };
        p.checkpoint(&mut j).await?;
        drop(j);
        drop(guards);
        for (s, &(vol, _)) in snaps.iter().zip(pairs) {
            tracing::info!(
                "thin pool {}: snapshot {} of volume {vol} ({} clusters)",
                self.uuid(),
                s.meta.name,
                s.allocated.load(Ordering::Relaxed)
            );
        }
        Ok(snaps
            .into_iter()
            .map(|vol| ThinVolume {
                pool: p.clone(),
                vol,
            })
            .collect())
    }

    /// Makes `name`, a writable volume that starts as snapshot `snapshot`
    /// holds it and shares its clusters until it writes them. Instant.
    pub async fn clone_volume(&self, snapshot: &str, name: &str) -> Result<ThinVolume, ThinError> {
        let p = &self.inner;
        validate_name(name)?;
        let s = self.lookup(snapshot)?;
        if !s.meta.snapshot {
            return Err(ThinError::Config(format!(
                "{} is not a snapshot; take a snapshot of it and clone that",
                super::shown(snapshot)
            )));
        }
        // Compaction moves a chunk with every reader's lock held and checks
        // that no reader came meanwhile; a clone is a new reader that would
        // read without any, so it waits for the snapshot's locks.
        let _quiet = quiesce(std::slice::from_ref(&s)).await;
        let mut j = p.journal.lock().await;
        p.check_poisoned().map_err(|_| ThinError::Poisoned)?;
        let vol = {
            let mut st = p.state.lock();
            if !current(&st, &s) {
                return Err(ThinError::NoSuchVolume(snapshot.to_string()));
            }
            let size = (s.size(), s.meta.block_size);
            new_entry(
                &mut st,
                name,
                size,
                false,
                Some(s.clone()),
                p.geom.cluster_bytes,
            )?
        };
        p.checkpoint(&mut j).await?;
        tracing::info!(
            "thin pool {}: cloned snapshot {snapshot} as volume {name}",
            self.uuid()
        );
        Ok(ThinVolume {
            pool: p.clone(),
            vol,
        })
    }

    /// Reverts volume `name` to snapshot `snapshot`, one of its own (taken
    /// of it, or of the volume it was cloned from): everything written
    /// since is dropped and the volume reads as the snapshot does. Its size
    /// stays (a tail past the snapshot's size reads as zeroes). The caller
    /// makes sure no host uses the volume.
    pub async fn revert_volume(&self, name: &str, snapshot: &str) -> Result<(), ThinError> {
        let p = &self.inner;
        let v = self.lookup(name)?;
        let s = self.lookup(snapshot)?;
        if v.meta.snapshot {
            return Err(ThinError::Config(format!(
                "{} is a snapshot, which never changes; revert the volume it was taken of",
                super::shown(name)
            )));
        }
        if !s.meta.snapshot || !is_ancestor(&v, &s) {
            return Err(ThinError::Config(format!(
                "{} is not a snapshot of volume {}; to start from it, clone it instead",
                super::shown(snapshot),
                super::shown(name)
            )));
        }
        let guards = quiesce(std::slice::from_ref(&v)).await;
        let mut j = p.journal.lock().await;
        p.check_poisoned().map_err(|_| ThinError::Poisoned)?;
        let freed = {
            let mut st = p.state.lock();
            if !current(&st, &v) || !current(&st, &s) || !is_ancestor(&v, &s) {
                return Err(ThinError::NoSuchVolume(format!("{name} or {snapshot}")));
            }
            v.parent.store(Some(s.clone()));
            drop_clusters(&mut st, &v)
        };
        p.checkpoint(&mut j).await?;
        p.free_places(&freed);
        drop(j);
        drop(guards);
        tracing::info!(
            "thin pool {}: reverted volume {name} to snapshot {snapshot}, freed {} clusters",
            self.uuid(),
            freed.len()
        );
        self.reclaim_hidden().await
    }

    /// Shrinks thin volume `name` to `size_bytes` when the end it cuts
    /// holds no data (no cluster of its own or of its snapshots there, the
    /// cluster cut in part included): otherwise refused, changing nothing.
    /// I/O in flight finishes first; later I/O past the new end is refused.
    pub async fn shrink_volume(&self, name: &str, size_bytes: u64) -> Result<(), ThinError> {
        let p = &self.inner;
        let vol = self.lookup(name)?;
        if vol.meta.snapshot {
            return Err(ThinError::Config(format!(
                "{} is a snapshot, which keeps the size it was taken at",
                super::shown(name)
            )));
        }
        super::format::validate_volume(
            name,
            size_bytes,
            vol.meta.block_size,
            p.geom.cluster_bytes,
            p.dev_bs as u32,
        )?;
        let guards = quiesce(std::slice::from_ref(&vol)).await;
        let mut j = p.journal.lock().await;
        p.check_poisoned().map_err(|_| ThinError::Poisoned)?;
        if !current(&p.state.lock(), &vol) {
            return Err(ThinError::NoSuchVolume(name.to_string()));
        }
        let old = vol.size();
        if size_bytes >= old {
            return Ok(());
        }
        let (lo, hi) = (size_bytes / p.geom.cluster_bytes, vol.vclusters());
        let mut used = vol.map.mapped(lo, hi).first().map(|m| m.0);
        let mut at = vol.parent.load_full();
        while let Some(a) = at {
            if let Some(&(vc, _)) = a.map.mapped(lo, hi).first() {
                used = Some(used.map_or(vc, |u: u64| u.min(vc)));
            }
            at = a.parent.load_full();
        }
        if let Some(cluster) = used {
            return Err(ThinError::ShrinkInUse {
                name: name.to_string(),
                size: old,
                asked: size_bytes,
                cluster,
            });
        }
        vol.set_size(size_bytes);
        if let Err(e) = p.checkpoint(&mut j).await {
            vol.set_size(old);
            return Err(e.into());
        }
        drop(j);
        drop(guards);
        tracing::info!(
            "thin pool {}: shrank volume {name} from {old} to {size_bytes} bytes",
            self.uuid()
        );
        Ok(())
    }

    /// Deletes thin volume or snapshot `name`. I/O in flight on it finishes
    /// first; later I/O through its handles fails. Clusters are freed once
    /// nothing reads them: a snapshot's go to its only child, or wait
    /// (hidden) while it has several.
    pub async fn delete_volume(&self, name: &str) -> Result<(), ThinError> {
        let vol = self.lookup(name)?;
        self.inner
            .check_poisoned()
            .map_err(|_| ThinError::Poisoned)?;
        vol.deleted.store(true, Ordering::Release);
        match self.remove(&vol).await {
            Ok(()) => {}
            Err(e) => {
                if !matches!(e, ThinError::NoSuchVolume(_)) {
                    vol.deleted.store(false, Ordering::Release);
                }
                return Err(e);
            }
        }
        self.reclaim_hidden().await
    }

    /// Removes `vol` (marked deleted) as `delete_volume` says.
    async fn remove(&self, vol: &Arc<VolInner>) -> Result<(), ThinError> {
        let p = &self.inner;
        let name = vol.meta.name.as_str();
        loop {
            let gone = || ThinError::NoSuchVolume(name.to_string());
            let (set, seen) = {
                let st = p.state.lock();
                if !in_slot(&st, vol) {
                    return Err(gone());
                }
                let children = st.children(vol.slot);
                let mut set = vec![vol.clone()];
                if children.len() == 1 {
                    set.push(children[0].clone());
                }
                (set, children)
            };
            let guards = quiesce(&set).await;
            let mut j = p.journal.lock().await;
            p.check_poisoned().map_err(|_| ThinError::Poisoned)?;
            let (freed, what) = {
                let mut st = p.state.lock();
                if !in_slot(&st, vol) {
                    return Err(gone());
                }
                let children = st.children(vol.slot);
                let same = children.len() == seen.len()
                    && children.iter().zip(&seen).all(|(a, b)| Arc::ptr_eq(a, b));
                if !same {
                    // A clone was made or a child deleted while this waited.
                    continue;
                }
                let hidden = vol.hidden.load(Ordering::Acquire);
                match children.as_slice() {
                    [] => {
                        let freed = drop_clusters(&mut st, vol);
                        if !hidden {
                            st.names.remove(name);
                        }
                        st.slots[usize::from(vol.slot)] = None;
                        (freed, "freed")
                    }
                    [child] => {
                        // The child's own clusters win; the rest move to it.
                        let mut freed = Vec::new();
                        for (vc, at) in vol.map.mapped(0, vol.vclusters()) {
                            if child.map.get(vc).is_some() || vc >= child.vclusters() {
                                drop_one(&mut st, vol, vc, at);
                                freed.push(at);
                            }
                        }
                        move_clusters(&mut st, vol, child);
                        child.parent.store(vol.parent.load_full());
                        if !hidden {
                            st.names.remove(name);
                        }
                        st.slots[usize::from(vol.slot)] = None;
                        (freed, "merged into its child")
                    }
                    _ => {
                        vol.hidden.store(true, Ordering::Release);
                        st.names.remove(name);
                        (Vec::new(), "hidden until its clones go")
                    }
                }
            };
            p.checkpoint(&mut j).await?;
            p.free_places(&freed);
            drop(j);
            drop(guards);
            tracing::info!(
                "thin pool {}: deleted {name} ({what}), freed {} clusters",
                self.uuid(),
                freed.len()
            );
            return Ok(());
        }
    }

    /// Removes hidden snapshots that no longer have two children.
    pub(crate) async fn reclaim_hidden(&self) -> Result<(), ThinError> {
        loop {
            let next = {
                let st = self.inner.state.lock();
                st.slots
                    .iter()
                    .flatten()
                    .find(|v| v.hidden.load(Ordering::Acquire) && st.children(v.slot).len() < 2)
                    .cloned()
            };
            let Some(v) = next else { return Ok(()) };
            v.deleted.store(true, Ordering::Release);
            self.remove(&v).await?;
        }
    }
}
