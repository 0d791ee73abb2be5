//! Re-add (md's `--re-add`): a failed member comes back (a drive that was
//! unreachable for a while, a member missing at assembly) and only the
//! regions written while it was away are resynced, not the whole member.
//!
//! What it missed is the intent bitmap: from the moment a member fails (or
//! is found missing at assembly) until every member is Active again, no bit
//! is cleared (`Inner::hold_bitmap`). Bits reach the surviving members' disks
//! (FUA) before the data write they cover, so after any crash the OR of the
//! survivors' bitmaps still covers every region written since the failure;
//! the superblocks record the generation at which the member failed with
//! the bitmap kept (`failed_at`). A separate per-member map would need its
//! own crash-safe updates on every degraded write; the held bitmap costs
//! nothing more than what a degraded write already does, at the price of
//! resyncing, on re-add, regions written while the bits were held for
//! another reason (a superset: safe).
//!
//! The re-added member is `Resyncing { checkpoint }`: it serves stripes
//! below the checkpoint and every stripe of a region outside the stale set;
//! reads of the rest reconstruct from the others and writes there skip it.
//! `Volume::rebuild` then resyncs the stale stripes in order, moving the
//! checkpoint (kept in the superblocks, so a restart resumes), and marks it
//! Active; once all members are, the bits are cleared again.

use std::sync::Arc;

use blockdev::{BlockDevice, BlockOp};

use super::fence::FencedMember;
use super::member_io::{abuf, abuf_from, dev_io, recycle, zbuf};
use super::{Inner, Members, StaleRegions, Volume, VolumeError};
use crate::intent::{BITMAP_BLOCK, IntentLog};
use crate::superblock::{MemberState, SB_BYTES, Superblock, uuid_string};

/// What [`Volume::re_add`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReAddReport {
    pub index: usize,
    /// The stale-region record was missing or unusable, so the member is
    /// rebuilt in full (state Rebuilding), as after `replace_member`.
    pub full_rebuild: bool,
    /// Why a full rebuild, when it is one.
    pub reason: Option<String>,
    /// Intent-bitmap regions to resync (0 with a full rebuild).
    pub stale_regions: u64,
    /// Stripes in them, the work `rebuild` has to do.
    pub stale_stripes: u64,
}

impl Volume {
    /// Puts a failed member's own device back at `index`. The device must
    /// carry this volume's superblock for position `index`, at a generation
    /// not newer than the volume's; otherwise it is refused and nothing
    /// changes. It then serves the regions not written while it was away,
    /// and [`Volume::rebuild`] (or [`Volume::start_rebuild`]) resyncs only
    /// the stale ones from the other members and marks it Active. When the
    /// record of what it missed is unusable (the volume runs without an
    /// intent bitmap, it failed before this build kept the bitmap, or the
    /// device is older than its failure), the device is taken for a full
    /// rebuild instead, which the report says.
    pub async fn re_add(
        &self,
        index: usize,
        dev: Arc<dyn BlockDevice>,
    ) -> Result<ReAddReport, VolumeError> {
        self.re_add_opts(index, dev, false).await
    }

    /// [`Volume::re_add`] of a member this owner never assembled (it was
    /// unreachable when the volume was taken over): the last owner may have
    /// written its superblock after this one's generation, so a device
    /// newer than the volume is not refused but rebuilt in full; an older
    /// one resyncs through the bitmap as usual.
    pub async fn re_add_distrusted(
        &self,
        index: usize,
        dev: Arc<dyn BlockDevice>,
    ) -> Result<ReAddReport, VolumeError> {
        self.re_add_opts(index, dev, true).await
    }

