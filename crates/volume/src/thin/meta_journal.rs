//! Metadata persistence: checkpoints of the maps, the metadata journal
//! (group commit, replay), and cluster reservation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use blockdev::{AlignedBuf, BlockDevice, BlockError, BlockOp, IoDone, IoRequest};
use futures_util::future::join_all;
use parking_lot::Mutex;

use super::extent::{
    EXT_LIST_AT, EXT_LIST_ENTRY, EXT_OFF_MASK, EXT_SHIFT, Extent, ExtentHeader, MAX_EXTENTS,
};

use super::format::{
    PoolGeom, Record, VolMeta, io_err, le_u32, le_u64, owner_code, owner_slot_vc, poisoned_err,
    put_u32, put_u64, seal, sealed, zbuf,
};
use super::pack::{PACK_BLOCK, PACK_OWNER, Packed, Packer};
use super::state::{Alloc, Counters, Journal, Loc, Pending, PoolInner, State, VolInner};
use super::{
    BLOCK, BLOCK_USIZE, CP_MAGIC, JN_MAGIC, JOURNAL_HDR, MAX_VOLUMES, META_IO, RECORD_BYTES,
    RECORDS_PER_BLOCK, ThinError, VOL_ENTRY, VOL_TABLE_BYTES,
};
use crate::crc::crc32c;
use crate::superblock::uuid_string;

impl PoolInner {
    pub(crate) fn new(
        dev: Arc<dyn BlockDevice>,
        dev_bs: u64,
        geom: PoolGeom,
        state: State,
        epoch: u64,
        next_block: u64,
    ) -> PoolInner {
        PoolInner {
            dev,
            dev_bs,
            geom,
            ext: arc_swap::ArcSwap::from_pointee(Vec::new()),
            state: Mutex::new(state),
            alloc: Mutex::new(Alloc::new(geom.clusters)),
            pending: Mutex::new(Pending {
                records: Vec::new(),
                open: 1,
            }),
            journal: tokio::sync::Mutex::new(Journal {
                epoch,
                next_block,
                durable: 0,
            }),
            poisoned: AtomicBool::new(false),
            counters: Counters::default(),
            packer: Mutex::new(Packer::new(geom.pack_blocks.max(1))),
        }
    }

    pub(crate) fn compressed(&self) -> bool {
        self.geom.pack_blocks > 0
    }

    /// Where compressed chunk `x` starts, as a pool address.
    pub(crate) fn packed_at(&self, x: Packed) -> u64 {
        let per = self.geom.pack_blocks;
        self.cluster_at(x.cluster(per)) + x.offset(per) * PACK_BLOCK
    }

    /// Gives back blocks taken for a chunk that was not committed.
    pub(crate) fn unpack(&self, x: Packed) {
        let freed = self.packer.lock().put(x);
        if let Some(p) = freed {
            self.release(&[p]);
        }
    }

    pub(crate) fn check_poisoned(&self) -> Result<(), BlockError> {
        if self.poisoned.load(Ordering::Acquire) {
            Err(poisoned_err())
        } else {
            Ok(())
        }
    }

    pub(crate) fn poison(&self, why: &str) {
        if !self.poisoned.swap(true, Ordering::AcqRel) {
            tracing::error!(
                "thin pool {}: metadata write failed ({why}); refusing writes until reopened",
                uuid_string(&self.geom.uuid)
            );
        }
    }

    /// Where physical cluster `p` starts, as a pool address (the extent
    /// number above [`EXT_SHIFT`], 0 for the base).
    pub(crate) fn cluster_at(&self, p: u32) -> u64 {
        let (p, cb) = (u64::from(p), self.geom.cluster_bytes);
        if p < self.geom.clusters {
            return self.geom.data_at + p * cb;
        }
        let ext = self.ext.load();
        let i = ext.partition_point(|e| e.first + e.clusters <= p);
        match ext.get(i) {
            Some(e) => ((i as u64 + 1) << EXT_SHIFT) | (e.data_at + (p - e.first) * cb),
            // Past the end: the device answers it out of range.
            None => self.geom.device_bytes,
        }
    }

    /// All clusters, the base's and the extents'.
    pub(crate) fn total_clusters(&self) -> u64 {
        self.ext
            .load()
            .last()
            .map_or(self.geom.clusters, |e| e.first + e.clusters)
    }

