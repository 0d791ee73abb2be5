//! Building a volume: `create` on fresh members, `assemble` from members'
//! superblocks after a restart (journal replay, then bitmap resync).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use blockdev::{BlockDevice, BlockOp};
use futures_util::future::join_all;
use parking_lot::RwLock;

use super::fence::{Fence, FencedMember};
use super::member_io::{MissingDevice, abuf, dev_io};
use super::{
    INTENT_CLEAR_AGE, Inner, LOCK_SHARDS, Members, RecordState, StaleRegions, Stats, Volume,
    VolumeConfig, VolumeError, force, journal_wanted, newest_superblock,
};
use crate::intent::{BITMAP_BLOCK, IntentLog};
use crate::journal::Journal;
use crate::layout::Layout;
use crate::parity::{Code, Parity};
use crate::rebuild::RebuildState;
use crate::records;
use crate::superblock::{MemberState, SB_BYTES, Superblock, VolumeRole, new_uuid, uuid_string};

impl Volume {
    /// Builds a new volume on `members`, writing fresh superblocks and an empty
    /// intent bitmap. Unless `assume_clean`, parity is computed for every stripe.
    pub async fn create(
        members: Vec<Arc<dyn BlockDevice>>,
        cfg: VolumeConfig,
    ) -> Result<Volume, VolumeError> {
        let bs = cfg.block_size;
        if bs != 512 && bs != 4096 {
            return Err(VolumeError::Config(format!(
                "block_size = {bs} is not supported; use 4096 or 512"
            )));
        }
        if cfg.strip_bytes == 0
            || !cfg.strip_bytes.is_power_of_two()
            || !cfg.strip_bytes.is_multiple_of(bs)
        {
            return Err(VolumeError::Config(format!(
                "strip_bytes = {} is not a power of two multiple of the {bs} B block; use e.g. 65536",
                cfg.strip_bytes
            )));
        }
        if cfg.meta_bytes < 2 * SB_BYTES as u64 || !cfg.meta_bytes.is_multiple_of(SB_BYTES as u64) {
            return Err(VolumeError::Config(format!(
                "meta_bytes = {} must be a multiple of 4096 and at least 8192; use 1048576",
                cfg.meta_bytes
            )));
        }
        let mut data_blocks = Vec::with_capacity(members.len());
        for (i, d) in members.iter().enumerate() {
            if let Some(j) = members[..i].iter().position(|o| Arc::ptr_eq(o, d)) {
                return Err(VolumeError::Config(format!(
                    "member {i} is the same device as member {j}; give each position its own device"
                )));
            }
            let g = d.geometry();
            if !bs.is_multiple_of(g.block_size) {
                return Err(VolumeError::Config(format!(
                    "member {i} has {} B blocks, which do not divide the volume's {bs} B blocks; \
                     use block_size = {}",
                    g.block_size, g.block_size
                )));
            }
            if g.size_bytes() <= cfg.meta_bytes {
                return Err(VolumeError::Config(format!(
                    "member {i} holds {} bytes, no more than the {} bytes of metadata; use a larger member",
                    g.size_bytes(),
                    cfg.meta_bytes
                )));
            }
            data_blocks.push((g.size_bytes() - cfg.meta_bytes) / u64::from(bs));
        }
        let layout = Layout::new(cfg.layout, u64::from(cfg.strip_bytes / bs), &data_blocks)?;
        let mut bitmap_bytes = cfg.meta_bytes - SB_BYTES as u64;
        let mut journal_bytes = 0;
        if cfg.write_journal && journal_wanted(&layout) {
            // The bitmap (at least one block) leaves room for a journal slot;
            // without one, Inner::new warns that degraded writes have a hole.
            let slot = Journal::slot_bytes(layout.parity_columns(), u64::from(cfg.strip_bytes));
            if cfg.meta_bytes >= (SB_BYTES + BITMAP_BLOCK) as u64 + slot {
                bitmap_bytes -= slot;
                journal_bytes = slot;
            }
        }
        // Then room for the device-kept records at the end of the metadata
        // area, where there is some after a bitmap block and a journal slot
        // (without it the volume keeps no records, `keeps_records` is false).
        let records_at = if cfg.meta_bytes
            >= (SB_BYTES + BITMAP_BLOCK) as u64 + journal_bytes + records::AREA_BYTES
        {
            bitmap_bytes -= records::AREA_BYTES;
            cfg.meta_bytes - records::AREA_BYTES
        } else {
            0
        };
        let wanted = region_stripes_wanted(cfg.region_bytes, cfg.strip_bytes, layout.stripes());
        let region_stripes =
            IntentLog::region_stripes_for(layout.stripes().max(1), bitmap_bytes).max(wanted);
        let states = vec![MemberState::Active; members.len()];
        let inner = Inner::new(
            layout,
            new_uuid(),
            cfg.block_size,
            cfg.strip_bytes,
            cfg.meta_bytes,
            region_stripes,
            data_blocks,
            members,
            states,
            0,
            cfg.intent_log,
            cfg.write_journal,
            records_at,
        )?;
        let vol = Volume {
            inner: Arc::new(inner),
        };
        // Empty bitmaps first, so a crash before the superblock lands leaves no
        // half-made volume that assembles.
        {
            let mut m = vol.inner.members.write();
            m.name = cfg.name.clone();
            m.role = cfg.role;
        }
        if let Some((env, key)) = &cfg.key {
            vol.inner.members.write().key = Some(*env);
            vol.inner.encrypted.store(true, Ordering::Relaxed);
            vol.unlock(key)?;
        }
        vol.inner.write_bitmap_all_zero().await?;
        vol.inner.wipe_journal().await;
        vol.inner.persist_superblock(true).await;
        if !cfg.assume_clean && vol.inner.parity.code != Code::None && vol.inner.use_intent {
            // In the background (`Volume::initial_sync`): every region is
            // dirty on disk first, so a crash before the sync ends resyncs
            // the rest at assembly.
            vol.inner.mark_all_unsynced().await;
        } else if !cfg.assume_clean && vol.inner.parity.code != Code::None {
            for s in 0..vol.inner.layout.stripes() {
                vol.inner
                    .sync_stripe(s, true)
                    .await
                    .map_err(|e| VolumeError::Rebuild(format!("initial sync: {e}")))?;
            }
        }
        tracing::info!("created {}", vol.describe());
        Ok(vol)
    }

