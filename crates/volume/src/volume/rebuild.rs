//! Rebuild onto replacement members (see `crate::rebuild` for the state
//! and progress types): stripe by stripe, under the stripe lock, throttled,
//! with a checkpoint in the superblocks.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use blockdev::BlockDevice;
use futures_util::future::join_all;

use super::member_io::{abuf, recycle};
use super::{OpError, StaleRegions, Volume, VolumeError};
use crate::rebuild::{RebuildOptions, RebuildProgress, RunningGuard};
use crate::superblock::MemberState;

impl Volume {
    /// Puts `dev` in place of failed member `index`; its data is rebuilt by
    /// [`Volume::rebuild`]. The new member must be at least as large.
    pub async fn replace_member(
        &self,
        index: usize,
        dev: std::sync::Arc<dyn BlockDevice>,
    ) -> Result<(), VolumeError> {
        let inner = &self.inner;
        let _change = inner.membership.lock().await;
        let state = inner
            .members
            .read()
            .states
            .get(index)
            .copied()
            .unwrap_or(MemberState::Failed);
        if index < inner.layout.members() && state != MemberState::Failed {
            return Err(VolumeError::Config(format!(
                "member {index} is {state:?}, not failed; fail it first (fail_member) to replace it"
            )));
        }
        self.check_replacement(index, &dev)?;
        // Clear whatever journal the device carried, so it cannot be
        // replayed. Its record area and bitmap become the volume's (the
        // record survives every member being replaced in turn; bits held
        // for other members are kept: `admit_member`).
        inner.prepare_member(index, &dev).await?;
        inner
            .admit_member(index, dev, |m| {
                m.states[index] = MemberState::Rebuilding { checkpoint: 0 };
            })
            .await?;
        inner.persist_superblock(true).await;
        tracing::info!("member {index} replaced; rebuild pending");
        Ok(())
    }

    /// Whether `dev` can replace member `index` and be rebuilt, checked
    /// before anything changes: the member exists, the layout has
    /// redundancy, the other members hold enough to rebuild it from
    /// (members failed, being rebuilt or resynced count as missing), and
    /// `dev` is large enough. The member itself may still be active (the
    /// caller fails it first).
    pub fn check_replacement(
        &self,
        index: usize,
        dev: &std::sync::Arc<dyn BlockDevice>,
    ) -> Result<(), VolumeError> {
        let inner = &self.inner;
        let n = inner.layout.members();
        let kind = inner.layout.kind();
        if index >= n {
            return Err(VolumeError::Config(format!(
                "member {index} does not exist; the volume has {n}"
            )));
        }
        let m = inner.layout.parity_columns();
        if m == 0 {
            return Err(VolumeError::CannotRebuild(format!(
                "{kind} has no redundancy to rebuild member {index} from: its data is lost. \
                 Copy what is still readable elsewhere, then delete and re-create the volume"
            )));
        }
        let others: Vec<usize> = self
            .incomplete_members()
            .into_iter()
            .filter(|&i| i != index)
            .collect();
        if others.len() >= m {
            return Err(VolumeError::CannotRebuild(format!(
                "member {index} cannot be rebuilt: members {others:?} are failed or not yet \
                 rebuilt too, and {kind} rebuilds a member only while at most {} other members \
                 are missing. Replace or re-add those first, or copy what is still readable",
                m - 1
            )));
        }
        let g = dev.geometry();
        let need = inner.meta_bytes + inner.layout.member_blocks(index) * inner.bs;
        if g.size_bytes() < need || !(inner.bs as u32).is_multiple_of(g.block_size) {
            return Err(VolumeError::Config(format!(
                "replacement for member {index} holds {} bytes in {} B blocks; it needs at least {need} \
                 bytes in blocks that divide {}; pick a larger drive",
                g.size_bytes(),
                g.block_size,
                inner.bs
            )));
        }
        Ok(())
    }

