//! Submission Queue Entry (64 bytes), its SGL descriptor, and the opcodes.

use crate::{WireError, le16, le32, le64, need, put16, put32, put64};

pub const SQE_LEN: usize = 64;
pub const SGL_DESC_LEN: usize = 16;

// Byte offsets in the SQE.
pub const SQE_OFF_OPCODE: usize = 0;
pub const SQE_OFF_FLAGS: usize = 1;
pub const SQE_OFF_CID: usize = 2;
pub const SQE_OFF_NSID: usize = 4;
pub const SQE_OFF_DPTR: usize = 24;
pub const SQE_OFF_CDW10: usize = 40;

/// PSDT (flags bits 6..7): 01 = SGL for data, metadata in one buffer.
pub const PSDT_SGL_MPTR_CONTIG: u8 = 0x40;
pub const PSDT_MASK: u8 = 0xC0;
pub const FUSE_MASK: u8 = 0x03;

// SGL descriptor types (byte 15: type << 4 | subtype).
pub const SGL_DATA_BLOCK_OFFSET: u8 = 0x01; // in-capsule data, address is an offset
pub const SGL_TRANSPORT_DATA_BLOCK: u8 = 0x5A; // data moved by the transport (C2HData, R2T/H2CData)

pub mod admin_opc {
    pub const DELETE_SQ: u8 = 0x00;
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0A;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0C;
    pub const KEEP_ALIVE: u8 = 0x18;
}

pub mod io_opc {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    pub const RESV_REGISTER: u8 = 0x0D;
    pub const RESV_REPORT: u8 = 0x0E;
    pub const RESV_ACQUIRE: u8 = 0x11;
    pub const RESV_RELEASE: u8 = 0x15;
}

pub const FABRICS_OPCODE: u8 = 0x7F;

/// An SGL descriptor as NVMe/TCP uses it: one descriptor in the SQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SglDesc {
    pub addr: u64,
    pub length: u32,
    /// Byte 15: descriptor type (high nibble) and subtype (low nibble).
    pub type_byte: u8,
}

impl SglDesc {
    pub fn decode(b: &[u8]) -> Self {
        SglDesc {
            addr: le64(b, 0),
            length: le32(b, 8),
            type_byte: b[15],
        }
    }
    pub fn encode(&self, b: &mut [u8]) {
        b[..SGL_DESC_LEN].fill(0);
        put64(b, 0, self.addr);
        put32(b, 8, self.length);
        b[15] = self.type_byte;
    }
}

/// A decoded SQE. Command-specific dwords stay raw (`cdw10..cdw15`); the
/// command families read their fields through the helpers below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sqe {
    pub opcode: u8,
    pub flags: u8,
    pub cid: u16,
    /// For Fabrics commands this holds FCTYPE in its low byte.
    pub nsid: u32,
    pub sgl: SglDesc,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
}

impl Sqe {
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        need(b, SQE_LEN)?;
        Ok(Sqe {
            opcode: b[SQE_OFF_OPCODE],
            flags: b[SQE_OFF_FLAGS],
            cid: le16(b, SQE_OFF_CID),
            nsid: le32(b, SQE_OFF_NSID),
            sgl: SglDesc::decode(&b[SQE_OFF_DPTR..SQE_OFF_DPTR + SGL_DESC_LEN]),
            cdw10: le32(b, 40),
            cdw11: le32(b, 44),
            cdw12: le32(b, 48),
            cdw13: le32(b, 52),
            cdw14: le32(b, 56),
            cdw15: le32(b, 60),
        })
    }

    pub fn encode(&self) -> [u8; SQE_LEN] {
        let mut b = [0u8; SQE_LEN];
        b[SQE_OFF_OPCODE] = self.opcode;
        b[SQE_OFF_FLAGS] = self.flags;
        put16(&mut b, SQE_OFF_CID, self.cid);
        put32(&mut b, SQE_OFF_NSID, self.nsid);
        self.sgl
            .encode(&mut b[SQE_OFF_DPTR..SQE_OFF_DPTR + SGL_DESC_LEN]);
        for (i, dw) in [
            self.cdw10, self.cdw11, self.cdw12, self.cdw13, self.cdw14, self.cdw15,
        ]
        .into_iter()
        .enumerate()
        {
            put32(&mut b, 40 + 4 * i, dw);
        }
        b
    }

    /// A zeroed SQE with the SGL flag set, for building commands.
    pub fn new(opcode: u8, cid: u16) -> Self {
        Sqe {
            opcode,
            flags: PSDT_SGL_MPTR_CONTIG,
            cid,
            nsid: 0,
            sgl: SglDesc {
                addr: 0,
                length: 0,
                type_byte: SGL_TRANSPORT_DATA_BLOCK,
            },
            cdw10: 0,
            cdw11: 0,
            cdw12: 0,
            cdw13: 0,
            cdw14: 0,
            cdw15: 0,
        }
    }

    pub fn is_fabrics(&self) -> bool {
        self.opcode == FABRICS_OPCODE
    }
    pub fn fctype(&self) -> u8 {
        self.nsid as u8
    }
    /// Starting LBA of Read/Write/Write Zeroes (cdw10..11).
    pub fn slba(&self) -> u64 {
        u64::from(self.cdw10) | (u64::from(self.cdw11) << 32)
    }
    /// Number of logical blocks, converted from the 0-based field in cdw12.
    pub fn nlb(&self) -> u32 {
        (self.cdw12 & 0xFFFF) + 1
    }
    /// Force Unit Access (cdw12 bit 30).
    pub fn fua(&self) -> bool {
        self.cdw12 & (1 << 30) != 0
    }
    /// Data transfer direction from the opcode's low two bits: 1 host->ctrl, 2 ctrl->host.
    pub fn data_direction(&self) -> u8 {
        self.opcode & 3
    }
}

/// One Dataset Management range (16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmRange {
    pub attributes: u32,
    pub nlb: u32,
    pub slba: u64,
}

pub const DSM_RANGE_LEN: usize = 16;
/// Dataset Management cdw11 bit 2: Attribute Deallocate.
pub const DSM_ATTR_DEALLOCATE: u32 = 1 << 2;

impl DsmRange {
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        need(b, DSM_RANGE_LEN)?;
        Ok(DsmRange {
            attributes: le32(b, 0),
            nlb: le32(b, 4),
            slba: le64(b, 8),
        })
    }
    pub fn encode(&self, b: &mut [u8]) {
        put32(b, 0, self.attributes);
        put32(b, 4, self.nlb);
        put64(b, 8, self.slba);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_fields() {
        let mut s = Sqe::new(io_opc::WRITE, 77);
        s.nsid = 1;
        s.cdw10 = 0x10;
        s.cdw11 = 0x2;
        s.cdw12 = 7 | (1 << 30);
        s.sgl = SglDesc {
            addr: 0,
            length: 4096,
            type_byte: SGL_DATA_BLOCK_OFFSET,
        };
        let b = s.encode();
        let d = Sqe::decode(&b).unwrap();
        assert_eq!(d, s);
        assert_eq!(d.slba(), 0x2_0000_0010);
        assert_eq!(d.nlb(), 8);
        assert!(d.fua());
        assert_eq!(d.data_direction(), 1);
        assert_eq!(b[39], SGL_DATA_BLOCK_OFFSET);
        assert!(Sqe::decode(&b[..63]).is_err());
    }
}
