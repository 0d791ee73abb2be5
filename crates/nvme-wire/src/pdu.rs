//! NVMe/TCP PDUs: the common header, each PDU type's fixed header, TermReq FES codes.
//! Whole digest-aware headers for sending are built in `build` (re-exported here).

use crate::{WireError, le16, le32, need, put16, put32};

mod build;
pub use build::*;

pub const CH_LEN: usize = 8;
pub const ICREQ_LEN: usize = 128;
pub const ICRESP_LEN: usize = 128;
pub const TERMREQ_HLEN: usize = 24;
/// A TermReq carries at most this many bytes of the offending PDU header.
pub const TERMREQ_MAX_DATA: usize = 128;
pub const CAPSULE_CMD_HLEN: usize = 72;
pub const CAPSULE_RESP_HLEN: usize = 24;
pub const DATA_HLEN: usize = 24;
pub const R2T_HLEN: usize = 24;

// Common header field offsets (used as FEI values in TermReqs).
pub const CH_OFF_TYPE: u32 = 0;
pub const CH_OFF_FLAGS: u32 = 1;
pub const CH_OFF_HLEN: u32 = 2;
pub const CH_OFF_PDO: u32 = 3;
pub const CH_OFF_PLEN: u32 = 4;

pub const FLAG_HDGSTF: u8 = 1 << 0;
pub const FLAG_DDGSTF: u8 = 1 << 1;
pub const FLAG_LAST_PDU: u8 = 1 << 2;
pub const FLAG_SUCCESS: u8 = 1 << 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PduType {
    ICReq = 0x00,
    ICResp = 0x01,
    H2CTermReq = 0x02,
    C2HTermReq = 0x03,
    CapsuleCmd = 0x04,
    CapsuleResp = 0x05,
    H2CData = 0x06,
    C2HData = 0x07,
    R2T = 0x09,
}

impl PduType {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => PduType::ICReq,
            0x01 => PduType::ICResp,
            0x02 => PduType::H2CTermReq,
            0x03 => PduType::C2HTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2CData,
            0x07 => PduType::C2HData,
            0x09 => PduType::R2T,
            _ => return None,
        })
    }

    /// The HLEN the spec fixes for this type.
    pub fn hlen(self) -> usize {
        match self {
            PduType::ICReq | PduType::ICResp => ICREQ_LEN,
            PduType::H2CTermReq | PduType::C2HTermReq => TERMREQ_HLEN,
            PduType::CapsuleCmd => CAPSULE_CMD_HLEN,
            PduType::CapsuleResp => CAPSULE_RESP_HLEN,
            PduType::H2CData | PduType::C2HData | PduType::R2T => DATA_HLEN,
        }
    }

    /// Whether a header digest follows the header when digests are on.
    /// ICReq/ICResp and TermReqs never carry digests.
    pub fn digestable(self) -> bool {
        !matches!(
            self,
            PduType::ICReq | PduType::ICResp | PduType::H2CTermReq | PduType::C2HTermReq
        )
    }
}

/// TermReq Fatal Error Status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Fes {
    InvalidHeaderField = 0x01,
    PduSequenceError = 0x02,
    HeaderDigestError = 0x03,
    DataTransferOutOfRange = 0x04,
    DataTransferLimitExceeded = 0x05,
    UnsupportedParameter = 0x06,
}

impl Fes {
    pub fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0x01 => Fes::InvalidHeaderField,
            0x02 => Fes::PduSequenceError,
            0x03 => Fes::HeaderDigestError,
            0x04 => Fes::DataTransferOutOfRange,
            0x05 => Fes::DataTransferLimitExceeded,
            0x06 => Fes::UnsupportedParameter,
            _ => return None,
        })
    }
}

/// The 8-byte header every PDU starts with. `pdu_type` stays raw so that an
/// unknown type can be reported rather than lost in decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    pub pdu_type: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

impl CommonHeader {
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        need(b, CH_LEN)?;
        Ok(CommonHeader {
            pdu_type: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: le32(b, 4),
        })
    }

    pub fn encode(&self, out: &mut [u8]) {
        out[0] = self.pdu_type;
        out[1] = self.flags;
        out[2] = self.hlen;
        out[3] = self.pdo;
        put32(out, 4, self.plen);
    }
}