    pub(crate) async fn io(
        &self,
        op: BlockOp,
        byte_off: u64,
        bytes: u64,
        buf: AlignedBuf,
    ) -> (AlignedBuf, Result<(), BlockError>) {
        let req = |bs: u64, off: u64, buf| IoRequest {
            op,
            lba: off / bs,
            blocks: (bytes / bs) as u32,
            buf,
        };
        let n = (byte_off >> EXT_SHIFT) as usize;
        let IoDone { buf, result } = if n == 0 {
            self.dev.submit(req(self.dev_bs, byte_off, buf)).await
        } else {
            let e = self
                .ext
                .load()
                .get(n - 1)
                .map(|e| (e.dev.clone(), e.dev_bs));
            let Some((dev, bs)) = e else {
                let msg = format!("thin pool: no extent {n} (internal)");
                return (buf, Err(io_err(msg)));
            };
            dev.submit(req(bs, byte_off & EXT_OFF_MASK, buf)).await
        };
        (buf, result)
    }

    /// Flushes the base and every extent.
    pub(crate) async fn flush_dev(&self) -> Result<(), BlockError> {
        let n = self.ext.load().len() as u64;
        let res = join_all(
            (0..=n).map(|i| self.io(BlockOp::Flush, i << EXT_SHIFT, 0, AlignedBuf::new(0))),
        )
        .await;
        res.into_iter().try_for_each(|(_, r)| r)
    }

    /// Writes metadata bytes at `at`, in pieces of at most [`META_IO`].
    pub(crate) async fn write_meta(
        &self,
        at: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), BlockError> {
        let res = join_all(data.chunks(META_IO as usize).enumerate().map(|(i, c)| {
            let mut b = zbuf(c.len());
            b.copy_from_slice(c);
            let off = at + i as u64 * META_IO;
            async move {
                self.io(BlockOp::Write { fua }, off, c.len() as u64, b)
                    .await
                    .1
            }
        }))
        .await;
        res.into_iter().collect()
    }

    pub(crate) async fn read_meta(&self, at: u64, len: u64) -> Result<Vec<u8>, BlockError> {
        let pieces = len.div_ceil(META_IO);
        let res = join_all((0..pieces).map(|i| {
            let n = META_IO.min(len - i * META_IO);
            self.io(BlockOp::Read, at + i * META_IO, n, zbuf(n as usize))
        }))
        .await;
        let mut out = Vec::with_capacity(len as usize);
        for (b, r) in res {
            r?;
            out.extend_from_slice(&b);
        }
        Ok(out)
    }

    // ---- checkpoints

    /// The checkpoint of `epoch`: the base's copy (header, volume table,
    /// the base clusters' owner entries) and one part per extent (its
    /// clusters' owner entries), whose checksums the base header lists.
    pub(crate) fn encode_checkpoint(&self, epoch: u64) -> (Vec<u8>, Vec<Vec<u8>>) {
        let g = &self.geom;
        let ext = self.ext.load();
        let mut b = vec![0u8; g.checkpoint_bytes as usize];
        let st = self.state.lock();
        let mut nvol = 0u32;
        for (slot, v) in st.slots.iter().enumerate() {
            if let Some(v) = v {
                let at = BLOCK_USIZE + slot * VOL_ENTRY;
                v.meta_now().encode(&mut b[at..at + VOL_ENTRY]);
                nvol += 1;
            }
        }
        let owners_at = (BLOCK + VOL_TABLE_BYTES) as usize;
        for (i, &code) in st.owner[..g.clusters as usize].iter().enumerate() {
            put_u64(&mut b, owners_at + i * 8, code);
        }
        let mut parts: Vec<Vec<u8>> = ext
            .iter()
            .map(|e| {
                let mut pb = vec![0u8; e.part_bytes as usize];
                let own = &st.owner[e.first as usize..(e.first + e.clusters) as usize];
                for (i, &code) in own.iter().enumerate() {
                    put_u64(&mut pb, i * 8, code);
                }
                pb
            })
            .collect();
        // A compressed pool: each block of a pack cluster names its chunk.
        let per = g.pack_blocks;
        for v in st.slots.iter().flatten() {
            for (vc, at) in v.map.mapped(0, v.vclusters()) {
                let Loc::Packed(x) = at else { continue };
                let p = u64::from(x.cluster(per));
                let k = ext
                    .iter()
                    .position(|e| (e.first..e.first + e.clusters).contains(&p));
                let (buf, base, first) = match k {
                    Some(k) => (&mut parts[k], ext[k].clusters as usize * 8, ext[k].first),
                    None => (&mut b, owners_at + g.clusters as usize * 8, 0),
                };
                let code = owner_code(v.slot, vc);
                for i in 0..u64::from(x.blocks) {
                    let blk = (p - first) * per + x.offset(per) + i;
                    put_u64(buf, base + blk as usize * 8, code);
                }
            }
        }
        drop(st);
        let body_crc = crc32c(&b[BLOCK_USIZE..]);
        b[0..8].copy_from_slice(&CP_MAGIC);
        b[8..24].copy_from_slice(&g.uuid);
        put_u64(&mut b, 24, epoch);
        put_u64(&mut b, 32, g.clusters);
        put_u32(&mut b, 40, body_crc);
        put_u32(&mut b, 44, nvol);
        put_u32(&mut b, 48, ext.len() as u32);
        for (k, (e, pb)) in ext.iter().zip(&parts).enumerate() {
            let at = EXT_LIST_AT + k * EXT_LIST_ENTRY;
            b[at..at + 16].copy_from_slice(&e.uuid);
            put_u64(&mut b, at + 16, e.clusters);
            put_u32(&mut b, at + 24, crc32c(pb));
        }
        seal(&mut b[..BLOCK_USIZE]);
        (b, parts)
    }