    /// Reassembles a volume from its members alone (in any order), resyncs
    /// every region the intent bitmaps mark dirty, and marks the volume open.
    /// Members that cannot be read count as failed; members of another
    /// volume, or stale ones, are refused with an error naming them.
    pub async fn assemble(members: Vec<Arc<dyn BlockDevice>>) -> Result<Volume, VolumeError> {
        Self::assemble_with(members, true, true).await
    }

    /// [`Volume::assemble`] for a takeover, which must serve soon: a
    /// volume whose bitmaps mark regions dirty (its owner crashed) does not
    /// resync them before it returns.
    ///
    /// - A mirror takes its first Active member as the copy of record and
    ///   every other one not Failed as Resyncing over the dirty regions (as
    ///   after a re-add), also when some were Resyncing already (the last
    ///   owner's resync or re-add had not ended): reads there come from the
    ///   copy of record alone, so every read of a block returns the same
    ///   data, and [`Volume::rebuild`] copies them over in the background
    ///   (the superblocks say so: a crash before it ends resumes it). Not
    ///   while a member is Rebuilding, or with one member left.
    /// - A parity layout keeps the dirty regions as unsynced, as `create`
    ///   does (`sync.rs`): reads of present data need no parity, a write
    ///   there keeps parity no worse than it was, and
    ///   [`Volume::initial_sync`] recomputes it in the background (the bits
    ///   stay on disk until then). As in md, a member lost before that ends
    ///   leaves those stripes' reconstruction unreliable, which is the
    ///   window a resync before serving had too.
    ///
    /// Returns the volume and whether it left such a resync to do. A parity
    /// volume with a member missing or not Active resyncs first, as
    /// [`Volume::assemble`] does.
    pub async fn assemble_deferring_resync(
        members: Vec<Arc<dyn BlockDevice>>,
    ) -> Result<(Volume, bool), VolumeError> {
        let (vol, _, deferred) = Self::assemble_opts(members, true, true, false, true).await?;
        Ok((vol, deferred))
    }

