//! Completion Queue Entry (16 bytes).

use crate::status::Status;
use crate::{WireError, le16, le32, need, put16, put32};

pub const CQE_LEN: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    pub dw0: u32,
    pub dw1: u32,
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    pub status: Status,
}

impl Cqe {
    pub fn encode(&self) -> [u8; CQE_LEN] {
        let mut b = [0u8; CQE_LEN];
        put32(&mut b, 0, self.dw0);
        put32(&mut b, 4, self.dw1);
        put16(&mut b, 8, self.sqhd);
        put16(&mut b, 10, self.sqid);
        put16(&mut b, 12, self.cid);
        put16(&mut b, 14, self.status.to_field());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        need(b, CQE_LEN)?;
        Ok(Cqe {
            dw0: le32(b, 0),
            dw1: le32(b, 4),
            sqhd: le16(b, 8),
            sqid: le16(b, 10),
            cid: le16(b, 12),
            status: Status::from_field(le16(b, 14)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let c = Cqe {
            dw0: 0xdead_beef,
            dw1: 1,
            sqhd: 5,
            sqid: 2,
            cid: 0x1234,
            status: Status::generic(crate::status::SC_LBA_RANGE),
        };
        assert_eq!(Cqe::decode(&c.encode()).unwrap(), c);
    }
}