    async fn re_add_opts(
        &self,
        index: usize,
        dev: Arc<dyn BlockDevice>,
        newer_rebuilds: bool,
    ) -> Result<ReAddReport, VolumeError> {
        let inner = &self.inner;
        if inner.fence.is_set() {
            return Err(VolumeError::Fenced(inner.fence.error().to_string()));
        }
        // Through the fence from the start: a fence raised meanwhile stops
        // the writes below too.
        let dev = FencedMember::wrap(dev, index, &inner.fence);
        let n = inner.layout.members();
        let refuse = |reason: String| VolumeError::ReAddRefused { index, reason };
        if index >= n {
            return Err(refuse(format!("the volume has {n} members")));
        }
        if !inner.redundant() {
            return Err(refuse(format!(
                "{} has no redundancy to resync a member from",
                inner.layout.kind()
            )));
        }
        let _change = inner.membership.lock().await;
        let (state, failed_at, generation) = {
            let m = inner.members.read();
            (m.states[index], m.failed_at[index], m.generation)
        };
        if state != MemberState::Failed {
            return Err(refuse(format!(
                "member {index} is {state:?}, not failed; only a failed member can be re-added"
            )));
        }
        let g = dev.geometry();
        let need = inner.meta_bytes + inner.layout.member_blocks(index) * inner.bs;
        if g.size_bytes() < need || !(inner.bs as u32).is_multiple_of(g.block_size) {
            return Err(refuse(format!(
                "the device holds {} bytes in {} B blocks; member {index} needs {need} bytes in \
                 blocks that divide {}",
                g.size_bytes(),
                g.block_size,
                inner.bs
            )));
        }
        let (buf, r) = dev_io(&dev, BlockOp::Read, 0, SB_BYTES, abuf(SB_BYTES)).await;
        r.map_err(|source| VolumeError::MemberIo { index, source })?;
        let sb = Superblock::decode(&buf).map_err(|e| {
            refuse(format!(
                "the device has no readable superblock ({e}); use replace_member for a new device"
            ))
        })?;
        recycle(buf);
        if sb.uuid != inner.uuid {
            return Err(refuse(format!(
                "the device belongs to volume {}, not {}",
                uuid_string(&sb.uuid),
                uuid_string(&inner.uuid)
            )));
        }
        if usize::from(sb.position) != index {
            return Err(refuse(format!(
                "the device is member {} of this volume, not {index}",
                sb.position
            )));
        }
        if sb.generation > generation && !newer_rebuilds {
            return Err(refuse(format!(
                "the device is at generation {} but the volume at {generation}: it was written \
                 after this node last updated the volume (another owner?)",
                sb.generation
            )));
        }
        if sb.block_size as u64 != inner.bs
            || sb.strip_bytes != inner.strip_bytes
            || sb.meta_bytes != inner.meta_bytes
            || sb.region_stripes != inner.intent.region_stripes
            || sb.members.len() != n
        {
            return Err(refuse(
                "the device's superblock describes another shape of this volume".into(),
            ));
        }
        // The record of what it missed is usable when the bitmap has been
        // held since it failed and it is no older than that failure (one
        // generation behind: its last superblock write may have been the
        // one that failed).
        let why_full = if sb.generation > generation {
            Some(format!(
                "the device is at generation {} but the volume at {generation}: another owner \
                 wrote it after this one took the volume over",
                sb.generation
            ))
        } else if !inner.use_intent || !inner.intent.held() {
            Some("the volume keeps no intent bitmap of what the member missed".to_string())
        } else if failed_at == 0 {
            Some(
                "the superblocks do not say since when the bitmap was kept for this member \
                 (it failed under an older build, or without a bitmap)"
                    .to_string(),
            )
        } else if sb.generation + 1 < failed_at {
            Some(format!(
                "the device is at generation {} but the member failed at generation {failed_at}: \
                 it is an older copy that missed more than the bitmap records",
                sb.generation
            ))
        } else {
            None
        };
        // Its old journal records must never be replayed over newer data.
        inner.prepare_member(index, &dev).await?;
        if let Some(reason) = why_full {
            tracing::warn!("re-add of member {index}: {reason}; rebuilding it in full");
            inner
                .admit_member(index, dev, |m| {
                    m.states[index] = MemberState::Rebuilding { checkpoint: 0 };
                    m.failed_at[index] = 0;
                })
                .await?;
            inner.persist_superblock(true).await;
            return Ok(ReAddReport {
                index,
                full_rebuild: true,
                reason: Some(reason),
                stale_regions: 0,
                stale_stripes: 0,
            });
        }
        // Its stale set is read with the member swapped in: a writer sets
        // its bit before it takes its view of the members, so a write that
        // skipped the member (still Failed in its view) has its bit in it.
        let stale = inner
            .admit_member(index, dev, |m| {
                let stale = Arc::new(StaleRegions {
                    region_stripes: inner.intent.region_stripes,
                    bits: inner.intent.set_bits(),
                });
                m.states[index] = MemberState::Resyncing { checkpoint: 0 };
                m.stale = Some(merge_stale(m.stale.take(), stale.clone()));
                stale
            })
            .await?;
        let (regions, stripes) = inner.stale_count(&stale);
        inner.persist_superblock(true).await;
        if inner.fence.is_set() {
            return Err(VolumeError::Fenced(inner.fence.error().to_string()));
        }
        tracing::info!(
            "member {index} re-added: {regions} stale regions ({stripes} stripes) to resync"
        );
        Ok(ReAddReport {
            index,
            full_rebuild: false,
            reason: None,
            stale_regions: regions,
            stale_stripes: stripes,
        })
    }
}