/// Host to controller: Initialize Connection Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ICReq {
    pub pfv: u16,
    /// Host PDU data alignment, 0-based dwords.
    pub hpda: u8,
    /// bit 0 header digest, bit 1 data digest.
    pub dgst: u8,
    /// Maximum outstanding R2Ts per command, 0-based.
    pub maxr2t: u32,
}

pub const ICREQ_OFF_PFV: u32 = 8;
pub const ICREQ_OFF_HPDA: u32 = 10;
pub const ICREQ_OFF_DGST: u32 = 11;

impl ICReq {
    pub fn decode(pdu: &[u8]) -> Result<Self, WireError> {
        need(pdu, ICREQ_LEN)?;
        Ok(ICReq {
            pfv: le16(pdu, 8),
            hpda: pdu[10],
            dgst: pdu[11],
            maxr2t: le32(pdu, 12),
        })
    }

    pub fn encode(&self) -> [u8; ICREQ_LEN] {
        let mut b = [0u8; ICREQ_LEN];
        CommonHeader {
            pdu_type: PduType::ICReq as u8,
            flags: 0,
            hlen: ICREQ_LEN as u8,
            pdo: 0,
            plen: ICREQ_LEN as u32,
        }
        .encode(&mut b);
        put16(&mut b, 8, self.pfv);
        b[10] = self.hpda;
        b[11] = self.dgst;
        put32(&mut b, 12, self.maxr2t);
        b
    }
}

/// Controller to host: Initialize Connection Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ICResp {
    pub pfv: u16,
    pub cpda: u8,
    pub dgst: u8,
    pub maxh2cdata: u32,
}

impl ICResp {
    pub fn encode(&self) -> [u8; ICRESP_LEN] {
        let mut b = [0u8; ICRESP_LEN];
        CommonHeader {
            pdu_type: PduType::ICResp as u8,
            flags: 0,
            hlen: ICRESP_LEN as u8,
            pdo: 0,
            plen: ICRESP_LEN as u32,
        }
        .encode(&mut b);
        put16(&mut b, 8, self.pfv);
        b[10] = self.cpda;
        b[11] = self.dgst;
        put32(&mut b, 12, self.maxh2cdata);
        b
    }

    pub fn decode(pdu: &[u8]) -> Result<Self, WireError> {
        need(pdu, ICRESP_LEN)?;
        Ok(ICResp {
            pfv: le16(pdu, 8),
            cpda: pdu[10],
            dgst: pdu[11],
            maxh2cdata: le32(pdu, 12),
        })
    }
}

/// H2CData header fields (after the common header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct H2CDataHdr {
    pub cccid: u16,
    pub ttag: u16,
    pub datao: u32,
    pub datal: u32,
}

pub const H2C_OFF_CCCID: u32 = 8;
pub const H2C_OFF_TTAG: u32 = 10;
pub const H2C_OFF_DATAO: u32 = 12;
pub const H2C_OFF_DATAL: u32 = 16;

impl H2CDataHdr {
    pub fn decode(hdr: &[u8]) -> Result<Self, WireError> {
        need(hdr, DATA_HLEN)?;
        Ok(H2CDataHdr {
            cccid: le16(hdr, 8),
            ttag: le16(hdr, 10),
            datao: le32(hdr, 12),
            datal: le32(hdr, 16),
        })
    }

    /// Writes the 24-byte header of an H2CData PDU carrying `datal` bytes.
    pub fn encode(&self, out: &mut [u8], ch: CommonHeader) {
        out[..DATA_HLEN].fill(0);
        ch.encode(out);
        put16(out, 8, self.cccid);
        put16(out, 10, self.ttag);
        put32(out, 12, self.datao);
        put32(out, 16, self.datal);
    }
}

/// C2HData header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct C2HDataHdr {
    pub cccid: u16,
    pub datao: u32,
    pub datal: u32,
}

impl C2HDataHdr {
    pub fn encode(&self, out: &mut [u8], ch: CommonHeader) {
        out[..DATA_HLEN].fill(0);
        ch.encode(out);
        put16(out, 8, self.cccid);
        put32(out, 12, self.datao);
        put32(out, 16, self.datal);
    }

    pub fn decode(hdr: &[u8]) -> Result<Self, WireError> {
        need(hdr, DATA_HLEN)?;
        Ok(C2HDataHdr {
            cccid: le16(hdr, 8),
            datao: le32(hdr, 12),
            datal: le32(hdr, 16),
        })
    }
}

