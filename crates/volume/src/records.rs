//! Device-kept records of a volume ([`blockdev::BlockDevice::store_record`]),
//! e.g. NVMe reservations with Persist Through Power Loss: small state that
//! must travel with the volume's members, never in a side file.
//!
//! Where: an area of [`AREA_BYTES`] in every member's metadata area, at the
//! byte offset the superblock's `records_at` field names (0: the volume has
//! none). New volumes take the last [`AREA_BYTES`] of the metadata area (the
//! bitmap and journal are sized to leave it); a volume made before records
//! existed adopts the same place at assembly when its journal slots leave
//! that much unused at the end of the metadata area, a tail nothing ever
//! wrote (see `Inner::new`).
//!
//! The area holds two 4 KiB slots, written alternately (slot = generation %
//! 2) to every present member with FUA: a torn write spoils one slot of one
//! member and leaves the previous record in the other slot. Loading takes the
//! newest valid slot over every member and both slots, so a volume missing
//! members still finds it. One kind of record today; another kind would get
//! its own area.
//!
//! Slot layout (little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `FLPLREC1` |
//! | 8 | 16 | volume uuid |
//! | 24 | 8 | generation (per volume, increasing) |
//! | 32 | 4 | kind (1: reservations) |
//! | 36 | 4 | record bytes (at most `RECORD_MAX`) |
//! | 64 | len | record |
//! | 4092 | 4 | CRC32C of bytes 0..4092 |

use blockdev::{RECORD_MAX, RecordKind};

use crate::crc::crc32c;

pub const SLOT_BYTES: usize = 4096;
pub const SLOTS: usize = 2;
/// Bytes of the record area on each member.
pub const AREA_BYTES: u64 = (SLOT_BYTES * SLOTS) as u64;
const MAGIC: [u8; 8] = *b"FLPLREC1";
const DATA_AT: usize = 64;
const CRC_AT: usize = SLOT_BYTES - 4;
const _: () = assert!(DATA_AT + RECORD_MAX <= CRC_AT);

fn kind_code(kind: RecordKind) -> u32 {
    match kind {
        RecordKind::Reservations => 1,
    }
}

/// Byte offset of slot `generation % SLOTS` in a member.
pub fn slot_at(records_at: u64, generation: u64) -> u64 {
    records_at + (generation % SLOTS as u64) * SLOT_BYTES as u64
}

pub fn encode(uuid: &[u8; 16], generation: u64, kind: RecordKind, data: &[u8]) -> [u8; SLOT_BYTES] {
    assert!(data.len() <= RECORD_MAX, "callers check the size");
    let mut b = [0u8; SLOT_BYTES];
    b[0..8].copy_from_slice(&MAGIC);
    b[8..24].copy_from_slice(uuid);
    b[24..32].copy_from_slice(&generation.to_le_bytes());
    b[32..36].copy_from_slice(&kind_code(kind).to_le_bytes());
    b[36..40].copy_from_slice(&(data.len() as u32).to_le_bytes());
    b[DATA_AT..DATA_AT + data.len()].copy_from_slice(data);
    let crc = crc32c(&b[..CRC_AT]);
    b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The generation and record a slot holds, if it is a valid slot of this
/// volume and kind (anything else, torn or never written, is `None`).
pub fn decode(b: &[u8], uuid: &[u8; 16], kind: RecordKind) -> Option<(u64, Vec<u8>)> {
    if b.len() < SLOT_BYTES || b[0..8] != MAGIC || b[8..24] != uuid[..] {
        return None;
    }
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
    if u32_at(CRC_AT) != crc32c(&b[..CRC_AT]) || u32_at(32) != kind_code(kind) {
        return None;
    }
    let len = u32_at(36) as usize;
    if len > RECORD_MAX {
        return None;
    }
    let generation = u64::from_le_bytes(b[24..32].try_into().expect("8"));
    Some((generation, b[DATA_AT..DATA_AT + len].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_roundtrip_and_damage() {
        let uuid = [7u8; 16];
        let data = vec![0xa5u8; RECORD_MAX];
        let b = encode(&uuid, 5, RecordKind::Reservations, &data);
        assert_eq!(decode(&b, &uuid, RecordKind::Reservations), Some((5, data)));
        assert_eq!(decode(&b, &[8u8; 16], RecordKind::Reservations), None);
        let mut torn = b;
        torn[2048..].fill(0);
        assert_eq!(decode(&torn, &uuid, RecordKind::Reservations), None);
        assert_eq!(
            decode(&[0u8; SLOT_BYTES], &uuid, RecordKind::Reservations),
            None
        );
        assert_eq!(slot_at(8192, 5), 8192 + 4096);
        assert_eq!(slot_at(8192, 6), 8192);
    }
}
