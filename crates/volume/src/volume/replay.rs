//! Write-journal recovery and upkeep on the members: replay at assembly,
//! wipe, and retiring a stripe's records (the format and slot accounting
//! are in `crate::journal`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use blockdev::BlockOp;

use super::member_io::{abuf, dev_io, recycle, zbuf};
use super::{Inner, VolumeError};
use crate::journal::{HEADER_BYTES, Record, RecordKind, Shape};

impl Inner {
    /// Replays the newest valid record of every stripe (see the module
    /// comment), then wipes the journal. Returns the stripes replayed.
    pub(crate) async fn replay_journal(&self) -> Result<u64, VolumeError> {
        let Some(j) = &self.journal else {
            return Ok(0);
        };
        let shape = self.journal_shape();
        let view = self.view();
        let bytes = j.bytes() as usize;
        let mut newest: HashMap<u64, (Record, Vec<u8>)> = HashMap::new();
        for i in (0..view.devs.len()).filter(|&i| view.present(i)) {
            let (buf, r) = dev_io(&view.devs[i], BlockOp::Read, j.start, bytes, abuf(bytes)).await;
            if r.is_err() {
                self.mark_failed(i);
                continue;
            }
            for slot in buf.chunks_exact(j.slot_bytes as usize) {
                let Some((rec, payload)) = Record::decode(&shape, slot) else {
                    continue;
                };
                j.observe_seq(rec.seq);
                if newest.get(&rec.stripe).is_none_or(|(o, _)| o.seq < rec.seq) {
                    newest.insert(rec.stripe, (rec, payload.to_vec()));
                }
            }
            recycle(buf);
        }
        let mut records: Vec<(Record, Vec<u8>)> = newest.into_values().collect();
        records.sort_by_key(|(r, _)| r.stripe);
        let mut replayed = 0;
        for (rec, payload) in &records {
            let _g = self.stripe_lock(rec.stripe).lock().await;
            if self.replay_record(rec, payload).await? {
                replayed += 1;
            }
        }
        if !records.is_empty() {
            tracing::info!(
                "write journal: replayed {replayed} of {} stripe records",
                records.len()
            );
        }
        self.stats
            .journal_replayed
            .fetch_add(replayed, Ordering::Relaxed);
        self.wipe_journal().await;
        Ok(replayed)
    }

    pub(crate) fn journal_shape(&self) -> Shape {
        Shape {
            uuid: self.uuid,
            bs: self.bs,
            k: self.parity.k,
            m: self.parity.m,
            stripes: self.layout.stripes(),
            strip_blocks: self.layout.strip_blocks(),
        }
    }

