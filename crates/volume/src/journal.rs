//! The write journal that closes the write hole of degraded stripe updates.
//!
//! While every data column of a stripe is present, the intent bitmap is
//! enough: after a crash, parity is recomputed from the data. Once a data
//! column is missing that no longer works: a crash in the middle of an update
//! leaves surviving data and parity that disagree, and the missing strip,
//! rebuilt from them, comes back as garbage, even in rows the host never
//! wrote. So before a stripe update that has a data column missing writes
//! anything in place, it writes one record to a slot of the journal and waits
//! for it (FUA). The record holds what recovery needs to recompute the parity
//! of the rows the update touches from whatever mix of old and new data landed
//! (as md's partial parity log does, here also for degraded arrays):
//!
//! - **Partial parity** (after a read-modify-write): for every present parity
//!   column `j`, `pp_j = parity_j(every column the update does not write in
//!   place)` over rows `lo..hi`, which is `P_new_j ^ parity_j(new in-place
//!   data)`. Replay: `P_j = pp_j ^ parity_j(in-place data as it is now)`.
//! - **Data** (after reconstruct- or full-stripe writes, where the whole
//!   stripe is in hand): the new contents of the missing data columns over
//!   rows `lo..hi`. Replay: `P = parity(present data as it is now, missing
//!   data from the record)`.
//!
//! The writer picks whichever it has at hand; each is at most
//! `min(present parity, missing data) <= m` strips of payload, against
//! `k + m` strips for a full data journal (md's raid5-cache), and needs no
//! extra reads. Either way, after replay every parity column agrees with the
//! present data and with the missing columns' contents (old in rows the update
//! left alone, old or new where it wrote), so a missing strip reconstructs to
//! what the host last wrote there.
//!
//! Recovery argument. Writes to a stripe are serialised by its lock, so at
//! most one record per stripe is in flight; every older record of the stripe
//! belongs to an update that completed. Replay takes the newest valid record
//! of each stripe (CRC-checked, highest sequence): if its update was cut
//! short, replay finishes it; if it completed, or its record was torn before
//! any in-place write began, replay rewrites the parity the stripe already
//! has. A stripe's next record overwrites its last one (same slot), so an
//! older record can never become the newest again when a slot is reused:
//! records are not retired after each update, they are overwritten by the
//! stripe's next update or another stripe's (a torn overwrite leaves the old,
//! completed record or nothing). Nothing changes a stripe with a missing data
//! column without a newer record, except a rebuild making the missing member
//! present again; so the rebuild retires the stripe's record (zeroes it, FUA)
//! before it writes the stripe, and replay also skips records naming a
//! missing member that is present again. At assembly, after replay, the
//! journal is wiped.
//!
//! A crash while a member is missing *and* the loss of a further member before
//! reassembly is not covered when that member holds the record or data the
//! replay needs (one copy per record, on the stripe's first present parity
//! member); nor is a crash of a healthy volume followed by a member failure
//! (a dirty, degraded restart): that would need a record for every partial
//! write, not only degraded ones.
//!
//! On-member format: the journal takes the part of each member's metadata
//! area after the superblock and the intent bitmap (up to the record area,
//! [`crate::records`], where the superblock names one), cut into slots of
//! `4 KiB + m * strip_bytes`, so every record fits one slot (the offsets
//! follow from the superblock's `meta_bytes`, `region_stripes` and
//! `strip_bytes`). A slot starts with a 4 KiB header, payload after it:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `FLPLJRN1` |
//! | 8 | 16 | volume uuid |
//! | 24 | 8 | sequence (per volume, increasing) |
//! | 32 | 8 | stripe |
//! | 40 | 4 | first row (block in the strip) |
//! | 44 | 4 | rows |
//! | 48 | 1 | kind: 1 data, 2 partial parity |
//! | 49 | 1 | data ranges to read at replay (r) |
//! | 50 | 1 | payload columns (p) |
//! | 52 | 4 | payload bytes (p * rows * block size) |
//! | 56 | 8 | bitmask of member positions missing when written |
//! | 64 | 4 | volume block size |
//! | 128 | 12 * r | range: data column (u16), pad, first row (u32), end row (u32) |
//! | 1024 | 2 * p | payload column: data column (kind 1) or parity index (kind 2) |
//! | 4092 | 4 | CRC32C of header bytes 0..4092 followed by the payload |

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::layout::MAX_MEMBERS;