    /// The tests' negative controls: `intent_log: false` keeps no bitmap and
    /// resyncs nothing; `write_journal: false` journals and replays nothing.
    pub(crate) async fn assemble_with(
        members: Vec<Arc<dyn BlockDevice>>,
        intent_log: bool,
        write_journal: bool,
    ) -> Result<Volume, VolumeError> {
        Ok(
            Self::assemble_opts(members, intent_log, write_journal, false, false)
                .await?
                .0,
        )
    }

    /// With `force`, see [`Volume::assemble_force`] (`force.rs`); with
    /// `defer_resync`, [`Volume::assemble_deferring_resync`] (the last value
    /// says whether it deferred one).
    pub(crate) async fn assemble_opts(
        members: Vec<Arc<dyn BlockDevice>>,
        intent_log: bool,
        write_journal: bool,
        force: bool,
        defer_resync: bool,
    ) -> Result<(Volume, Option<force::ForceReport>, bool), VolumeError> {
        let t0 = std::time::Instant::now();
        let reads = join_all(members.iter().map(|d| async move {
            let (buf, r) = dev_io(d, BlockOp::Read, 0, SB_BYTES, abuf(SB_BYTES)).await;
            r.map(|_| buf)
        }))
        .await;
        let mut sbs: Vec<Option<Superblock>> = Vec::with_capacity(members.len());
        for (i, r) in reads.into_iter().enumerate() {
            match r {
                Ok(buf) => match Superblock::decode(&buf) {
                    Ok(sb) => sbs.push(Some(sb)),
                    Err(source) => return Err(VolumeError::NoSuperblock { index: i, source }),
                },
                Err(e) => {
                    tracing::warn!(
                        "member {i}: superblock unreadable ({e}); treating it as failed"
                    );
                    sbs.push(None);
                }
            }
        }
        let newest = newest_superblock(&sbs)?;
        let n = newest.members.len();
        let mut slot: Vec<Option<usize>> = vec![None; n];
        for (i, sb) in sbs.iter().enumerate() {
            let Some(sb) = sb else { continue };
            if sb.uuid != newest.uuid {
                return Err(VolumeError::Mismatch {
                    index: i,
                    detail: format!(
                        "it belongs to volume {}, the others to {}",
                        uuid_string(&sb.uuid),
                        uuid_string(&newest.uuid)
                    ),
                });
            }
            if !sb.same_shape(&newest) {
                return Err(VolumeError::Mismatch {
                    index: i,
                    detail: format!(
                        "its layout ({} of {} members, {} B strips) differs from the volume's ({} of {}, {} B)",
                        sb.kind,
                        sb.members.len(),
                        sb.strip_bytes,
                        newest.kind,
                        n,
                        newest.strip_bytes
                    ),
                });
            }
            let p = usize::from(sb.position);
            if let Some(other) = slot[p] {
                return Err(VolumeError::Mismatch {
                    index: i,
                    detail: format!("it claims position {p}, as member {other} does"),
                });
            }
            slot[p] = Some(i);
        }
        let plan = if force {
            Some(force::plan(&newest, &sbs, &slot)?)
        } else {
            None
        };
        let mut devs: Vec<Arc<dyn BlockDevice>> = Vec::with_capacity(n);
        let mut states = Vec::with_capacity(n);
        let template = members[slot
            .iter()
            .flatten()
            .copied()
            .next()
            .expect("newest exists")]
        .geometry();
        for (p, entry) in newest.members.iter().enumerate() {
            match slot[p] {
                Some(i) => {
                    let sb = sbs[i].as_ref().expect("slotted members have superblocks");
                    let mut state = entry.state;
                    let forced = plan.as_ref().is_some_and(|pl| pl.forces(p));
                    if forced {
                        state = MemberState::Active;
                    } else if plan.as_ref().is_some_and(|pl| pl.left_out.contains(&p)) {
                        state = MemberState::Failed;
                    }
                    if !forced
                        && state != MemberState::Failed
                        && sb.generation + 1 < newest.generation
                    {
                        return Err(VolumeError::Stale {
                            index: i,
                            position: p,
                            member_generation: sb.generation,
                            volume_generation: newest.generation,
                        });
                    }
                    if state == MemberState::Failed {
                        tracing::warn!("member {i} (position {p}) is marked failed; not using it");
                    } else if sb.generation < newest.generation {
                        // One behind: the last superblock update was cut short.
                        tracing::info!(
                            "member {i} (position {p}) is at generation {} of {}; taking the newer superblock",
                            sb.generation,
                            newest.generation
                        );
                    }
                    devs.push(members[i].clone());
                    states.push(state);
                }
                None => {
                    if entry.state != MemberState::Failed {
                        tracing::warn!("member at position {p} is missing; running degraded");
                    }
                    devs.push(Arc::new(MissingDevice(template)) as Arc<dyn BlockDevice>);
                    states.push(MemberState::Failed);
                }
            }
        }
        let failed: Vec<usize> = (0..n)
            .filter(|&p| states[p] == MemberState::Failed)
            .collect();
        let data_blocks: Vec<u64> = newest.members.iter().map(|e| e.data_blocks).collect();
        let layout = Layout::new(
            newest.kind,
            u64::from(newest.strip_bytes / newest.block_size),
            &data_blocks,
        )?;
        if failed.len() > layout.parity_columns() {
            return Err(VolumeError::TooManyFailed {
                failed: failed.len(),
                which: failed,
                layout: newest.kind,
                tolerated: layout.parity_columns(),
            });
        }
        let inner = Inner::new(
            layout,
            newest.uuid,
            newest.block_size,
            newest.strip_bytes,
            newest.meta_bytes,
            newest.region_stripes,
            data_blocks,
            devs,
            states,
            newest.generation,
            intent_log,
            write_journal,
            newest.records_at,
        )?;
        let vol = Volume {
            inner: Arc::new(inner),
        };
        {
            let mut m = vol.inner.members.write();
            m.version += 1;
            m.name = newest.name.clone();
            m.role = newest.role;
            m.key = newest.key;
            vol.inner
                .encrypted
                .store(newest.key.is_some(), Ordering::Relaxed);
            // What a failed member missed is on the bitmap since it failed
            // (the superblocks say when), or, for one found missing now that
            // was in use until the last run, since now.
            for (p, entry) in newest.members.iter().enumerate() {
                m.failed_at[p] = if !vol.inner.use_intent || m.states[p] != MemberState::Failed {
                    0
                } else if entry.state == MemberState::Failed {
                    entry.failed_at
                } else {
                    newest.generation.max(1)
                };
            }
            if m.states.iter().any(|s| *s != MemberState::Active) {
                vol.inner.hold_bitmap(true);
            }
        }
        let t_sb = t0.elapsed();
        let deferred =
            defer_resync && intent_log && plan.is_none() && vol.inner.defer_mirror_resync().await;
        if !deferred && vol.inner.intent.held() {
            // What the failed or returning members missed, kept on the
            // others' bitmaps: adopt it before anything reads or writes, so
            // a re-added member is known stale where it is (also for the
            // journal replay) and no bitmap write clears it.
            let merged = vol.inner.read_bitmaps().await;
            vol.inner.intent.load(&merged);
            let mut m = vol.inner.members.write();
            if m.states
                .iter()
                .any(|s| matches!(s, MemberState::Resyncing { .. }))
            {
                m.stale = Some(Arc::new(StaleRegions {
                    region_stripes: vol.inner.intent.region_stripes,
                    bits: vol.inner.intent.set_bits(),
                }));
                m.changed();
            }
        }
        let report = match &plan {
            Some(plan) => Some(vol.inner.finish_force(plan, &newest).await?),
            None => None,
        };
        let t_bitmaps = t0.elapsed();
        // Journal first: the bitmap resync cannot fix stripes missing data.
        vol.inner.replay_journal().await?;
        let t_journal = t0.elapsed();
        let deferred = deferred
            || (defer_resync
                && intent_log
                && plan.is_none()
                && vol.inner.defer_parity_resync().await);
        if intent_log && !deferred {
            vol.inner.resync_dirty_regions().await?;
        }
        let t_resync = t0.elapsed();
        vol.inner.load_records().await;
        let t_records = t0.elapsed();
        vol.inner.persist_superblock(true).await;
        tracing::debug!(
            "assembly steps: superblocks {t_sb:?}, held bitmaps {:?}, journal {:?}, \
             resync {:?}, records {:?}, superblock write {:?}",
            t_bitmaps - t_sb,
            t_journal - t_bitmaps,
            t_resync - t_journal,
            t_records - t_resync,
            t0.elapsed() - t_records
        );
        tracing::info!("assembled {}", vol.describe());
        Ok((vol, report, deferred))
    }
}