    /// Recomputes the parity of one record's rows. Ok(false) when the record
    /// is stale or the members it needs are gone.
    async fn replay_record(&self, rec: &Record, payload: &[u8]) -> Result<bool, VolumeError> {
        let (k, m) = (self.parity.k, self.parity.m);
        let s = rec.stripe;
        let l = &self.layout;
        for _attempt in 0..=l.members() {
            if self.fence.is_set() {
                return Err(VolumeError::Fenced(self.fence.error().to_string()));
            }
            let view = self.view();
            let avail = |c: usize| view.avail(l.column_member(s, c), s);
            let back =
                (0..k + m).any(|c| rec.missing & (1u64 << l.column_member(s, c)) != 0 && avail(c));
            if back {
                tracing::debug!("journal record of stripe {s} is stale: a missing member is back");
                return Ok(false);
            }
            if let Some(&(d, _, _)) = rec.ranges.iter().find(|r| !avail(r.0)) {
                tracing::warn!(
                    "journal record of stripe {s} cannot be replayed: data column {d} (member {}) \
                     is gone too; rows {}..{} of the stripe may be inconsistent",
                    l.column_member(s, d),
                    rec.lo,
                    rec.lo + rec.rows
                );
                return Ok(false);
            }
            let len = (rec.rows * self.bs) as usize;
            let reads = futures_util::future::join_all(rec.ranges.iter().map(|&(d, a, b)| {
                self.col_read(&view, l.column_member(s, d), l.strip_lba(s, a), b - a)
            }))
            .await;
            let got = match crate::volume::collect_failed(reads) {
                Ok(g) => g,
                Err(crate::volume::OpError::Members(f)) => {
                    f.iter().for_each(|&i| self.mark_failed(i));
                    continue;
                }
                Err(crate::volume::OpError::Fatal(e)) => {
                    return Err(VolumeError::Rebuild(format!("journal replay: {e}")));
                }
            };
            let mut data: Vec<_> = (0..k).map(|_| zbuf(len)).collect();
            for (&(d, a, _), b) in rec.ranges.iter().zip(got) {
                let at = ((a - rec.lo) * self.bs) as usize;
                data[d][at..at + b.len()].copy_from_slice(&b);
                recycle(b);
            }
            if rec.kind == RecordKind::Data {
                for (i, &d) in rec.cols.iter().enumerate() {
                    data[d].copy_from_slice(&payload[i * len..(i + 1) * len]);
                }
            }
            let mut par: Vec<_> = (0..m).map(|_| abuf(len)).collect();
            {
                let drefs: Vec<&[u8]> = data.iter().map(|b| &b[..]).collect();
                let mut prefs: Vec<&mut [u8]> = par.iter_mut().map(|b| &mut b[..]).collect();
                self.parity.encode(&drefs, &mut prefs)?;
            }
            let targets: Vec<usize> = match rec.kind {
                RecordKind::Data => (0..m).filter(|&j| avail(k + j)).collect(),
                RecordKind::PartialParity => {
                    for (i, &j) in rec.cols.iter().enumerate() {
                        crate::parity::xor_into(&mut par[j], &payload[i * len..(i + 1) * len]);
                    }
                    rec.cols.iter().copied().filter(|&j| avail(k + j)).collect()
                }
            };
            let lba = l.strip_lba(s, rec.lo);
            let mut par: Vec<Option<_>> = par.into_iter().map(Some).collect();
            let writes = futures_util::future::join_all(targets.iter().map(|&j| {
                let b = par[j].take().expect("each parity column once");
                self.col_write(&view, l.column_member(s, k + j), lba, b, true)
            }))
            .await;
            match crate::volume::collect_failed(writes) {
                Ok(_) => return Ok(true),
                Err(crate::volume::OpError::Members(f)) => {
                    f.iter().for_each(|&i| self.mark_failed(i));
                }
                Err(crate::volume::OpError::Fatal(e)) => {
                    return Err(VolumeError::Rebuild(format!("journal replay: {e}")));
                }
            }
        }
        Ok(false)
    }

    /// Zeroes the journal on every present member, so no record outlives the
    /// state it was written for.
    pub(crate) async fn wipe_journal(&self) {
        let Some(j) = &self.journal else { return };
        let view = self.view();
        let bytes = j.bytes() as usize;
        let res = futures_util::future::join_all(
            (0..view.devs.len()).filter(|&i| view.present(i)).map(|i| {
                let dev = &view.devs[i];
                async move {
                    let (_, r) = dev_io(
                        dev,
                        BlockOp::Write { fua: true },
                        j.start,
                        bytes,
                        zbuf(bytes),
                    )
                    .await;
                    r.map_err(|_| i)
                }
            }),
        )
        .await;
        for r in res {
            if let Err(i) = r {
                self.mark_failed(i);
            }
        }
        j.reset();
    }

    /// Zeroes every record of `stripe` (but those on `except`), so none can
    /// be replayed over writes that no longer need a record: before a
    /// rebuild makes a missing member present again for the stripe. The
    /// caller holds the stripe lock.
    pub(crate) async fn retire_journal(&self, stripe: u64, except: Option<usize>) {
        let Some(j) = &self.journal else { return };
        let live: Vec<(usize, usize)> = j
            .live(stripe)
            .into_iter()
            .filter(|&(m, _)| Some(m) != except)
            .collect();
        if live.is_empty() {
            return;
        }
        let view = self.view();
        for (member, slot) in live {
            let Some(hold) = j.claim(member, slot, stripe).await else {
                continue;
            };
            if !view.present(member) {
                // Its records are never read again.
                j.cleared(hold);
                continue;
            }
            let (_, r) = dev_io(
                &view.devs[member],
                BlockOp::Write { fua: true },
                j.slot_offset(slot),
                HEADER_BYTES,
                zbuf(HEADER_BYTES),
            )
            .await;
            if r.is_err() {
                self.mark_failed(member);
            }
            j.cleared(hold);
        }
    }
}