    /// Writes the committed state as checkpoint `epoch + 1` into the copy not
    /// holding the current one (in the base and in every extent), flushes,
    /// and restarts the journal. The caller holds the journal lock. A
    /// failure poisons the pool.
    pub(crate) async fn checkpoint(&self, j: &mut Journal) -> Result<(), BlockError> {
        let epoch = j.epoch + 1;
        let (b, parts) = self.encode_checkpoint(epoch);
        let copy = (epoch % 2) as usize;
        let at = self.geom.checkpoint_at[copy];
        let ext = self.ext.load_full();
        let writes = ext.iter().zip(&parts).enumerate().map(|(k, (e, pb))| {
            let addr = ((k as u64 + 1) << EXT_SHIFT) | e.part_at[copy];
            self.write_meta(addr, pb, false)
        });
        let (base, parts) =
            futures_util::future::join(self.write_meta(at, &b, false), join_all(writes)).await;
        let r = match parts.into_iter().fold(base, Result::and) {
            Ok(()) => self.flush_dev().await,
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            self.poison(&format!("checkpoint: {e}"));
            return Err(e);
        }
        j.epoch = epoch;
        j.next_block = 0;
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The epoch of a checkpoint header, if it is a valid one of this pool's.
    pub(crate) fn checkpoint_epoch(&self, b: &[u8]) -> Option<u64> {
        (b[0..8] == CP_MAGIC
            && sealed(b)
            && b[8..24] == self.geom.uuid
            && le_u64(b, 32) == self.geom.clusters)
            .then(|| le_u64(b, 24))
    }

    /// Reads both checkpoint copies and builds the state of the newest valid
    /// one, with the extents it names, found among `found` (the extent
    /// headers of this pool that the caller's devices hold). A copy with a
    /// torn part is passed over for the older one; an extent the newest
    /// valid copy names but `found` lacks is an error (the older copy
    /// would lose what was written there).
    pub(crate) async fn load_checkpoint(
        &self,
        found: &[(ExtentHeader, Arc<dyn BlockDevice>)],
    ) -> Result<(u64, State, Vec<Extent>), ThinError> {
        let g = &self.geom;
        let mut headers = Vec::new();
        for i in 0..2 {
            let h = self.read_meta(g.checkpoint_at[i], BLOCK).await?;
            if let Some(e) = self.checkpoint_epoch(&h) {
                headers.push((e, i, h));
            }
        }
        headers.sort_unstable_by_key(|h| std::cmp::Reverse(h.0));
        let mut why = Vec::new();
        'copies: for (epoch, i, h) in headers {
            let b = self
                .read_meta(g.checkpoint_at[i], g.checkpoint_bytes)
                .await?;
            if crc32c(&b[BLOCK_USIZE..]) != le_u32(&h, 40) {
                tracing::warn!(
                    "thin pool {}: checkpoint copy {i} (epoch {epoch}) is torn; using the other",
                    uuid_string(&g.uuid)
                );
                why.push(format!("copy {i} (epoch {epoch}) fails its body checksum"));
                continue;
            }
            let n = le_u32(&h, 48) as usize;
            if n > MAX_EXTENTS {
                return Err(ThinError::Corrupt(format!(
                    "checkpoint epoch {epoch} names {n} extents"
                )));
            }
            let mut exts = Vec::with_capacity(n);
            let mut parts = Vec::with_capacity(n);
            let mut first = g.clusters;
            for k in 0..n {
                let at = EXT_LIST_AT + k * EXT_LIST_ENTRY;
                let uuid: [u8; 16] = h[at..at + 16].try_into().expect("16 bytes");
                let clusters = le_u64(&h, at + 16);
                let hit = found.iter().find(|(x, _)| {
                    x.uuid == uuid && x.clusters == clusters && x.cluster_bytes == g.cluster_bytes
                });
                let Some((xh, dev)) = hit else {
                    return Err(ThinError::MissingExtent(uuid_string(&uuid)));
                };
                let e = Extent::from_header(dev.clone(), xh, first, g.pack_blocks)?;
                let pb = read_dev(&e.dev, e.dev_bs, e.part_at[i], e.part_bytes).await?;
                if crc32c(&pb) != le_u32(&h, at + 24) {
                    tracing::warn!(
                        "thin pool {}: checkpoint copy {i} (epoch {epoch}) has a torn part on                          extent {}; using the other",
                        uuid_string(&g.uuid),
                        uuid_string(&uuid)
                    );
                    why.push(format!(
                        "copy {i} (epoch {epoch}): extent {k}'s part is torn"
                    ));
                    continue 'copies;
                }
                first += clusters;
                exts.push(e);
                parts.push(pb);
            }
            return self
                .decode_state(&b, &exts, &parts)
                .map(|st| (epoch, st, exts))
                .map_err(|e| ThinError::Corrupt(format!("checkpoint epoch {epoch}: {e}")));
        }
        if why.is_empty() {
            why.push("neither copy has a valid header".into());
        }
        Err(ThinError::Corrupt(format!(
            "no valid metadata checkpoint: {}",
            why.join("; ")
        )))
    }