/// Bytes of a record header; the payload follows.
pub const HEADER_BYTES: usize = 4096;
const MAGIC: [u8; 8] = *b"FLPLJRN1";
const CRC_AT: usize = HEADER_BYTES - 4;
const RANGES_AT: usize = 128;
const RANGE_BYTES: usize = 12;
const COLS_AT: usize = 1024;

/// What a record's payload holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordKind {
    /// New contents of the missing data columns.
    Data,
    /// Parity of everything the update does not write in place.
    PartialParity,
}

/// A journal record, without its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub seq: u64,
    pub stripe: u64,
    /// Rows `lo..lo + rows` of the stripe's strips.
    pub lo: u64,
    pub rows: u64,
    pub kind: RecordKind,
    /// Member positions that were missing for this stripe when it was written.
    pub missing: u64,
    /// Data columns replay reads from the members: (column, first row, end row).
    pub ranges: Vec<(usize, u64, u64)>,
    /// Column of each payload piece (`rows` blocks each, in order).
    pub cols: Vec<usize>,
}

/// The shape a decoded record must fit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub uuid: [u8; 16],
    pub bs: u64,
    pub k: usize,
    pub m: usize,
    pub stripes: u64,
    pub strip_blocks: u64,
}

fn crc32c(header: &[u8], payload: &[u8]) -> u32 {
    let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    d.update(header);
    d.update(payload);
    d.finalize() as u32
}