/// Two members re-added at different times: either may be stale in either
/// set (a superset is safe).
fn merge_stale(old: Option<Arc<StaleRegions>>, new: Arc<StaleRegions>) -> Arc<StaleRegions> {
    match old {
        None => new,
        Some(o) => Arc::new(StaleRegions {
            region_stripes: new.region_stripes,
            bits: new
                .bits
                .iter()
                .zip(o.bits.iter().chain(std::iter::repeat(&0)))
                .map(|(a, b)| a | b)
                .collect(),
        }),
    }
}

impl Inner {
    /// Regions and stripes in a stale set.
    pub(crate) fn stale_count(&self, stale: &StaleRegions) -> (u64, u64) {
        let stripes = self.layout.stripes();
        let mut regions = 0;
        let mut count = 0;
        for r in 0..self.intent.regions {
            if stale.stale(r * stale.region_stripes) {
                regions += 1;
                let first = r * stale.region_stripes;
                count += (first + stale.region_stripes).min(stripes) - first;
            }
        }
        (regions, count)
    }

    /// Zeroes a joining member's journal, so that its old records are
    /// never replayed over newer data.
    pub(crate) async fn prepare_member(
        &self,
        index: usize,
        dev: &Arc<dyn BlockDevice>,
    ) -> Result<(), VolumeError> {
        if let Some(j) = &self.journal {
            let bytes = j.bytes() as usize;
            let (_, r) = dev_io(
                dev,
                BlockOp::Write { fua: true },
                j.start,
                bytes,
                zbuf(bytes),
            )
            .await;
            r.map_err(|source| VolumeError::MemberIo { index, source })?;
        }
        Ok(())
    }

    /// Writes the record area as a new member must carry it to `dev`: the
    /// generation it holds, None when the volume keeps no record area.
    async fn write_record_area(
        &self,
        index: usize,
        dev: &Arc<dyn BlockDevice>,
    ) -> Result<Option<u64>, VolumeError> {
        if self.records_at == 0 {
            return Ok(None);
        }
        let mut tries = 0;
        let (area, generation) = loop {
            match self.record_area_image() {
                Some(image) => break image,
                None if tries < JOIN_TRIES => {
                    tries += 1;
                    pause().await;
                }
                None => return Err(record_busy(index)),
            }
        };
        let (b, r) = dev_io(
            dev,
            BlockOp::Write { fua: true },
            self.records_at,
            area.len(),
            abuf_from(&area),
        )
        .await;
        recycle(b);
        r.map_err(|source| VolumeError::MemberIo { index, source })?;
        Ok(Some(generation))
    }

    /// Writes bitmap blocks from `first` on to `dev` (FUA).
    async fn write_bitmap_blocks(
        &self,
        index: usize,
        dev: &Arc<dyn BlockDevice>,
        first: usize,
        blocks: &[Vec<u8>],
    ) -> Result<(), VolumeError> {
        let image = blocks.concat();
        let (buf, r) = dev_io(
            dev,
            BlockOp::Write { fua: true },
            (SB_BYTES + first * BITMAP_BLOCK) as u64,
            image.len(),
            abuf_from(&image),
        )
        .await;
        recycle(buf);
        r.map_err(|source| VolumeError::MemberIo { index, source })
    }