    pub(crate) fn decode_state(
        &self,
        b: &[u8],
        exts: &[Extent],
        parts: &[Vec<u8>],
    ) -> Result<State, String> {
        let g = &self.geom;
        let total = exts.last().map_or(g.clusters, |e| e.first + e.clusters);
        let mut st = State::empty(total, g.pack_blocks);
        for slot in 0..MAX_VOLUMES {
            let at = BLOCK_USIZE + slot * VOL_ENTRY;
            if let Some(meta) = VolMeta::decode(&b[at..at + VOL_ENTRY], slot, g.cluster_bytes)? {
                if !meta.hidden && st.names.contains_key(&meta.name) {
                    return Err(format!("two volumes are named {:?}", meta.name));
                }
                st.add_volume(Arc::new(VolInner::new(slot as u16, meta, g.cluster_bytes)));
            }
        }
        st.link_parents()?;
        let owners_at = (BLOCK + VOL_TABLE_BYTES) as usize;
        let per = g.pack_blocks as usize;
        // (cluster, owner entry, where its block codes start, the table)
        let codes_at = owners_at + g.clusters as usize * 8;
        let base = (0..g.clusters).map(|p| {
            let i = p as usize;
            (p, le_u64(b, owners_at + i * 8), codes_at + i * per * 8, b)
        });
        let extents = exts.iter().zip(parts).flat_map(|(e, pb)| {
            (0..e.clusters).map(move |i| {
                let i = i as usize;
                let at = e.clusters as usize * 8 + i * per * 8;
                (e.first + i as u64, le_u64(pb, i * 8), at, pb.as_slice())
            })
        });
        let mut packs = Vec::new();
        for (p, code, codes, table) in base.chain(extents) {
            if per > 0 {
                let packed = (0..per).any(|k| le_u64(table, codes + k * 8) != 0);
                if packed != (code == PACK_OWNER) {
                    return Err(format!(
                        "cluster {p}: owner entry {code:#x} but its blocks say packed = {packed}"
                    ));
                }
                if packed {
                    packs.push((p, codes, table));
                    continue;
                }
            }
            if code == 0 {
                continue;
            }
            let (slot, vc) = owner_slot_vc(code);
            let slot = u16::try_from(slot)
                .map_err(|_| format!("cluster {p}: owner entry {code:#x} names no slot"))?;
            st.apply(&Record::Map {
                slot,
                vc,
                p: p as u32,
            })
            .map_err(|e| format!("owner table: {e}"))?;
        }
        // Each run of blocks with one code is one chunk.
        for (p, codes, table) in packs {
            let mut k = 0;
            while k < per {
                let code = le_u64(table, codes + k * 8);
                let run = (k..per)
                    .take_while(|&i| le_u64(table, codes + i * 8) == code)
                    .count();
                if code != 0 {
                    let (slot, vc) = owner_slot_vc(code);
                    let slot = u16::try_from(slot)
                        .map_err(|_| format!("pack cluster {p}: code {code:#x} names no slot"))?;
                    if st.vol(slot)?.map.get(vc).is_some() {
                        return Err(format!("pack cluster {p}: slot {slot} maps {vc} twice"));
                    }
                    let at = Packed {
                        first: p * per as u64 + k as u64,
                        blocks: run as u32,
                    };
                    st.apply(&Record::PMap { slot, vc, at })
                        .map_err(|e| format!("pack table: {e}"))?;
                }
                k += run;
            }
        }
        Ok(st)
    }