impl Record {
    /// Fills the header at the start of `slot`, whose payload (after
    /// [`HEADER_BYTES`]) the caller has written.
    pub fn encode(&self, shape: &Shape, slot: &mut [u8]) {
        let (h, payload) = slot.split_at_mut(HEADER_BYTES);
        h.fill(0);
        h[0..8].copy_from_slice(&MAGIC);
        h[8..24].copy_from_slice(&shape.uuid);
        h[24..32].copy_from_slice(&self.seq.to_le_bytes());
        h[32..40].copy_from_slice(&self.stripe.to_le_bytes());
        h[40..44].copy_from_slice(&(self.lo as u32).to_le_bytes());
        h[44..48].copy_from_slice(&(self.rows as u32).to_le_bytes());
        h[48] = match self.kind {
            RecordKind::Data => 1,
            RecordKind::PartialParity => 2,
        };
        h[49] = self.ranges.len() as u8;
        h[50] = self.cols.len() as u8;
        let pbytes = self.cols.len() as u64 * self.rows * shape.bs;
        h[52..56].copy_from_slice(&(pbytes as u32).to_le_bytes());
        h[56..64].copy_from_slice(&self.missing.to_le_bytes());
        h[64..68].copy_from_slice(&(shape.bs as u32).to_le_bytes());
        for (i, &(c, a, b)) in self.ranges.iter().enumerate() {
            let at = RANGES_AT + i * RANGE_BYTES;
            h[at..at + 2].copy_from_slice(&(c as u16).to_le_bytes());
            h[at + 4..at + 8].copy_from_slice(&(a as u32).to_le_bytes());
            h[at + 8..at + 12].copy_from_slice(&(b as u32).to_le_bytes());
        }
        for (i, &c) in self.cols.iter().enumerate() {
            let at = COLS_AT + 2 * i;
            h[at..at + 2].copy_from_slice(&(c as u16).to_le_bytes());
        }
        let crc = crc32c(&h[..CRC_AT], &payload[..pbytes as usize]);
        h[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    }

    /// The record in `slot` and its payload, if the slot holds a whole,
    /// checksummed record of this volume that fits its shape.
    pub fn decode<'a>(shape: &Shape, slot: &'a [u8]) -> Option<(Record, &'a [u8])> {
        if slot.len() < HEADER_BYTES || slot[0..8] != MAGIC || slot[8..24] != shape.uuid {
            return None;
        }
        let h = &slot[..HEADER_BYTES];
        let u32_at = |at: usize| {
            u64::from(u32::from_le_bytes(
                h[at..at + 4].try_into().expect("4 bytes"),
            ))
        };
        let u64_at = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().expect("8 bytes"));
        let (lo, rows, pbytes) = (u32_at(40), u32_at(44), u32_at(52));
        let kind = match h[48] {
            1 => RecordKind::Data,
            2 => RecordKind::PartialParity,
            _ => return None,
        };
        let (nr, nc) = (usize::from(h[49]), usize::from(h[50]));
        if rows == 0
            || lo + rows > shape.strip_blocks
            || u32_at(64) != shape.bs
            || nr > MAX_MEMBERS
            || nc == 0
            || nc > MAX_MEMBERS
            || pbytes != nc as u64 * rows * shape.bs
            || HEADER_BYTES as u64 + pbytes > slot.len() as u64
        {
            return None;
        }
        let payload = &slot[HEADER_BYTES..HEADER_BYTES + pbytes as usize];
        let stored = u32_at(CRC_AT) as u32;
        if crc32c(&h[..CRC_AT], payload) != stored {
            return None;
        }
        let stripe = u64_at(32);
        if stripe >= shape.stripes {
            return None;
        }
        let mut ranges = Vec::with_capacity(nr);
        for i in 0..nr {
            let at = RANGES_AT + i * RANGE_BYTES;
            let c = usize::from(u16::from_le_bytes([h[at], h[at + 1]]));
            let (a, b) = (u32_at(at + 4), u32_at(at + 8));
            if c >= shape.k || a < lo || a >= b || b > lo + rows {
                return None;
            }
            ranges.push((c, a, b));
        }
        let limit = match kind {
            RecordKind::Data => shape.k,
            RecordKind::PartialParity => shape.m,
        };
        let mut cols = Vec::with_capacity(nc);
        for i in 0..nc {
            let at = COLS_AT + 2 * i;
            let c = usize::from(u16::from_le_bytes([h[at], h[at + 1]]));
            if c >= limit {
                return None;
            }
            cols.push(c);
        }
        Some((
            Record {
                seq: u64_at(24),
                stripe,
                lo,
                rows,
                kind,
                missing: u64_at(56),
                ranges,
                cols,
            },
            payload,
        ))
    }
}

/// One slot as the allocator sees it.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    busy: bool,
    /// Stripes whose records may be valid on disk in this slot (two while an
    /// overwrite is in flight or ended in an error).
    owners: [Option<u64>; 2],
}

struct MemberSlots {
    table: Mutex<Vec<Slot>>,
    freed: Notify,
}

/// Where the journal lives on each member and which slots are in use.
pub(crate) struct Journal {
    /// Byte offset of slot 0 in every member.
    pub start: u64,
    pub slot_bytes: u64,
    pub slots: usize,
    seq: AtomicU64,
    members: Box<[MemberSlots]>,
}

/// A slot held by one journal write or retire; released on drop.
pub(crate) struct SlotHold<'a> {
    journal: &'a Journal,
    pub member: usize,
    pub slot: usize,
    /// The stripe whose record this slot now holds, once written.
    written: Option<u64>,
}

impl SlotHold<'_> {
    /// The record reached the disk: the slot now holds it alone.
    pub fn written(&mut self, stripe: u64) {
        self.written = Some(stripe);
    }
}