    /// Puts `dev` in as member `index` (then `set` changes the states, its
    /// result returned) with the volume's intent bitmap and device-kept
    /// record as they are now on its disk, not zeroes nor what it carried.
    ///
    /// The bitmap: while it is held its bits are the record of what an
    /// absent member missed, and a block whose bits were set before `dev`
    /// joined is not written again, so a later assembly without the copies
    /// that were there before must still find them on `dev`. The image goes
    /// to `dev` without the bitmap's `io` lock (which every bitmap write to
    /// the members holds), so a device that stops answering holds up only
    /// its own join; the swap happens under the lock once `dev` holds what
    /// the bitmap holds then (blocks changed meanwhile are written again,
    /// unlocked, and checked again), so any bitmap write after it reaches
    /// `dev` as well. While the bitmap is held bits are only set, so this
    /// ends; the last try writes them under the lock.
    ///
    /// The record: a store writes the members it sees, so the swap happens
    /// under the record's lock, with the generation written to `dev` still
    /// the newest. A store in between (rare: a host's reservation command)
    /// makes it start again, without the `io` lock meanwhile, so new-region
    /// writes do not wait on stores; after [`JOIN_TRIES`] it is refused and
    /// `dev` is not a member.
    ///
    /// Both are on `dev` before any superblock names it.
    pub(crate) async fn admit_member<R>(
        &self,
        index: usize,
        dev: Arc<dyn BlockDevice>,
        set: impl FnOnce(&mut Members) -> R,
    ) -> Result<R, VolumeError> {
        let blocks = IntentLog::blocks_for(self.intent.regions) as usize;
        let snapshot =
            || -> Vec<Vec<u8>> { (0..blocks).map(|b| self.intent.snapshot_block(b)).collect() };
        let mut on_dev = snapshot();
        if blocks > 0 {
            self.write_bitmap_blocks(index, &dev, 0, &on_dev).await?;
        }
        let mut written = self.write_record_area(index, &dev).await?;
        for attempt in 1..=JOIN_TRIES {
            let io = self.intent.io.lock().await;
            let now = snapshot();
            let mut changed = (0..blocks).filter(|&b| now[b] != on_dev[b]);
            if let (Some(first), Some(last)) = (changed.clone().next(), changed.next_back()) {
                let span = &now[first..=last];
                if attempt < JOIN_TRIES {
                    drop(io);
                    self.write_bitmap_blocks(index, &dev, first, span).await?;
                    on_dev = now;
                    continue;
                }
                self.write_bitmap_blocks(index, &dev, first, span).await?;
            }
            {
                // A store holds the lock across its writes (on a thread of
                // its own): tried, never waited for, on this task's thread.
                let st = match written {
                    None => None,
                    Some(_) => self.records.try_lock(),
                };
                if written.is_none() || st.as_ref().map(|s| s.generation) == written {
                    let mut m = self.members.write();
                    m.devs[index] = dev;
                    let out = set(&mut m);
                    m.changed();
                    m.version += 1;
                    return Ok(out);
                }
            }
            drop(io);
            pause().await;
            written = self.write_record_area(index, &dev).await?;
        }
        Err(record_busy(index))
    }
}

/// A join that gave up on a record that kept changing (or stayed locked).
fn record_busy(index: usize) -> VolumeError {
    VolumeError::Busy(format!(
        "member {index}: the volume's reservation record was being stored through \
         {JOIN_TRIES} tries while the new device joined; it was not put in, so try again"
    ))
}

/// Attempts of [`Inner::admit_member`] before it gives up on a record that
/// keeps changing.
const JOIN_TRIES: usize = 100;

/// Waits a little for a record store on another thread: a millisecond on a
/// tokio runtime; a yield where none drives this task's timers (tests, and
/// `blockdev::block_on`).
async fn pause() {
    if tokio::runtime::Handle::try_current().is_ok() && !blockdev::in_block_on() {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    } else {
        tokio::task::yield_now().await;
    }
}