    // ---- journal

    /// Replays the journal blocks of `epoch` onto `st`; returns how many
    /// there were.
    pub(crate) async fn replay(&self, epoch: u64, st: &mut State) -> Result<u64, ThinError> {
        let g = &self.geom;
        let per_read = META_IO / BLOCK;
        let mut block = 0u64;
        let mut records = 0u64;
        'outer: while block < g.journal_blocks {
            let n = per_read.min(g.journal_blocks - block);
            let b = self
                .read_meta(g.journal_at + block * BLOCK, n * BLOCK)
                .await?;
            for blk in b.chunks(BLOCK_USIZE) {
                let valid = blk[0..8] == JN_MAGIC
                    && sealed(blk)
                    && blk[8..24] == g.uuid
                    && le_u64(blk, 24) == epoch
                    && le_u64(blk, 32) == block;
                if !valid {
                    break 'outer;
                }
                let count = le_u32(blk, 40) as usize;
                if count > RECORDS_PER_BLOCK {
                    return Err(ThinError::Corrupt(format!(
                        "journal block {block} holds {count} records"
                    )));
                }
                for i in 0..count {
                    let at = JOURNAL_HDR + i * RECORD_BYTES;
                    // Freed clusters need no bookkeeping: the free bitmap is
                    // built from the owner table after replay.
                    Record::decode(&blk[at..at + RECORD_BYTES])
                        .and_then(|r| st.apply(&r))
                        .map_err(|e| {
                            ThinError::Corrupt(format!("journal block {block} record {i}: {e}"))
                        })?;
                }
                records += count as u64;
                block += 1;
            }
        }
        tracing::debug!(
            "thin pool {}: replayed {block} journal blocks, {records} records",
            uuid_string(&g.uuid)
        );
        Ok(block)
    }

    /// Makes `records` durable (group commit): queues them, and the first
    /// task to get the journal lock writes everything queued so far. On
    /// return the records are applied to the in-memory state.
    pub(crate) async fn commit(&self, records: Vec<Record>) -> Result<(), BlockError> {
        let mine = {
            let mut p = self.pending.lock();
            p.records.extend(records);
            p.open
        };
        let mut j = self.journal.lock().await;
        if j.durable >= mine {
            return Ok(());
        }
        self.check_poisoned()?;
        let (batch, recs) = {
            let mut p = self.pending.lock();
            let b = p.open;
            p.open += 1;
            (b, std::mem::take(&mut p.records))
        };
        match self.write_batch(&mut j, &recs).await {
            Ok(()) => {
                j.durable = batch;
                Ok(())
            }
            Err(e) => {
                self.poison(&format!("journal: {e}"));
                Err(e)
            }
        }
    }

    pub(crate) async fn write_batch(
        &self,
        j: &mut Journal,
        recs: &[Record],
    ) -> Result<(), BlockError> {
        if recs.is_empty() {
            return Ok(());
        }
        // The data of newly mapped clusters must be durable before their record.
        if recs
            .iter()
            .any(|r| matches!(r, Record::Map { .. } | Record::PMap { .. }))
        {
            self.flush_dev().await?;
        }
        let g = &self.geom;
        let mut rest = recs;
        while !rest.is_empty() {
            if j.next_block >= g.journal_blocks {
                self.checkpoint(j).await?;
            }
            let room = (g.journal_blocks - j.next_block).min(META_IO / BLOCK) as usize;
            let n = rest.len().min(room * RECORDS_PER_BLOCK);
            let (now, later) = rest.split_at(n);
            let blocks = now.len().div_ceil(RECORDS_PER_BLOCK);
            let mut b = zbuf(blocks * BLOCK_USIZE);
            for (i, (blk, chunk)) in b
                .chunks_mut(BLOCK_USIZE)
                .zip(now.chunks(RECORDS_PER_BLOCK))
                .enumerate()
            {
                blk[0..8].copy_from_slice(&JN_MAGIC);
                blk[8..24].copy_from_slice(&g.uuid);
                put_u64(blk, 24, j.epoch);
                put_u64(blk, 32, j.next_block + i as u64);
                put_u32(blk, 40, chunk.len() as u32);
                for (k, r) in chunk.iter().enumerate() {
                    let at = JOURNAL_HDR + k * RECORD_BYTES;
                    r.encode(&mut blk[at..at + RECORD_BYTES]);
                }
                seal(blk);
            }
            let at = g.journal_at + j.next_block * BLOCK;
            let len = b.len() as u64;
            let (_, r) = self.io(BlockOp::Write { fua: true }, at, len, b).await;
            r?;
            j.next_block += blocks as u64;
            self.apply_durable(now)?;
            self.counters.commits.fetch_add(1, Ordering::Relaxed);
            self.counters
                .records
                .fetch_add(now.len() as u64, Ordering::Relaxed);
            self.counters
                .journal_blocks
                .fetch_add(blocks as u64, Ordering::Relaxed);
            rest = later;
        }
        Ok(())
    }

    /// Applies records that are durable; clusters they free become allocatable.
    pub(crate) fn apply_durable(&self, recs: &[Record]) -> Result<(), BlockError> {
        let mut freed = Vec::new();
        {
            let mut st = self.state.lock();
            for r in recs {
                match st.apply(r) {
                    Ok(Some(at)) => freed.push(at),
                    Ok(None) => {}
                    Err(e) => {
                        // A bug, not bad input: memory and journal now disagree.
                        self.poison(&format!("internal: {e}"));
                        return Err(io_err(format!("thin pool internal error: {e}")));
                    }
                }
            }
        }
        self.free_places(&freed);
        Ok(())
    }

    /// Makes places allocatable again whose freeing is durable.
    pub(crate) fn free_places(&self, places: &[Loc]) {
        for &at in places {
            match at {
                Loc::Raw(p) => self.release(&[p]),
                Loc::Packed(x) => self.unpack(x),
            }
        }
    }

    pub(crate) fn reserve(&self, n: usize) -> Result<Vec<u32>, BlockError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        self.alloc.lock().take(n).ok_or(BlockError::NoSpace)
    }

    pub(crate) fn release(&self, clusters: &[u32]) {
        if clusters.is_empty() {
            return;
        }
        let mut a = self.alloc.lock();
        for &p in clusters {
            a.put(p);
        }
    }
}

/// Reads `len` bytes at `at` of `dev` (an extent not yet in the pool's
/// routing), in pieces of at most [`META_IO`].
async fn read_dev(
    dev: &Arc<dyn BlockDevice>,
    bs: u64,
    at: u64,
    len: u64,
) -> Result<Vec<u8>, BlockError> {
    let pieces = len.div_ceil(META_IO);
    let res = join_all((0..pieces).map(|i| {
        let n = META_IO.min(len - i * META_IO);
        dev.submit(IoRequest {
            op: BlockOp::Read,
            lba: (at + i * META_IO) / bs,
            blocks: (n / bs) as u32,
            buf: zbuf(n as usize),
        })
    }))
    .await;
    let mut out = Vec::with_capacity(len as usize);
    for d in res {
        d.result?;
        out.extend_from_slice(&d.buf);
    }
    Ok(out)
}