impl Inner {
    /// What both deferring steps start from: the members' bitmaps merged
    /// and the regions they mark dirty, when `ok` holds for the member
    /// states before and after the read (a failed bitmap read fails its
    /// member). `None`: nothing to defer; nothing changed.
    async fn dirty_while(
        &self,
        ok: impl Fn(&[MemberState]) -> bool,
    ) -> Option<(Vec<u8>, Vec<u64>)> {
        let ok_now = || ok(&self.members.read().states);
        if !ok_now() {
            return None;
        }
        let merged = self.read_bitmaps().await;
        let regions = self.intent.dirty_regions(&merged);
        (!regions.is_empty() && ok_now()).then_some((merged, regions))
    }

    /// [`Volume::assemble_deferring_resync`]'s step for parity layouts: with
    /// every member Active and the bitmap not held, the regions the bitmaps
    /// mark dirty become unsynced (held and on every member's bitmap) for
    /// the background sync. False: nothing dirty, not a parity layout, or a
    /// member not Active; nothing changed.
    async fn defer_parity_resync(&self) -> bool {
        if matches!(self.parity.code, Code::None | Code::Mirror) || self.intent.held() {
            return false;
        }
        let all_active = |s: &[MemberState]| s.iter().all(|s| *s == MemberState::Active);
        let Some((_, regions)) = self.dirty_while(all_active).await else {
            return false;
        };
        tracing::info!(
            "{} dirty regions left to the background resync",
            regions.len()
        );
        self.mark_unsynced(regions).await;
        true
    }