impl Drop for SlotHold<'_> {
    fn drop(&mut self) {
        let ms = &self.journal.members[self.member];
        let mut t = ms.table.lock();
        let s = &mut t[self.slot];
        s.busy = false;
        if let Some(stripe) = self.written {
            s.owners = [Some(stripe), None];
        }
        drop(t);
        ms.freed.notify_waiters();
    }
}

impl Journal {
    /// Slot size for `m` parity columns of `strip_bytes`: one whole-strip
    /// payload per column.
    pub fn slot_bytes(m: usize, strip_bytes: u64) -> u64 {
        HEADER_BYTES as u64 + m as u64 * strip_bytes
    }

    pub fn new(start: u64, slot_bytes: u64, slots: usize, members: usize) -> Journal {
        Journal {
            start,
            slot_bytes,
            slots,
            seq: AtomicU64::new(1),
            members: (0..members)
                .map(|_| MemberSlots {
                    table: Mutex::new(vec![Slot::default(); slots]),
                    freed: Notify::new(),
                })
                .collect(),
        }
    }

    /// Byte offset of `slot` in a member.
    pub fn slot_offset(&self, slot: usize) -> u64 {
        self.start + slot as u64 * self.slot_bytes
    }

    /// Bytes of the whole journal on each member.
    pub fn bytes(&self) -> u64 {
        self.slots as u64 * self.slot_bytes
    }

    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Keeps new sequence numbers above one found on disk.
    pub fn observe_seq(&self, seq: u64) {
        self.seq.fetch_max(seq.saturating_add(1), Ordering::Relaxed);
    }

    /// Forgets every record: the journal on disk was wiped.
    pub fn reset(&self) {
        for ms in self.members.iter() {
            ms.table.lock().fill(Slot::default());
            ms.freed.notify_waiters();
        }
    }

