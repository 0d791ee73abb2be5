//! Parity checks: one stripe (`sync_stripe`), the whole volume (scrub), and
//! the regions the intent bitmaps mark dirty after a crash.

use std::sync::atomic::Ordering;

use blockdev::{AlignedBuf, BlockError, BlockOp};
use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;

use super::member_io::{abuf, collect_failed, dev_io, io_err};
use super::sync::SyncControl;
use super::{Inner, OpError, ScrubReport, Volume, VolumeError};
use crate::parity::Code;
use crate::superblock::SB_BYTES;

/// Stripes resynced at once after a crash.
const RESYNC_PARALLEL: usize = 32;

impl Volume {
    /// Checks every stripe's parity against its data; with `repair`, rewrites
    /// parity that disagrees (see [`Volume::scrub_with`]).
    pub async fn scrub(&self, repair: bool) -> ScrubReport {
        self.scrub_with(repair, &SyncControl::default()).await
    }
}

impl Inner {
    /// Recomputes parity of every stripe in a region marked dirty on any member.
    pub(crate) async fn resync_dirty_regions(&self) -> Result<(), VolumeError> {
        if !self.redundant() {
            return Ok(());
        }
        let merged = self.read_bitmaps().await;
        let regions = self.intent.dirty_regions(&merged);
        if !regions.is_empty() {
            tracing::info!("resyncing {} dirty regions", regions.len());
        }
        // Stripes are independent (each takes its own stripe lock), so a
        // region is resynced many stripes at a time: one at a time kept a
        // takeover after a crash ~1 s per dirty region from serving.
        let stripes: Vec<u64> = regions
            .iter()
            .flat_map(|r| {
                let first = r * self.intent.region_stripes;
                first..(first + self.intent.region_stripes).min(self.layout.stripes())
            })
            .collect();
        let mut next = stripes.into_iter();
        let mut running = FuturesUnordered::new();
        let mut unsynced = 0u64;
        loop {
            while running.len() < RESYNC_PARALLEL {
                match next.next() {
                    Some(s) => running.push(self.resync_stripe(s)),
                    None => break,
                }
            }
            let Some((s, r)) = running.next().await else {
                break;
            };
            match r {
                Ok(Some(_)) => {
                    self.stats.resynced.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None) => unsynced += 1,
                Err(e) => {
                    return Err(VolumeError::Rebuild(format!("resync of stripe {s}: {e}")));
                }
            }
        }
        if unsynced > 0 {
            tracing::warn!(
                "{unsynced} dirty stripes could not be resynced because a data member is missing; \
                 their parity may disagree with data written before the crash"
            );
        }
        if self.intent.held() {
            // A member is failed, being rebuilt or re-added: the bits are
            // the record of what it missed; keep them (in memory too, or
            // the next bitmap write would clear them on disk).
            self.intent.load(&merged);
        } else if !regions.is_empty() {
            self.write_bitmap_all_zero().await?;
        }
        Ok(())
    }

    /// Repairs one stripe's parity (a named future: resync runs many).
    async fn resync_stripe(&self, s: u64) -> (u64, Result<Option<bool>, BlockError>) {
        (s, self.sync_stripe(s, true).await)
    }

    /// Checks one stripe's parity; with `repair` rewrites it when it differs.
    /// Ok(None) when a data column is unavailable, Ok(Some(consistent)) otherwise.
    pub async fn sync_stripe(&self, stripe: u64, repair: bool) -> Result<Option<bool>, BlockError> {
        let _g = self.stripe_lock(stripe).lock().await;
        let (k, m) = (self.parity.k, self.parity.m);
        let rows = self.layout.strip_blocks();
        for _attempt in 0..=self.layout.members() {
            if self.fence.is_set() {
                return Err(self.fence.error());
            }
            let view = self.view();
            // A mirror checks its copies against the first readable one.
            let order: Vec<usize> = if self.parity.code == Code::Mirror {
                let Some(first) =
                    (0..k + m).find(|&c| view.avail(self.layout.column_member(stripe, c), stripe))
                else {
                    return Ok(None);
                };
                std::iter::once(first)
                    .chain((0..k + m).filter(|&c| c != first))
                    .collect()
            } else {
                (0..k + m).collect()
            };
            let member = |c: usize| self.layout.column_member(stripe, order[c]);
            if (0..k).any(|d| !view.avail(member(d), stripe)) {
                return Ok(None);
            }
            let lba = self.layout.strip_lba(stripe, 0);
            let res = join_all((0..k + m).map(|c| {
                let want = view.avail(member(c), stripe);
                let view = &view;
                async move {
                    if want {
                        self.col_read(view, member(c), lba, rows).await.map(Some)
                    } else {
                        Ok(None)
                    }
                }
            }))
            .await;
            let cols = match collect_failed(res) {
                Ok(c) => c,
                Err(OpError::Members(f)) => {
                    f.iter().for_each(|&i| self.mark_failed(i));
                    continue;
                }
                Err(OpError::Fatal(e)) => return Err(e),
            };
            let len = (rows * self.bs) as usize;
            let mut fresh: Vec<AlignedBuf> = (0..m).map(|_| abuf(len)).collect();
            {
                let drefs: Vec<&[u8]> = cols[..k]
                    .iter()
                    .map(|c| &c.as_ref().expect("data present")[..])
                    .collect();
                let mut prefs: Vec<&mut [u8]> = fresh.iter_mut().map(|b| &mut b[..]).collect();
                self.parity
                    .encode(&drefs, &mut prefs)
                    .map_err(|e| io_err(e.to_string()))?;
            }
            let bad: Vec<usize> = (0..m)
                .filter(|&j| {
                    cols[k + j]
                        .as_ref()
                        .is_some_and(|old| old[..] != fresh[j][..])
                })
                .collect();
            if bad.is_empty() || !repair {
                return Ok(Some(bad.is_empty()));
            }
            let res = join_all(
                fresh
                    .into_iter()
                    .enumerate()
                    .filter(|(j, _)| bad.contains(j))
                    .map(|(j, p)| self.col_write(&view, member(k + j), lba, p, true)),
            )
            .await;
            match collect_failed(res) {
                Ok(_) => return Ok(Some(false)),
                Err(OpError::Members(f)) => f.iter().for_each(|&i| self.mark_failed(i)),
                Err(OpError::Fatal(e)) => return Err(e),
            }
        }
        Err(self.too_many_failed(&self.view()))
    }

    /// The OR of every present member's intent bitmap (a member whose
    /// bitmap cannot be read is marked failed).
    pub(crate) async fn read_bitmaps(&self) -> Vec<u8> {
        let view = self.view();
        let bytes = self.intent.bytes();
        let mut merged = vec![0u8; bytes];
        for i in (0..view.devs.len()).filter(|&i| view.present(i)) {
            let (buf, r) = dev_io(
                &view.devs[i],
                BlockOp::Read,
                SB_BYTES as u64,
                bytes,
                abuf(bytes),
            )
            .await;
            match r {
                Ok(()) => {
                    for (a, b) in merged.iter_mut().zip(buf.iter()) {
                        *a |= *b;
                    }
                }
                Err(_) => self.mark_failed(i),
            }
        }
        merged
    }
}
