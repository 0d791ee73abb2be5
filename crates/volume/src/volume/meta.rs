//! Metadata persistence: the write-intent bitmap on disk, flush, the
//! superblocks (a new generation per member-state change), and the
//! device-kept records.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use blockdev::{AlignedBuf, BlockError, BlockOp};
use futures_util::future::join_all;

use super::member_io::{abuf, abuf_from, collect_failed, dev_io, io_err, recycle, zbuf};
use super::{Inner, OpError, View, VolumeError};
use crate::intent::BITMAP_BLOCK;
use crate::records;
use crate::superblock::{MemberEntry, MemberState, SB_BYTES, Superblock, uuid_string};

impl Inner {
    /// Marks the stripe's region in the intent bitmap (on disk before return).
    pub(crate) async fn intent_begin(&self, stripe: u64) {
        if !self.use_intent {
            return;
        }
        let region = self.intent.region_of(stripe);
        if !self.intent.begin(region) {
            return;
        }
        let _io = self.intent.io.lock().await;
        let Some((block, snap)) = self.intent.snapshot_for(region) else {
            return;
        };
        self.stats.intent_writes.fetch_add(1, Ordering::Relaxed);
        self.write_bitmap_block(block, &snap).await;
        self.intent.written(block, &snap);
    }

    pub(crate) fn intent_end(&self, stripe: u64) {
        if self.use_intent {
            self.intent.end(self.intent.region_of(stripe));
        }
    }

    /// Writes one bitmap block to every present member with FUA.
    pub(crate) async fn write_bitmap_block(&self, block: usize, snap: &[u8]) {
        let off = (SB_BYTES + block * BITMAP_BLOCK) as u64;
        self.write_meta_all(off, snap).await;
    }

    /// Writes `bytes` at byte `off` of every present member with FUA; a
    /// member whose write fails is marked failed (the next superblock flush
    /// records it). Returns how many members took it, and the last error.
    pub(crate) async fn write_meta_all(
        &self,
        off: u64,
        bytes: &[u8],
    ) -> (usize, Option<BlockError>) {
        let view = self.view();
        let res = join_all((0..view.devs.len()).filter(|&i| view.present(i)).map(|i| {
            let b = abuf_from(bytes);
            let dev = &view.devs[i];
            async move {
                let (b, r) = dev_io(dev, BlockOp::Write { fua: true }, off, bytes.len(), b).await;
                recycle(b);
                r.map_err(|e| (i, e))
            }
        }))
        .await;
        let mut written = 0;
        let mut last_err = None;
        for r in res {
            match r {
                Ok(()) => written += 1,
                Err((i, e)) => {
                    self.mark_failed(i);
                    last_err = Some(e);
                }
            }
        }
        (written, last_err)
    }

    /// Clears on disk the bits of regions idle for at least `age`.
    /// Clears the bits of regions idle for `age` and since before
    /// `flushed`, when a completed member flush was issued.
    pub(crate) async fn intent_clear_idle(&self, age: Duration, flushed: Instant) {
        if !self.use_intent {
            return;
        }
        for block in self.intent.clear_idle(age, flushed) {
            let _io = self.intent.io.lock().await;
            let snap = self.intent.snapshot_block(block);
            self.write_bitmap_block(block, &snap).await;
            self.intent.written(block, &snap);
        }
    }

    pub(crate) async fn write_bitmap_all_zero(&self) -> Result<(), VolumeError> {
        let view = self.view();
        let bytes = self.intent.bytes();
        let res = join_all((0..view.devs.len()).filter(|&i| view.present(i)).map(|i| {
            let dev = &view.devs[i];
            async move {
                let (_, r) = dev_io(
                    dev,
                    BlockOp::Write { fua: true },
                    SB_BYTES as u64,
                    bytes,
                    zbuf(bytes),
                )
                .await;
                r.map_err(|source| VolumeError::MemberIo { index: i, source })
            }
        }))
        .await;
        res.into_iter().collect()
    }

    pub async fn flush(&self) -> Result<(), BlockError> {
        let age = Duration::from_millis(self.intent_clear_ms.load(Ordering::Relaxed));
        self.flush_clearing(age).await
    }

    /// Flushes every member, then clears the bits of the regions that were
    /// idle for `age` before that flush was issued: a bit is cleared only
    /// once its region's writes are on the members for good (with
    /// `Duration::ZERO` too, as on close).
    pub(crate) async fn flush_clearing(&self, age: Duration) -> Result<(), BlockError> {
        self.intent.stamp_idle();
        let flushed = Instant::now();
        let view = self.view();
        let res = join_all((0..view.devs.len()).filter(|&i| view.present(i)).map(|i| {
            let dev = &view.devs[i];
            async move {
                let (_, r) = dev_io(dev, BlockOp::Flush, 0, 0, AlignedBuf::new(0)).await;
                r.map_err(|_| i)
            }
        }))
        .await;
        if let Err(OpError::Members(failed)) = collect_failed(res) {
            if !self.redundant() {
                return Err(self.failed_error(failed));
            }
            failed.iter().for_each(|&f| self.mark_failed(f));
            let view = self.view();
            let n_failed = view
                .states
                .iter()
                .filter(|s| **s == MemberState::Failed)
                .count();
            if n_failed > self.parity.m {
                return Err(self.too_many_failed(&view));
            }
        }
        self.intent_clear_idle(age, flushed).await;
        self.persist_superblock(false).await;
        if self.fence.is_set() {
            return Err(self.fence.error());
        }
        Ok(())
    }