    /// Waits for a slot of `member` for a record of `stripe`: the one that
    /// holds the stripe's last record if there is one (so at most one record
    /// of a stripe is ever on disk, and overwriting it cannot bring back an
    /// older one), else a free one, preferring one that holds no record.
    pub async fn acquire(&self, member: usize, stripe: u64) -> SlotHold<'_> {
        let ms = &self.members[member];
        loop {
            let notified = std::pin::pin!(ms.freed.notified());
            let mut notified = notified;
            notified.as_mut().enable();
            {
                let mut t = ms.table.lock();
                let pick = match t.iter().position(|s| s.owners.contains(&Some(stripe))) {
                    // Being overwritten for another stripe: wait until it is gone.
                    Some(i) if t[i].busy => None,
                    Some(i) => Some(i),
                    None => t
                        .iter()
                        .position(|s| !s.busy && s.owners == [None, None])
                        .or_else(|| t.iter().position(|s| !s.busy)),
                };
                if let Some(i) = pick {
                    let s = &mut t[i];
                    s.busy = true;
                    // Until the new record is on disk, the old one may survive.
                    s.owners[1] = s.owners[0];
                    return SlotHold {
                        journal: self,
                        member,
                        slot: i,
                        written: None,
                    };
                }
            }
            notified.await;
        }
    }

    /// Slots that may hold a valid record of `stripe`.
    pub fn live(&self, stripe: u64) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (m, ms) in self.members.iter().enumerate() {
            for (i, s) in ms.table.lock().iter().enumerate() {
                if s.owners.contains(&Some(stripe)) {
                    out.push((m, i));
                }
            }
        }
        out
    }

    /// Takes slot `slot` of `member` to retire `stripe`'s record there, once
    /// any write in flight to it is done; None when it no longer holds one.
    pub async fn claim(&self, member: usize, slot: usize, stripe: u64) -> Option<SlotHold<'_>> {
        let ms = &self.members[member];
        loop {
            let notified = std::pin::pin!(ms.freed.notified());
            let mut notified = notified;
            notified.as_mut().enable();
            {
                let mut t = ms.table.lock();
                let s = &mut t[slot];
                if !s.owners.contains(&Some(stripe)) {
                    return None;
                }
                if !s.busy {
                    s.busy = true;
                    return Some(SlotHold {
                        journal: self,
                        member,
                        slot,
                        written: None,
                    });
                }
            }
            notified.await;
        }
    }

    /// A retire wrote zeroes over the slot.
    pub fn cleared(&self, hold: SlotHold<'_>) {
        self.members[hold.member].table.lock()[hold.slot].owners = [None, None];
        drop(hold);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            uuid: [7; 16],
            bs: 4096,
            k: 6,
            m: 2,
            stripes: 100,
            strip_blocks: 16,
        }
    }

    fn sample() -> (Record, Vec<u8>) {
        let rec = Record {
            seq: 99,
            stripe: 42,
            lo: 3,
            rows: 2,
            kind: RecordKind::PartialParity,
            missing: 1 << 5,
            ranges: vec![(0, 3, 5), (4, 4, 5)],
            cols: vec![0, 1],
        };
        let mut slot = vec![0u8; HEADER_BYTES + 2 * 2 * 4096];
        for (i, b) in slot[HEADER_BYTES..].iter_mut().enumerate() {
            *b = (i * 31 % 251) as u8;
        }
        rec.encode(&shape(), &mut slot);
        (rec, slot)
    }

    #[test]
    fn record_roundtrip() {
        let (rec, slot) = sample();
        let (got, payload) = Record::decode(&shape(), &slot).expect("valid record");
        assert_eq!(got, rec);
        assert_eq!(payload, &slot[HEADER_BYTES..]);
    }

    #[test]
    fn torn_or_foreign_records_are_ignored() {
        let (_, slot) = sample();
        // A torn write: the payload's last block did not land.
        let mut torn = slot.clone();
        torn[HEADER_BYTES + 3 * 4096..].fill(0);
        assert!(Record::decode(&shape(), &torn).is_none());
        // A header bit flip.
        let mut flipped = slot.clone();
        flipped[33] ^= 1;
        assert!(Record::decode(&shape(), &flipped).is_none());
        // Another volume's record.
        let other = Shape {
            uuid: [8; 16],
            ..shape()
        };
        assert!(Record::decode(&other, &slot).is_none());
        // A slot too small for the payload it claims.
        assert!(Record::decode(&shape(), &slot[..HEADER_BYTES + 4096]).is_none());
        // Zeroes (a wiped or retired slot).
        assert!(Record::decode(&shape(), &vec![0u8; slot.len()]).is_none());
    }

    #[test]
    fn slots_are_reused_per_stripe_and_retire_waits_for_writers() {
        crate::testutil::block_on(async {
            let j = Journal::new(8192, 4096 + 8192, 2, 3);
            let mut a = j.acquire(1, 10).await;
            a.written(10);
            drop(a);
            // The empty slot is preferred over the one holding stripe 10.
            let b = j.acquire(1, 20).await;
            assert_eq!(b.slot, 1);
            assert_eq!(j.live(10), vec![(1, 0)]);
            // Reusing slot 0 while b is busy: stripe 10 stays live until written.
            let mut c = j.acquire(1, 11).await;
            assert_eq!(c.slot, 0);
            assert_eq!(j.live(10), vec![(1, 0)]);
            c.written(11);
            drop(c);
            assert!(j.live(10).is_empty());
            assert_eq!(j.live(11), vec![(1, 0)]);
            let hold = j.claim(1, 0, 11).await.expect("holds 11");
            j.cleared(hold);
            assert!(j.live(11).is_empty());
            assert!(j.claim(1, 0, 11).await.is_none());
            // A stripe's next record goes where its last one is.
            drop(b);
            let mut d = j.acquire(2, 30).await;
            d.written(30);
            drop(d);
            let e = j.acquire(2, 31).await;
            assert_eq!(e.slot, 1);
            let f = j.acquire(2, 30).await;
            assert_eq!(f.slot, 0);
        });
    }
}