    /// Rebuilds every member in the Rebuilding state, from its checkpoint on.
    /// Throttling sleeps with tokio's timer, so a rate needs a tokio runtime.
    pub async fn rebuild(&self, opts: RebuildOptions) -> Result<(), VolumeError> {
        let inner = &self.inner;
        let st = &inner.rebuild;
        if st.running.swap(true, Ordering::SeqCst) {
            return Err(VolumeError::Rebuild("a rebuild is already running".into()));
        }
        let _running = RunningGuard(&st.running);
        let stripes = inner.layout.stripes();
        let targets: Vec<(usize, u64)> = inner
            .members
            .read()
            .states
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                MemberState::Rebuilding { checkpoint } => Some((i, *checkpoint)),
                MemberState::Resyncing { checkpoint } => Some((i, *checkpoint)),
                _ => None,
            })
            .collect();
        if targets.is_empty() {
            return Ok(());
        }
        if inner.fence.is_set() {
            return Err(VolumeError::Fenced(inner.fence.error().to_string()));
        }
        let start = targets.iter().map(|t| t.1).min().unwrap_or(0);
        // Only re-added members: only their stale stripes need work.
        let stale = inner.members.read().stale.clone();
        let resync_only = inner
            .members
            .read()
            .states
            .iter()
            .all(|s| !matches!(s, MemberState::Rebuilding { .. }));
        let todo: Vec<u64> = match &stale {
            Some(stale) if resync_only => (start..stripes).filter(|&s| stale.stale(s)).collect(),
            _ => (start..stripes).collect(),
        };
        *st.members.lock() = targets.iter().map(|t| t.0).collect();
        *st.resync.lock() = resync_only;
        st.total.store(todo.len() as u64, Ordering::SeqCst);
        st.done.store(0, Ordering::SeqCst);
        st.bytes.store(0, Ordering::SeqCst);
        *st.started.lock() = Some(Instant::now());
        tracing::info!(
            "{} members {:?}: {} of {stripes} stripes, from stripe {start}",
            if resync_only {
                "resyncing"
            } else {
                "rebuilding"
            },
            st.members.lock(),
            todo.len()
        );
        let began = Instant::now();
        let strip_bytes = inner.layout.strip_blocks() * inner.bs;
        for (done, &s) in todo.iter().enumerate() {
            let wrote = self.rebuild_stripe(s).await?;
            st.done.store(done as u64 + 1, Ordering::SeqCst);
            let total =
                st.bytes.fetch_add(wrote * strip_bytes, Ordering::SeqCst) + wrote * strip_bytes;
            if (s + 1) % opts.checkpoint_every.max(1) == 0 {
                inner.members.write().version += 1;
                inner.persist_superblock(false).await;
            }
            if let Some(rate) = opts.rate_bytes_per_sec.filter(|&r| r > 0) {
                let due = Duration::from_secs_f64(total as f64 / rate as f64);
                let elapsed = began.elapsed();
                if due > elapsed {
                    tokio::time::sleep(due - elapsed).await;
                }
            }
        }
        let all_active = {
            let mut m = inner.members.write();
            let stale = m.stale.clone();
            for (i, _) in &targets {
                let done = match m.states[*i] {
                    MemberState::Rebuilding { checkpoint } => checkpoint >= stripes,
                    MemberState::Resyncing { checkpoint } => {
                        first_stale_from(stale.as_deref(), checkpoint, stripes).is_none()
                    }
                    _ => false,
                };
                if done {
                    m.states[*i] = MemberState::Active;
                    m.changed();
                    m.version += 1;
                }
            }
            let all = m.states.iter().all(|s| *s == MemberState::Active);
            if all
                || !m
                    .states
                    .iter()
                    .any(|s| matches!(s, MemberState::Resyncing { .. }))
            {
                m.stale = None;
                m.changed();
            }
            all
        };
        inner.persist_superblock(true).await;
        if inner.fence.is_set() {
            return Err(VolumeError::Fenced(inner.fence.error().to_string()));
        }
        if all_active {
            // Nothing is missing anywhere now: the bits held for the
            // returning members may go (all of them, on this flush).
            inner.hold_bitmap(false);
            inner
                .flush_clearing(Duration::ZERO)
                .await
                .map_err(|e| VolumeError::Rebuild(format!("clearing the intent bitmap: {e}")))?;
        }
        tracing::info!("rebuild done in {:.1?}", began.elapsed());
        Ok(())
    }

    /// Spawns [`Volume::rebuild`] on the current tokio runtime.
    pub fn start_rebuild(
        &self,
        opts: RebuildOptions,
    ) -> tokio::task::JoinHandle<Result<(), VolumeError>> {
        let vol = self.clone();
        tokio::spawn(async move { vol.rebuild(opts).await })
    }

    /// What the rebuild has done and has left, including the members that
    /// wait for the next run: right after a replace, before the run starts,
    /// this already counts the new member's stripes (not the last run's).
    pub fn rebuild_progress(&self) -> RebuildProgress {
        let st = &self.inner.rebuild;
        let running = st.running.load(Ordering::SeqCst);
        let (mut done, mut total, mut bytes) = (
            st.done.load(Ordering::SeqCst),
            st.total.load(Ordering::SeqCst),
            st.bytes.load(Ordering::SeqCst),
        );
        let mut members = st.members.lock().clone();
        if !running {
            members.clear();
        }
        let stripes = self.inner.layout.stripes();
        let (states, stale) = {
            let m = self.inner.members.read();
            (m.states.clone(), m.stale.clone())
        };
        let mut queued_members = Vec::new();
        let mut queued_stripes = 0u64;
        for (i, s) in states.iter().enumerate() {
            let left = match *s {
                MemberState::Rebuilding { checkpoint } => stripes.saturating_sub(checkpoint),
                MemberState::Resyncing { checkpoint } => match stale.as_deref() {
                    Some(st) => (checkpoint..stripes).filter(|&x| st.stale(x)).count() as u64,
                    None => stripes.saturating_sub(checkpoint),
                },
                _ => continue,
            };
            if !members.contains(&i) {
                queued_members.push(i);
                queued_stripes = queued_stripes.max(left);
            }
        }
        if !running && !queued_members.is_empty() {
            // The last run's counts say nothing of the work queued now.
            (done, total, bytes) = (0, 0, 0);
        }
        let elapsed = st.started.lock().map(|t| t.elapsed().as_secs_f64());
        let bytes_per_sec = if running {
            elapsed
                .filter(|&e| e > 0.0)
                .map_or(0.0, |e| bytes as f64 / e)
        } else {
            0.0
        };
        let per_stripe = (self.inner.layout.strip_blocks() * self.inner.bs) as f64;
        let width = members.len().max(1) as f64;
        // The next run rebuilds the queued members together, from the
        // lowest checkpoint: its stripes, at the same per-stripe speed.
        let eta = (running && bytes_per_sec > 0.0).then(|| {
            let left = total.saturating_sub(done) as f64 * per_stripe * width
                + queued_stripes as f64 * per_stripe * queued_members.len() as f64;
            Duration::from_secs_f64(left / bytes_per_sec)
        });
        RebuildProgress {
            running,
            members,
            resync: *st.resync.lock(),
            done_stripes: done,
            total_stripes: total,
            bytes,
            bytes_per_sec,
            eta,
            queued_members,
            queued_stripes,
        }
    }

    /// Reconstructs stripe `s` onto every member whose checkpoint is at it,
    /// then moves their checkpoints past it. Returns strips written.
    async fn rebuild_stripe(&self, s: u64) -> Result<u64, VolumeError> {
        let inner = &self.inner;
        let l = &inner.layout;
        let (k, m) = (l.data_columns(), l.parity_columns());
        let rows = l.strip_blocks();
        let len = (rows * inner.bs) as usize;
        let _g = inner.stripe_lock(s).lock().await;
        for _attempt in 0..=l.members() {
            if inner.fence.is_set() {
                return Err(VolumeError::Fenced(inner.fence.error().to_string()));
            }
            let view = inner.view();
            let stripes = l.stripes();
            let stale = view.stale.as_deref();
            // Members whose checkpoint moves past this stripe; of those, the
            // ones to write (a re-added member in a clean region needs none).
            let mut advance: Vec<usize> = Vec::new();
            let targets: Vec<usize> = (0..k + m)
                .filter(|&c| match view.states[l.column_member(s, c)] {
                    // Exactly at its checkpoint: a member replaced while this
                    // pass runs (checkpoint 0) must not skip the stripes the
                    // pass already went by; the next pass starts from it.
                    MemberState::Rebuilding { checkpoint } => checkpoint == s,
                    // Likewise, no stale stripe of its may lie between its
                    // checkpoint and this one.
                    MemberState::Resyncing { checkpoint } => {
                        if checkpoint > s
                            || (checkpoint < s
                                && first_stale_from(stale, checkpoint, stripes)
                                    .is_some_and(|f| f < s))
                        {
                            return false;
                        }
                        advance.push(c);
                        stale.is_none_or(|st| st.stale(s))
                    }
                    _ => false,
                })
                .collect();
            if targets.is_empty() {
                if !advance.is_empty() {
                    let mut mm = inner.members.write();
                    for &c in &advance {
                        if let MemberState::Resyncing { checkpoint } =
                            &mut mm.states[l.column_member(s, c)]
                        {
                            *checkpoint = s + 1;
                            mm.changed();
                        }
                    }
                }
                return Ok(0);
            }
            // Once rebuilt, the stripe takes writes without journal records,
            // so none of its old records may be replayed after a crash.
            inner.retire_journal(s, None).await;
            // Any k good columns determine the stripe.
            let sources: Vec<usize> = (0..k + m)
                .filter(|&c| view.avail(l.column_member(s, c), s))
                .take(k)
                .collect();
            if sources.len() < k {
                return Err(VolumeError::Rebuild(format!(
                    "stripe {s}: only {} of the {k} members needed are readable",
                    sources.len()
                )));
            }
            let lba = l.strip_lba(s, 0);
            let res = join_all((0..k + m).map(|c| {
                let want = sources.contains(&c);
                let view = &view;
                async move {
                    if want {
                        inner.col_read(view, l.column_member(s, c), lba, rows).await
                    } else {
                        Ok(abuf(len))
                    }
                }
            }))
            .await;
            let mut cols = match crate::volume::collect_failed(res) {
                Ok(c) => c,
                Err(OpError::Members(f)) => {
                    f.iter().for_each(|&i| inner.mark_failed(i));
                    continue;
                }
                Err(OpError::Fatal(e)) => return Err(VolumeError::Rebuild(e.to_string())),
            };
            let present: Vec<bool> = (0..k + m).map(|c| sources.contains(&c)).collect();
            {
                let mut refs: Vec<&mut [u8]> = cols.iter_mut().map(|b| &mut b[..]).collect();
                inner.parity.reconstruct(&mut refs, &present)?;
            }
            let writes = join_all(targets.iter().map(|&c| {
                let mbr = l.column_member(s, c);
                let b = std::mem::replace(&mut cols[c], abuf(0));
                let view = &view;
                async move { inner.col_write(view, mbr, lba, b, false).await }
            }))
            .await;
            cols.into_iter().for_each(recycle);
            let mut failed_targets = Vec::new();
            for r in writes {
                if let Err(i) = r {
                    failed_targets.push(i);
                }
            }
            failed_targets.iter().for_each(|&i| inner.mark_failed(i));
            let mut mm = inner.members.write();
            let mut wrote = 0;
            for &c in targets.iter().chain(&advance) {
                let mbr = l.column_member(s, c);
                if let MemberState::Rebuilding { checkpoint }
                | MemberState::Resyncing { checkpoint } = &mut mm.states[mbr]
                    && *checkpoint <= s
                {
                    *checkpoint = s + 1;
                    mm.changed();
                    if targets.contains(&c) {
                        wrote += 1;
                    }
                }
            }
            return Ok(wrote);
        }
        Err(VolumeError::Rebuild(format!(
            "stripe {s}: members kept failing"
        )))
    }
}

/// The first stale stripe at or after `from`, if any; without a stale set
/// every stripe is stale.
pub(crate) fn first_stale_from(
    stale: Option<&StaleRegions>,
    from: u64,
    stripes: u64,
) -> Option<u64> {
    let Some(stale) = stale else {
        return (from < stripes).then_some(from);
    };
    let rs = stale.region_stripes;
    let mut r = from / rs;
    while r * rs < stripes {
        // A region may end past the last stripe (or past `from` already):
        // only a stripe below `stripes` counts.
        let first = (r * rs).max(from);
        if stale.stale(r * rs) && first < stripes {
            return Some(first);
        }
        r += 1;
    }
    None
}

#[cfg(test)]
mod first_stale_tests {
    use super::*;

    #[test]
    fn a_region_longer_than_the_volume_ends_at_its_last_stripe() {
        let stale = StaleRegions {
            region_stripes: 256,
            bits: vec![1],
        };
        assert_eq!(first_stale_from(Some(&stale), 0, 240), Some(0));
        assert_eq!(first_stale_from(Some(&stale), 239, 240), Some(239));
        assert_eq!(first_stale_from(Some(&stale), 240, 240), None);
        assert_eq!(first_stale_from(None, 240, 240), None);
    }
}
