//! Fabrics commands (opcode 0x7F): Connect, Property Get/Set, Disconnect; controller properties.

use crate::sqe::Sqe;
use crate::{WireError, get_str, le16, need, put_str, put16};

pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTH_SEND: u8 = 0x05;
    pub const AUTH_RECV: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}

pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
pub const NQN_FIELD_LEN: usize = 256;
/// Longest NQN the spec allows (bytes, without the terminating NUL).
pub const NQN_MAX_LEN: usize = 223;
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;

/// Connect command fields from the SQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectCmd {
    pub recfmt: u16,
    pub qid: u16,
    /// 0-based submission queue size.
    pub sqsize: u16,
    pub cattr: u8,
    pub kato_ms: u32,
}

// Offsets inside the SQE, reported as IPO in "Connect Invalid Parameters".
pub const CONNECT_SQE_OFF_QID: u16 = 42;
pub const CONNECT_SQE_OFF_SQSIZE: u16 = 44;
// Offsets inside the Connect data, reported as IPO too.
pub const CONNECT_DATA_OFF_HOSTID: u16 = 0;
pub const CONNECT_DATA_OFF_CNTLID: u16 = 16;
pub const CONNECT_DATA_OFF_SUBNQN: u16 = 256;
pub const CONNECT_DATA_OFF_HOSTNQN: u16 = 512;
pub const CONNECT_DATA_LEN: usize = 1024;
/// Connect cattr bit 2: the host disables SQ flow control.
pub const CATTR_DISABLE_SQFLOW: u8 = 1 << 2;

impl ConnectCmd {
    pub fn from_sqe(s: &Sqe) -> Self {
        ConnectCmd {
            recfmt: s.cdw10 as u16,
            qid: (s.cdw10 >> 16) as u16,
            sqsize: s.cdw11 as u16,
            cattr: (s.cdw11 >> 16) as u8,
            kato_ms: s.cdw12,
        }
    }
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(crate::sqe::FABRICS_OPCODE, cid);
        s.nsid = u32::from(fctype::CONNECT);
        s.cdw10 = u32::from(self.recfmt) | (u32::from(self.qid) << 16);
        s.cdw11 = u32::from(self.sqsize) | (u32::from(self.cattr) << 16);
        s.cdw12 = self.kato_ms;
        s
    }
}

/// The 1024-byte Connect data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    pub hostid: [u8; 16],
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

/// Why Connect data could not be read; each names the field (IPO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectDataError {
    Short,
    BadSubNqn,
    BadHostNqn,
}

impl ConnectData {
    pub fn decode(b: &[u8]) -> Result<Self, ConnectDataError> {
        if b.len() < CONNECT_DATA_LEN {
            return Err(ConnectDataError::Short);
        }
        let nqn = |off: usize, e| {
            let field = &b[off..off + NQN_FIELD_LEN];
            let s = get_str(field).map_err(|_| e)?;
            if s.is_empty() || s.len() > NQN_MAX_LEN {
                return Err(e);
            }
            Ok(s.to_string())
        };
        Ok(ConnectData {
            hostid: b[0..16].try_into().expect("16 bytes"),
            cntlid: le16(b, 16),
            subnqn: nqn(256, ConnectDataError::BadSubNqn)?,
            hostnqn: nqn(512, ConnectDataError::BadHostNqn)?,
        })
    }

    pub fn encode(&self) -> [u8; CONNECT_DATA_LEN] {
        let mut b = [0u8; CONNECT_DATA_LEN];
        b[0..16].copy_from_slice(&self.hostid);
        put16(&mut b, 16, self.cntlid);
        put_str(&mut b[256..512], &self.subnqn, 0);
        put_str(&mut b[512..768], &self.hostnqn, 0);
        b
    }
}

/// Property Get/Set fields. `size8` is ATTRIB bit 0 (8-byte property).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertyCmd {
    pub size8: bool,
    pub offset: u32,
    pub value: u64,
}

impl PropertyCmd {
    pub fn from_sqe(s: &Sqe) -> Self {
        PropertyCmd {
            size8: s.cdw10 & 1 != 0,
            offset: s.cdw11,
            value: u64::from(s.cdw12) | (u64::from(s.cdw13) << 32),
        }
    }
    pub fn to_sqe(&self, fctype: u8, cid: u16) -> Sqe {
        let mut s = Sqe::new(crate::sqe::FABRICS_OPCODE, cid);
        s.nsid = u32::from(fctype);
        s.cdw10 = u32::from(self.size8);
        s.cdw11 = self.offset;
        s.cdw12 = self.value as u32;
        s.cdw13 = (self.value >> 32) as u32;
        s
    }
}