    /// [`Volume::assemble_deferring_resync`]'s step for mirrors: the first
    /// Active member is the copy of record, and every other member not
    /// Failed turns Resyncing from stripe 0 over the regions the bitmaps
    /// mark dirty (the bits held until [`Volume::rebuild`] ends). Either
    /// every member is Active and the bitmap not held (the owner crashed:
    /// the dirty regions are its last few seconds of writes), or every
    /// member besides the copy of record and the Failed ones is Resyncing
    /// already (a takeover or move before the last owner's resync or a
    /// re-add ended): their stale set grows by the new dirty regions, and
    /// their checkpoint goes back to 0, as a region written below it may be
    /// torn now. Before, that case resynced every dirty region before it
    /// served (up to 64 MiB each).
    ///
    /// Not when a held bitmap would demote a copy that is Active now: its
    /// bits then cover everything written since a member failed, and that
    /// copy would stop counting for redundancy over all of it until the
    /// background pass ends; such a volume resyncs first, as before. Nor
    /// while a member is Rebuilding (its checkpoint could not go back
    /// without a full rebuild). False: nothing dirty or nothing deferred;
    /// nothing changed.
    async fn defer_mirror_resync(&self) -> bool {
        if self.parity.code != Code::Mirror {
            return false;
        }
        let held = self.intent.held();
        let Some((merged, _)) = self.dirty_while(|s| mirror_source(s, held).is_some()).await else {
            return false;
        };
        let mut m = self.members.write();
        // Checked again under the lock that changes the states.
        let Some(source) = mirror_source(&m.states, self.intent.held()) else {
            return false;
        };
        // Held before any member turns Resyncing: no flush may clear a bit
        // of a region the others have not been given yet.
        self.hold_bitmap(true);
        self.intent.load(&merged);
        for (i, st) in m.states.iter_mut().enumerate() {
            if i != source && *st != MemberState::Failed {
                *st = MemberState::Resyncing { checkpoint: 0 };
            }
        }
        m.stale = Some(Arc::new(StaleRegions {
            region_stripes: self.intent.region_stripes,
            bits: self.intent.set_bits(),
        }));
        m.changed();
        m.version += 1;
        true
    }
}

/// The member a mirror's deferred resync copies from (the first Active
/// one), where it may be deferred ([`Inner::defer_mirror_resync`]): every
/// member Active with the bitmap not `held`, or every other member present
/// Resyncing already; another one there to copy to, and none Rebuilding.
fn mirror_source(states: &[MemberState], held: bool) -> Option<usize> {
    let source = states.iter().position(|s| *s == MemberState::Active)?;
    let mut others = states
        .iter()
        .enumerate()
        .filter(|(i, s)| *i != source && **s != MemberState::Failed)
        .map(|(_, s)| s)
        .peekable();
    others.peek()?;
    let all_active = states.iter().all(|s| *s == MemberState::Active);
    let all_resyncing = others.all(|s| matches!(s, MemberState::Resyncing { .. }));
    ((all_active && !held) || all_resyncing).then_some(source)
}

