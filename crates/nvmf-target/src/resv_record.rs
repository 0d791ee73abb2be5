//! The reservation record of a namespace whose device several nodes serve
//! in turn (a cluster volume): the state of `reservation.rs` plus the
//! preempted hosts of the stale-write audit, so that the node serving the
//! volume next fences the same hosts and audits the same writes.
//!
//! "FPRS" wraps the "FPRV" record ([`ReservationState::encode_persistent`]),
//! which a device with PTPL alone keeps; [`decode`] reads both.

use nvme_wire::digest::crc32c;

use crate::reservation::{HostId, PersistError, ReservationState};

/// Preempted hosts kept (the newest); bounds the record at
/// 8 + 16 x 16 + (16 + 64 x 24 + 4) + 4 = 1824 bytes, under `RECORD_MAX`.
pub const MAX_PREEMPTED: usize = 16;

const MAGIC: [u8; 4] = *b"FPRS";
const VERSION: u8 = 1;
const HEADER: usize = 8;
const CRC: usize = 4;

/// Why a record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("shared reservation record is {0} bytes, too short")]
    Length(usize),
    #[error("shared reservation record version {0} is not supported (this build reads 1)")]
    Version(u8),
    #[error("shared reservation record checksum mismatch; the record is corrupt")]
    Checksum,
    #[error("shared reservation record is inconsistent: {0}")]
    Invalid(&'static str),
    #[error(transparent)]
    State(#[from] PersistError),
}

/// Magic "FPRS", version, preempted count (u8), 2 reserved bytes, the
/// preempted host IDs, the "FPRV" record of `state`, then CRC32C of all
/// preceding bytes. `preempted` beyond [`MAX_PREEMPTED`] keeps the newest.
pub fn encode(state: &ReservationState, preempted: &[HostId]) -> Vec<u8> {
    let p = &preempted[preempted.len().saturating_sub(MAX_PREEMPTED)..];
    let inner = state.encode_persistent();
    let mut b = Vec::with_capacity(HEADER + p.len() * 16 + inner.len() + CRC);
    b.extend_from_slice(&MAGIC);
    b.push(VERSION);
    b.push(p.len() as u8);
    b.extend_from_slice(&[0, 0]);
    for h in p {
        b.extend_from_slice(h);
    }
    b.extend_from_slice(&inner);
    let crc = crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Reads a record of [`encode`], or a PTPL record ("FPRV": no preempted
/// hosts). Anything else is an error, never a panic.
pub fn decode(b: &[u8]) -> Result<(ReservationState, Vec<HostId>), RecordError> {
    if b.len() >= 4 && b[0..4] != MAGIC {
        return Ok((ReservationState::decode_persistent(b)?, Vec::new()));
    }
    if b.len() < HEADER + CRC {
        return Err(RecordError::Length(b.len()));
    }
    let (body, tail) = b.split_at(b.len() - CRC);
    if crc32c(body) != u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]) {
        return Err(RecordError::Checksum);
    }
    if body[4] != VERSION {
        return Err(RecordError::Version(body[4]));
    }
    if body[6..8] != [0, 0] {
        return Err(RecordError::Invalid("reserved bytes are not zero"));
    }
    let count = usize::from(body[5]);
    if count > MAX_PREEMPTED {
        return Err(RecordError::Invalid("too many preempted hosts"));
    }
    let end = HEADER + count * 16;
    if body.len() < end {
        return Err(RecordError::Length(b.len()));
    }
    let mut preempted: Vec<HostId> = Vec::with_capacity(count);
    for c in body[HEADER..end].chunks_exact(16) {
        let mut h = [0u8; 16];
        h.copy_from_slice(c);
        if preempted.contains(&h) {
            return Err(RecordError::Invalid("a preempted host is listed twice"));
        }
        preempted.push(h);
    }
    let state = ReservationState::decode_persistent(&body[end..])?;
    if preempted.iter().any(|h| state.is_registered(h)) {
        return Err(RecordError::Invalid("a preempted host is registered"));
    }
    Ok((state, preempted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reservation::HostRef;

    fn state() -> ReservationState {
        let mut s = ReservationState::new();
        for (n, key) in [(1u8, 11u64), (2, 22)] {
            let h = HostRef {
                hostid: [n; 16],
                cntlid: u16::from(n),
            };
            s.register(&h, 0, false, 0, key, 0).unwrap();
        }
        let h1 = HostRef {
            hostid: [1; 16],
            cntlid: 1,
        };
        s.acquire(&h1, 0, false, 1, 11, 0).unwrap();
        s
    }

    #[test]
    fn round_trip_keeps_state_and_preempted_hosts() {
        let s = state();
        for p in [vec![], vec![[9u8; 16]], vec![[7; 16], [8; 16]]] {
            let b = encode(&s, &p);
            assert_eq!(
                b.len(),
                HEADER + 16 * p.len() + s.encode_persistent().len() + CRC
            );
            assert_eq!(decode(&b), Ok((s.clone(), p)));
        }
        // the newest MAX_PREEMPTED are kept
        let many: Vec<HostId> = (0..MAX_PREEMPTED as u8 + 3)
            .map(|i| [100 + i; 16])
            .collect();
        let (_, kept) = decode(&encode(&s, &many)).unwrap();
        assert_eq!(kept, many[3..]);
        // a PTPL record reads as a state with nobody preempted
        assert_eq!(decode(&s.encode_persistent()), Ok((s.clone(), vec![])));
    }

    #[test]
    fn rejects_corruption_and_lies() {
        let s = state();
        let good = encode(&s, &[[9; 16]]);
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x10;
            assert!(decode(&b).is_err(), "byte {i}");
        }
        for n in 0..good.len() {
            assert!(decode(&good[..n]).is_err(), "length {n}");
        }
        let resign = |mut b: Vec<u8>| {
            b.truncate(b.len() - CRC);
            let crc = crc32c(&b);
            b.extend_from_slice(&crc.to_le_bytes());
            decode(&b)
        };
        let mut b = good.clone();
        b[4] = 2;
        assert_eq!(resign(b), Err(RecordError::Version(2)));
        // a registered host cannot be a preempted one
        let mut b = good.clone();
        b[HEADER..HEADER + 16].copy_from_slice(&[2; 16]);
        assert!(matches!(resign(b), Err(RecordError::Invalid(_))));
        let mut b = good.clone();
        b[5] = 200;
        assert!(resign(b).is_err());
    }
}