/// Ready to Transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2THdr {
    pub cccid: u16,
    pub ttag: u16,
    pub r2to: u32,
    pub r2tl: u32,
}

impl R2THdr {
    pub fn encode(&self, out: &mut [u8], ch: CommonHeader) {
        out[..R2T_HLEN].fill(0);
        ch.encode(out);
        put16(out, 8, self.cccid);
        put16(out, 10, self.ttag);
        put32(out, 12, self.r2to);
        put32(out, 16, self.r2tl);
    }

    pub fn decode(hdr: &[u8]) -> Result<Self, WireError> {
        need(hdr, R2T_HLEN)?;
        Ok(R2THdr {
            cccid: le16(hdr, 8),
            ttag: le16(hdr, 10),
            r2to: le32(hdr, 12),
            r2tl: le32(hdr, 16),
        })
    }
}

/// H2C or C2H Termination Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermReq {
    pub fes: u16,
    /// Field Error Information: for "invalid header field", the byte offset of the field.
    pub fei: u32,
}

impl TermReq {
    /// Encodes a TermReq of `pdu_type` with up to 128 bytes of the offending
    /// header appended. Returns the number of bytes written into `out`
    /// (which must hold 24 + 128 bytes).
    pub fn encode(&self, pdu_type: PduType, offending: &[u8], out: &mut [u8]) -> usize {
        let n = offending.len().min(TERMREQ_MAX_DATA);
        let plen = TERMREQ_HLEN + n;
        out[..TERMREQ_HLEN].fill(0);
        CommonHeader {
            pdu_type: pdu_type as u8,
            flags: 0,
            hlen: TERMREQ_HLEN as u8,
            pdo: 0,
            plen: plen as u32,
        }
        .encode(out);
        put16(out, 8, self.fes);
        put32(out, 10, self.fei);
        out[TERMREQ_HLEN..plen].copy_from_slice(&offending[..n]);
        plen
    }

    pub fn decode(pdu: &[u8]) -> Result<Self, WireError> {
        need(pdu, TERMREQ_HLEN)?;
        Ok(TermReq {
            fes: le16(pdu, 8),
            fei: le32(pdu, 10),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn icreq_round_trip() {
        let req = ICReq {
            pfv: 0,
            hpda: 3,
            dgst: 3,
            maxr2t: 7,
        };
        let b = req.encode();
        assert_eq!(CommonHeader::decode(&b).unwrap().plen, 128);
        assert_eq!(ICReq::decode(&b).unwrap(), req);
    }

    #[test]
    fn short_input_is_an_error() {
        assert!(CommonHeader::decode(&[0; 7]).is_err());
        assert!(ICReq::decode(&[0; 127]).is_err());
        assert!(H2CDataHdr::decode(&[0; 23]).is_err());
        assert!(TermReq::decode(&[0; 10]).is_err());
    }

    #[test]
    fn termreq_truncates_offending_header() {
        let mut out = [0u8; 200];
        let n = TermReq { fes: 1, fei: 2 }.encode(PduType::C2HTermReq, &[0xAB; 300], &mut out);
        assert_eq!(n, 24 + 128);
        let ch = CommonHeader::decode(&out).unwrap();
        assert_eq!((ch.pdu_type, ch.hlen, ch.plen), (3, 24, 152));
        assert_eq!(TermReq::decode(&out).unwrap(), TermReq { fes: 1, fei: 2 });
    }

    #[test]
    fn data_headers_round_trip() {
        let mut b = [0u8; 24];
        let ch = CommonHeader {
            pdu_type: PduType::H2CData as u8,
            flags: FLAG_LAST_PDU,
            hlen: 24,
            pdo: 24,
            plen: 24 + 512,
        };
        let h = H2CDataHdr {
            cccid: 9,
            ttag: 3,
            datao: 4096,
            datal: 512,
        };
        h.encode(&mut b, ch);
        assert_eq!(H2CDataHdr::decode(&b).unwrap(), h);
        let r = R2THdr {
            cccid: 1,
            ttag: 2,
            r2to: 3,
            r2tl: 4,
        };
        r.encode(&mut b, ch);
        assert_eq!(R2THdr::decode(&b).unwrap(), r);
    }
}