impl Inner {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        layout: Layout,
        uuid: [u8; 16],
        block_size: u32,
        strip_bytes: u32,
        meta_bytes: u64,
        region_stripes: u64,
        data_blocks: Vec<u64>,
        devs: Vec<Arc<dyn BlockDevice>>,
        states: Vec<MemberState>,
        generation: u64,
        use_intent: bool,
        use_journal: bool,
        records_at: u64,
    ) -> Result<Inner, VolumeError> {
        let parity = Parity::new(layout.data_columns(), layout.parity_columns())?;
        let intent = IntentLog::new(layout.stripes().max(1), region_stripes.max(1));
        if (SB_BYTES + intent.bytes()) as u64 > meta_bytes {
            return Err(VolumeError::Config(format!(
                "the intent bitmap needs {} bytes but meta_bytes = {meta_bytes}",
                intent.bytes() + SB_BYTES
            )));
        }
        let start = (SB_BYTES + intent.bytes()) as u64;
        if records_at != 0 && records_at < start {
            return Err(VolumeError::Config(format!(
                "the record area at {records_at} overlaps the intent bitmap, which ends at {start}"
            )));
        }
        // The journal takes what the superblock and bitmap leave of the
        // metadata area up to the record area (all of it in volumes made
        // before records), so its place follows from the superblock alone.
        let journal_end = if records_at != 0 {
            records_at
        } else {
            meta_bytes
        };
        let slot = Journal::slot_bytes(layout.parity_columns(), u64::from(strip_bytes));
        let slots = if journal_wanted(&layout) {
            ((journal_end - start) / slot) as usize
        } else {
            0
        };
        // A volume made before records adopts the end of its metadata area
        // when the journal slots (counted even where the journal is off, as
        // a later assembly turns it on) leave that much unused: nothing ever
        // wrote there.
        let records_at = if records_at == 0
            && meta_bytes - (start + slots as u64 * slot) >= records::AREA_BYTES
        {
            meta_bytes - records::AREA_BYTES
        } else {
            records_at
        };
        let journal = if use_journal && journal_wanted(&layout) {
            if slots == 0 {
                tracing::warn!(
                    "meta_bytes = {meta_bytes} leaves no room for a write-journal slot of {slot} \
                     bytes (4 KiB + {} strips); a crash during a degraded partial-stripe write can \
                     corrupt the missing member's data; use meta_bytes >= {} for new volumes",
                    layout.parity_columns(),
                    (SB_BYTES + BITMAP_BLOCK) as u64 + slot
                );
                None
            } else {
                Some(Journal::new(start, slot, slots, layout.members()))
            }
        } else {
            None
        };
        let fence = Arc::new(Fence::default());
        let n = devs.len();
        let devs = devs
            .into_iter()
            .enumerate()
            .map(|(i, d)| FencedMember::wrap(d, i, &fence))
            .collect();
        Ok(Inner {
            parity,
            uuid,
            bs: u64::from(block_size),
            strip_bytes,
            meta_bytes,
            data_blocks,
            members: RwLock::new(Members {
                devs,
                states,
                generation,
                version: 0,
                persisted_version: 0,
                clean: false,
                name: String::new(),
                role: VolumeRole::Unknown,
                key: None,
                failed_at: vec![0; n],
                stale: None,
                snapshot: None,
            }),
            sb_lock: tokio::sync::Mutex::new(()),
            membership: tokio::sync::Mutex::new(()),
            locks: (0..LOCK_SHARDS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            intent,
            use_intent: use_intent && layout.parity_columns() > 0,
            intent_clear_ms: AtomicU64::new(INTENT_CLEAR_AGE.as_millis() as u64),
            stats: Stats::default(),
            rebuild: RebuildState::default(),
            unsynced: parking_lot::Mutex::new(Vec::new()),
            journal,
            records_at,
            records: parking_lot::Mutex::new(RecordState::default()),
            state_hook: parking_lot::Mutex::new(Default::default()),
            encrypted: std::sync::atomic::AtomicBool::new(false),
            gather: Default::default(),
            crypt: arc_swap::ArcSwapOption::empty(),
            fence,
            layout,
        })
    }
}