/// Controller property offsets and register bits.
pub mod prop {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1C;
    pub const NSSR: u32 = 0x20;

    pub const CC_EN: u32 = 1 << 0;
    pub const CC_CSS_SHIFT: u32 = 4;
    pub const CC_MPS_SHIFT: u32 = 7;
    pub const CC_SHN_SHIFT: u32 = 14;
    pub const CC_IOSQES_SHIFT: u32 = 16;
    pub const CC_IOCQES_SHIFT: u32 = 20;

    pub const CC_AMS_SHIFT: u32 = 11;
    /// CC.CSS values: NVM command set; all I/O command sets that CAP.CSS
    /// bit 43 announces; admin command set only (needs CAP.CSS bit 44).
    pub const CC_CSS_NVM: u32 = 0b000;
    pub const CC_CSS_ALL_IOCS: u32 = 0b110;
    pub const CC_CSS_ADMIN_ONLY: u32 = 0b111;
    /// CC.IOSQES / CC.IOCQES the NVM command set needs (64- and 16-byte entries, log2).
    pub const CC_IOSQES_NVM: u32 = 6;
    pub const CC_IOCQES_NVM: u32 = 4;

    pub const CSTS_RDY: u32 = 1 << 0;
    pub const CSTS_CFS: u32 = 1 << 1;
    pub const CSTS_SHST_MASK: u32 = 3 << 2;
    pub const CSTS_SHST_COMPLETE: u32 = 2 << 2;

    /// CAP.CSS bit 37: the NVM command set.
    pub const CAP_CSS_NVM: u64 = 1 << 37;
    /// CAP.CSS bit 43: one or more I/O command sets, chosen with CC.CSS 110b
    /// and reported by Identify CNS 1Ch.
    pub const CAP_CSS_IOCS: u64 = 1 << 43;
    /// CAP.CSS bit 44: no I/O command set (CC.CSS 111b). Not advertised.
    pub const CAP_CSS_ADMIN_ONLY: u64 = 1 << 44;

    /// CAP: MQES (0-based), CQR, TO (500 ms units), CSS bits 37 (NVM) and 43
    /// (I/O command sets), MPSMIN = MPSMAX = 4 KiB.
    pub fn cap(max_queue_depth: u16, timeout_500ms: u8) -> u64 {
        u64::from(max_queue_depth - 1)
            | (1 << 16)
            | (u64::from(timeout_500ms) << 24)
            | CAP_CSS_NVM
            | CAP_CSS_IOCS
    }
    pub const VS_1_3: u32 = 0x0001_0300;
    /// NVMe 1.4: what we implement (ANA and the I/O command set CNS values need it).
    pub const VS_1_4: u32 = 0x0001_0400;
}

/// Discovery log page header and entries.
pub mod discovery {
    use super::*;
    use crate::put64;

    pub const HEADER_LEN: usize = 1024;
    pub const ENTRY_LEN: usize = 1024;
    pub const TRTYPE_TCP: u8 = 3;
    pub const ADRFAM_IPV4: u8 = 1;
    pub const ADRFAM_IPV6: u8 = 2;
    pub const SUBTYPE_REFERRAL: u8 = 1;
    pub const SUBTYPE_NVME: u8 = 2;
    pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;
    /// TREQ: secure channel not specified; bit 2: the port supports disabling SQ flow control.
    pub const TREQ_DISABLE_SQFLOW: u8 = 1 << 2;
    /// TREQ bits 1:0: a secure channel is required / not required.
    pub const TREQ_REQUIRED: u8 = 1;
    pub const TREQ_NOT_REQUIRED: u8 = 2;
    /// TSAS SECTYPE of TCP: no security, or TLS 1.3.
    pub const SECTYPE_NONE: u8 = 0;
    pub const SECTYPE_TLS13: u8 = 2;

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Entry {
        pub adrfam: u8,
        pub subtype: u8,
        pub treq: u8,
        /// TSAS byte 0 for TCP.
        pub sectype: u8,
        pub portid: u16,
        pub cntlid: u16,
        pub asqsz: u16,
        pub trsvcid: String,
        pub subnqn: String,
        pub traddr: String,
    }