    /// Writes the superblocks (a new generation) to every present member when
    /// member states changed, or always with `force`.
    pub async fn persist_superblock(&self, force: bool) {
        if self.fence.is_set() {
            return;
        }
        // Lock-free when nothing changed: the common case on the write path.
        // While another task's persist is in flight, persisted_version still
        // lags, so this waits for it below.
        if !force && {
            let st = self.members.read();
            st.version == st.persisted_version
        } {
            return;
        }
        let _g = self.sb_lock.lock().await;
        let mut force = force;
        // Versions count as persisted only once the states are recorded
        // outside too (`state_hook.rs`): a writer that finds nothing to do
        // must not pass one whose record is still on its way.
        let mut upto = self.members.read().persisted_version;
        let mut written: Option<(u64, Vec<MemberState>)> = None;
        loop {
            let (view, sbs, version) = {
                let mut st = self.members.write();
                if !force && st.version == upto {
                    break;
                }
                force = false;
                st.generation += 1;
                let version = st.version;
                let entries: Vec<MemberEntry> = (0..st.states.len())
                    .map(|p| MemberEntry {
                        state: st.states[p],
                        data_blocks: self.data_blocks[p],
                        failed_at: st.failed_at[p],
                    })
                    .collect();
                let sbs: Vec<Option<[u8; SB_BYTES]>> = (0..st.devs.len())
                    .map(|p| {
                        (st.states[p] != MemberState::Failed).then(|| {
                            Superblock {
                                uuid: self.uuid,
                                generation: st.generation,
                                position: p as u16,
                                kind: self.layout.kind(),
                                clean: st.clean,
                                block_size: self.bs as u32,
                                strip_bytes: self.strip_bytes,
                                meta_bytes: self.meta_bytes,
                                region_stripes: self.intent.region_stripes,
                                records_at: self.records_at,
                                role: st.role,
                                members: entries.clone(),
                                name: st.name.clone(),
                                key: st.key,
                            }
                            .encode()
                        })
                    })
                    .collect();
                (
                    View {
                        devs: st.devs.clone(),
                        states: st.states.clone(),
                        stale: None,
                    },
                    sbs,
                    version,
                )
            };
            let res = join_all(sbs.iter().enumerate().filter_map(|(p, sb)| {
                let sb = sb.as_ref()?;
                let dev = &view.devs[p];
                Some(async move {
                    let (_, r) = dev_io(
                        dev,
                        BlockOp::Write { fua: true },
                        0,
                        SB_BYTES,
                        abuf_from(sb),
                    )
                    .await;
                    r.map_err(|_| p)
                })
            }))
            .await;
            for r in res {
                if let Err(p) = r {
                    self.mark_failed(p);
                }
            }
            upto = version;
            let st = self.members.read();
            written = Some((st.generation, st.states.clone()));
        }
        if let Some((generation, states)) = written {
            self.record_states(generation, &states).await;
        }
        let mut st = self.members.write();
        st.persisted_version = st.persisted_version.max(upto);
    }

    /// Reads both record slots of every present member and keeps the newest
    /// valid record (a torn or missing copy leaves the others).
    pub(crate) async fn load_records(&self) {
        if self.records_at == 0 {
            return;
        }
        let view = self.view();
        let bytes = records::AREA_BYTES as usize;
        let reads = join_all((0..view.devs.len()).filter(|&i| view.present(i)).map(|i| {
            let dev = &view.devs[i];
            async move {
                let (buf, r) =
                    dev_io(dev, BlockOp::Read, self.records_at, bytes, abuf(bytes)).await;
                (i, buf, r)
            }
        }))
        .await;
        let mut best: Option<(u64, Vec<u8>)> = None;
        for (i, buf, r) in reads {
            if let Err(e) = r {
                tracing::warn!(
                    "member {i}: record area unreadable ({e}); using the other members'"
                );
                continue;
            }
            for slot in buf.chunks(records::SLOT_BYTES) {
                if let Some((g, data)) =
                    records::decode(slot, &self.uuid, blockdev::RecordKind::Reservations)
                    && best.as_ref().is_none_or(|(bg, _)| g > *bg)
                {
                    best = Some((g, data));
                }
            }
            recycle(buf);
        }
        let mut st = self.records.lock();
        if let Some((generation, data)) = best {
            st.generation = generation;
            st.data = Some(data);
        }
    }

    /// Writes `data` as generation `generation` of the record to every
    /// present member (FUA), into the slot the previous generation does not use.
    pub(crate) async fn write_record(
        &self,
        generation: u64,
        kind: blockdev::RecordKind,
        data: &[u8],
    ) -> Result<(), BlockError> {
        let slot = records::encode(&self.uuid, generation, kind, data);
        let at = records::slot_at(self.records_at, generation);
        match self.write_meta_all(at, &slot).await {
            (0, e) => Err(io_err(format!(
                "volume {}: the {kind:?} record reached no member{}",
                uuid_string(&self.uuid),
                e.map(|e| format!(" (last error: {e})")).unwrap_or_default()
            ))),
            _ => Ok(()),
        }
    }

    /// The record area as a new member must carry it: the current record in
    /// its slot, the other slot empty; and the record's generation. None
    /// while a store holds the record (on a thread of its own; not waited
    /// for here, on an async task's thread).
    pub(crate) fn record_area_image(&self) -> Option<(Vec<u8>, u64)> {
        let mut area = vec![0u8; records::AREA_BYTES as usize];
        let st = self.records.try_lock()?;
        if let Some(data) = &st.data {
            let at = (records::slot_at(0, st.generation)) as usize;
            let slot = records::encode(
                &self.uuid,
                st.generation,
                blockdev::RecordKind::Reservations,
                data,
            );
            area[at..at + records::SLOT_BYTES].copy_from_slice(&slot);
        }
        Some((area, st.generation))
    }
}