/// Stripes per intent bit that `region_bytes` asks for (0: automatic, see
/// [`VolumeConfig::region_bytes`]) on members of `stripes` strips: a power
/// of two, at least one stripe.
fn region_stripes_wanted(region_bytes: u64, strip_bytes: u32, stripes: u64) -> u64 {
    let strip = u64::from(strip_bytes);
    let bytes = if region_bytes == 0 {
        (stripes * strip / super::AUTO_REGIONS_PER_MEMBER)
            .clamp(super::AUTO_REGION_MIN_BYTES, super::AUTO_REGION_MAX_BYTES)
    } else {
        region_bytes
    };
    // Round down for the automatic size (never coarser than asked); an
    // explicit size keeps its old rounding up.
    let n = (bytes / strip).max(1);
    if region_bytes == 0 && !n.is_power_of_two() {
        n.next_power_of_two() / 2
    } else {
        n.next_power_of_two()
    }
}

#[cfg(test)]
mod tests {
    use super::{mirror_source, region_stripes_wanted};
    use crate::superblock::MemberState;

    const MIB: u64 = 1 << 20;
    const STRIP: u32 = 64 << 10;

    fn region_bytes(member_bytes: u64) -> u64 {
        let stripes = member_bytes / u64::from(STRIP);
        region_stripes_wanted(0, STRIP, stripes) * u64::from(STRIP)
    }

    #[test]
    fn automatic_region_follows_the_member_size() {
        // Small members: the floor, not one region for the whole member.
        assert_eq!(region_bytes(31 * MIB), MIB);
        assert_eq!(region_bytes(1024 * MIB), MIB);
        // 1/1024 of the member, rounded down to a power of two.
        assert_eq!(region_bytes(4096 * MIB), 4 * MIB);
        assert_eq!(region_bytes(6000 * MIB), 4 * MIB);
        // Large members: md's 64 MiB chunk.
        assert_eq!(region_bytes(64 * 1024 * MIB), 64 * MIB);
        assert_eq!(region_bytes(4 << 40), 64 * MIB);
        // A strip larger than the floor: one stripe per bit.
        assert_eq!(region_stripes_wanted(0, 4 << 20, 8), 1);
    }

    #[test]
    fn explicit_region_keeps_its_rounding() {
        assert_eq!(region_stripes_wanted(2 * u64::from(STRIP), STRIP, 100), 2);
        assert_eq!(region_stripes_wanted(3 * u64::from(STRIP), STRIP, 100), 4);
        assert_eq!(region_stripes_wanted(64 * MIB, STRIP, 100), 1024);
    }

    #[test]
    fn a_mirror_defers_only_where_no_active_copy_is_demoted() {
        use MemberState::{Active as A, Failed as F};
        let r = MemberState::Resyncing { checkpoint: 7 };
        let b = MemberState::Rebuilding { checkpoint: 7 };
        // A crash with every copy Active: the first is the copy of record.
        assert_eq!(mirror_source(&[A, A], false), Some(0));
        assert_eq!(mirror_source(&[A, A, A], false), Some(0));
        // ... but not with the bitmap held (bits since another failure).
        assert_eq!(mirror_source(&[A, A], true), None);
        // The last owner's resync or a re-add had not ended.
        assert_eq!(mirror_source(&[A, r], true), Some(0));
        assert_eq!(mirror_source(&[r, A], true), Some(1));
        assert_eq!(mirror_source(&[A, r, F], true), Some(0));
        assert_eq!(mirror_source(&[F, r, A], true), Some(2));
        // An Active copy would be demoted over every held bit.
        assert_eq!(mirror_source(&[A, A, F], true), None);
        assert_eq!(mirror_source(&[A, A, r], true), None);
        // Nothing to copy to, nothing to copy from, or a rebuild.
        assert_eq!(mirror_source(&[A, F], true), None);
        assert_eq!(mirror_source(&[A], false), None);
        assert_eq!(mirror_source(&[r, r], true), None);
        assert_eq!(mirror_source(&[A, b], true), None);
        assert_eq!(mirror_source(&[A, r, b], true), None);
    }
}