    impl Entry {
        pub fn encode(&self, b: &mut [u8]) {
            b[..ENTRY_LEN].fill(0);
            b[0] = TRTYPE_TCP;
            b[1] = self.adrfam;
            b[2] = self.subtype;
            b[3] = self.treq;
            put16(b, 4, self.portid);
            put16(b, 6, self.cntlid);
            put16(b, 8, self.asqsz);
            put_str(&mut b[32..64], &self.trsvcid, b' ');
            put_str(&mut b[256..512], &self.subnqn, 0);
            put_str(&mut b[512..768], &self.traddr, b' ');
            b[768] = self.sectype;
        }

        pub fn decode(b: &[u8]) -> Result<Self, WireError> {
            need(b, ENTRY_LEN)?;
            let trim = |f: &[u8]| -> Result<String, WireError> {
                Ok(get_str(f)?.trim_end_matches(' ').to_string())
            };
            Ok(Entry {
                adrfam: b[1],
                subtype: b[2],
                treq: b[3],
                sectype: b[768],
                portid: le16(b, 4),
                cntlid: le16(b, 6),
                asqsz: le16(b, 8),
                trsvcid: trim(&b[32..64])?,
                subnqn: trim(&b[256..512])?,
                traddr: trim(&b[512..768])?,
            })
        }
    }

    /// Writes the whole log (header + entries) into `out`, which must hold
    /// `HEADER_LEN + entries.len() * ENTRY_LEN` bytes.
    pub fn encode_log(genctr: u64, entries: &[Entry], out: &mut [u8]) {
        out[..HEADER_LEN].fill(0);
        put64(out, 0, genctr);
        put64(out, 8, entries.len() as u64);
        put16(out, 16, 0); // recfmt
        for (i, e) in entries.iter().enumerate() {
            let off = HEADER_LEN + i * ENTRY_LEN;
            e.encode(&mut out[off..off + ENTRY_LEN]);
        }
    }

    pub fn log_len(entries: usize) -> usize {
        HEADER_LEN + entries * ENTRY_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_round_trip() {
        let c = ConnectCmd {
            recfmt: 0,
            qid: 3,
            sqsize: 127,
            cattr: CATTR_DISABLE_SQFLOW,
            kato_ms: 5000,
        };
        assert_eq!(ConnectCmd::from_sqe(&c.to_sqe(9)), c);
        let d = ConnectData {
            hostid: [7; 16],
            cntlid: CNTLID_DYNAMIC,
            subnqn: "nqn.2026-01.io.flashpool:a".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:x".into(),
        };
        assert_eq!(ConnectData::decode(&d.encode()).unwrap(), d);
    }

    #[test]
    fn connect_data_rejects_bad_nqns() {
        let mut b = [0u8; CONNECT_DATA_LEN];
        assert_eq!(ConnectData::decode(&b), Err(ConnectDataError::BadSubNqn));
        b[256] = b'a';
        assert_eq!(ConnectData::decode(&b), Err(ConnectDataError::BadHostNqn));
        b[512..768].fill(b'h'); // 256 bytes without a NUL: over the 223-byte limit
        assert_eq!(ConnectData::decode(&b), Err(ConnectDataError::BadHostNqn));
        assert_eq!(ConnectData::decode(&b[..100]), Err(ConnectDataError::Short));
    }

    #[test]
    fn discovery_entry_round_trip() {
        let e = discovery::Entry {
            adrfam: discovery::ADRFAM_IPV4,
            subtype: discovery::SUBTYPE_NVME,
            treq: discovery::TREQ_DISABLE_SQFLOW | discovery::TREQ_REQUIRED,
            sectype: discovery::SECTYPE_TLS13,
            portid: 1,
            cntlid: CNTLID_DYNAMIC,
            asqsz: 32,
            trsvcid: "4420".into(),
            subnqn: "nqn.x".into(),
            traddr: "127.0.0.1".into(),
        };
        let mut out = vec![0u8; discovery::log_len(1)];
        discovery::encode_log(5, std::slice::from_ref(&e), &mut out);
        assert_eq!(discovery::Entry::decode(&out[1024..]).unwrap(), e);
        assert_eq!(crate::le64(&out, 8), 1);
    }
}
