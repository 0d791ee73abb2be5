//! Reading the Identify structures a host needs. `nvme_wire::identify` has
//! the target's encoders; the offsets below are the same spec fields.

use nvme_wire::get_str;
use nvme_wire::identify::IDENTIFY_LEN;

// Identify Controller.
const CTRL_SERIAL: std::ops::Range<usize> = 4..24;
const CTRL_MODEL: std::ops::Range<usize> = 24..64;
const CTRL_FIRMWARE: std::ops::Range<usize> = 64..72;
const CTRL_MDTS: usize = 77;
const CTRL_CNTLID: usize = 78;
const CTRL_VER: usize = 80;
const CTRL_CNTRLTYPE: usize = 111;
const CTRL_KAS: usize = 320;
const CTRL_MAXCMD: usize = 514;
const CTRL_NN: usize = 516;
const CTRL_ONCS: usize = 520;
const CTRL_VWC: usize = 525;
const CTRL_SGLS: usize = 536;
const CTRL_SUBNQN: std::ops::Range<usize> = 768..1024;
const CTRL_IOCCSZ: usize = 1792;
const CTRL_IORCSZ: usize = 1796;

// Identify Namespace.
const NS_NSZE: usize = 0;
const NS_NCAP: usize = 8;
const NS_NUSE: usize = 16;
const NS_NSFEAT: usize = 24;
const NS_NLBAF: usize = 25;
const NS_FLBAS: usize = 26;
const NS_DLFEAT: usize = 33;
const NS_NGUID: std::ops::Range<usize> = 104..120;
const NS_EUI64: std::ops::Range<usize> = 120..128;
const NS_LBAF0: usize = 128;
const LBAF_LEN: usize = 4;

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn le64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}
fn text(b: &[u8]) -> String {
    get_str(b)
        .map(|s| s.trim_end_matches(' ').to_string())
        .unwrap_or_else(|_| String::from_utf8_lossy(b).trim_end().to_string())
}

/// Identify Controller, the fields a host uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerInfo {
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// Max data transfer size as a power of two of the minimum page size (4 KiB); 0 = no limit.
    pub mdts: u8,
    pub cntlid: u16,
    pub version: u32,
    /// 1 I/O controller, 2 discovery controller.
    pub cntrltype: u8,
    /// Keep-alive granularity, 100 ms units.
    pub kas: u16,
    pub maxcmd: u16,
    pub nn: u32,
    pub oncs: u16,
    pub vwc: u8,
    pub sgls: u32,
    pub subnqn: String,
    /// I/O queue command capsule size, 16-byte units (64 bytes of SQE plus in-capsule data).
    pub ioccsz: u32,
    pub iorcsz: u32,
}

impl ControllerInfo {
    pub fn parse(b: &[u8]) -> Option<ControllerInfo> {
        if b.len() < IDENTIFY_LEN {
            return None;
        }
        Some(ControllerInfo {
            serial: text(&b[CTRL_SERIAL]),
            model: text(&b[CTRL_MODEL]),
            firmware: text(&b[CTRL_FIRMWARE]),
            mdts: b[CTRL_MDTS],
            cntlid: le16(b, CTRL_CNTLID),
            version: le32(b, CTRL_VER),
            cntrltype: b[CTRL_CNTRLTYPE],
            kas: le16(b, CTRL_KAS),
            maxcmd: le16(b, CTRL_MAXCMD),
            nn: le32(b, CTRL_NN),
            oncs: le16(b, CTRL_ONCS),
            vwc: b[CTRL_VWC],
            sgls: le32(b, CTRL_SGLS),
            subnqn: text(&b[CTRL_SUBNQN]),
            ioccsz: le32(b, CTRL_IOCCSZ),
            iorcsz: le32(b, CTRL_IORCSZ),
        })
    }

    /// In-capsule data bytes the controller takes on I/O queues.
    pub fn in_capsule_data(&self) -> u32 {
        (self.ioccsz * 16).saturating_sub(64)
    }

    /// Largest transfer of one command in bytes, if the controller limits it.
    pub fn max_transfer(&self) -> Option<u64> {
        (self.mdts > 0 && self.mdts < 32).then(|| 4096u64 << self.mdts)
    }
}

/// Identify Namespace, the fields a host uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub nsid: u32,
    /// Size in logical blocks.
    pub nsze: u64,
    pub ncap: u64,
    pub nuse: u64,
    pub lba_size: u32,
    pub nsfeat: u8,
    pub dlfeat: u8,
    /// Namespace Globally Unique Identifier (zeroes: none).
    pub nguid: [u8; 16],
    /// IEEE Extended Unique Identifier (zeroes: none).
    pub eui64: [u8; 8],
}

impl NamespaceInfo {
    /// `None` for an inactive namespace (a zeroed structure) or a bad LBA format.
    pub fn parse(nsid: u32, b: &[u8]) -> Option<NamespaceInfo> {
        if b.len() < IDENTIFY_LEN {
            return None;
        }
        let nsze = le64(b, NS_NSZE);
        let flbas = b[NS_FLBAS];
        // FLBAS bits 3:0 and (NLBAF > 16) bits 6:5 select the format.
        let fmt = usize::from(flbas & 0x0F) | (usize::from((flbas >> 5) & 3) << 4);
        if nsze == 0 || fmt > usize::from(b[NS_NLBAF]) {
            return None;
        }
        let lbads = b[NS_LBAF0 + fmt * LBAF_LEN + 2];
        if !(9..=16).contains(&lbads) {
            return None;
        }
        Some(NamespaceInfo {
            nsid,
            nsze,
            ncap: le64(b, NS_NCAP),
            nuse: le64(b, NS_NUSE),
            lba_size: 1 << lbads,
            nsfeat: b[NS_NSFEAT],
            dlfeat: b[NS_DLFEAT],
            nguid: b[NS_NGUID].try_into().expect("16 bytes"),
            eui64: b[NS_EUI64].try_into().expect("8 bytes"),
        })
    }

    pub fn size_bytes(&self) -> u64 {
        self.nsze * u64::from(self.lba_size)
    }

    /// DLFEAT bits 2:0 = 001b: a deallocated block reads back as zeroes.
    pub fn deallocate_reads_zeroes(&self) -> bool {
        self.dlfeat & 7 == 1
    }
}

/// The active namespace list (CNS 0x02): NSIDs until the first zero.
pub fn parse_ns_list(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .take_while(|&n| n != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_wire::identify::{ControllerInfo as Enc, NamespaceInfo as NsEnc};

    #[test]
    fn reads_what_the_target_writes() {
        let mut b = [0u8; IDENTIFY_LEN];
        Enc {
            vid: 1,
            serial: "SN1",
            model: "flashpool",
            firmware: "0.1.0",
            cntlid: 7,
            version: 0x10300,
            cntrltype: 1,
            mdts: 8,
            oaes: 0,
            ctratt: 0,
            cmic: 0,
            aerl: 3,
            elpe: 0,
            kas: 10,
            maxcmd: 128,
            nn: 1024,
            oncs: 0xC,
            vwc: 1,
            subnqn: "nqn.x:y",
            in_capsule_data: 8192,
            ana: None,
            wctemp: 343,
        }
        .encode(&mut b);
        let c = ControllerInfo::parse(&b).unwrap();
        assert_eq!(
            (c.serial.as_str(), c.model.as_str(), c.firmware.as_str()),
            ("SN1", "flashpool", "0.1.0")
        );
        assert_eq!(
            (c.cntlid, c.mdts, c.maxcmd, c.nn, c.kas),
            (7, 8, 128, 1024, 10)
        );
        assert_eq!(c.subnqn, "nqn.x:y");
        assert_eq!(c.in_capsule_data(), 8192);
        assert_eq!(c.max_transfer(), Some(1 << 20));
        NsEnc {
            nsze: 1000,
            nuse: 1000,
            thin: false,
            rescap: 0,
            lba_shift: 12,
            dealloc_reads_zeroes: true,
            shared: true,
            anagrpid: 1,
            nguid: [5; 16],
            eui64: [6; 8],
            npwg: 1,
            write_protected: false,
        }
        .encode(&mut b);
        let n = NamespaceInfo::parse(3, &b).unwrap();
        assert_eq!(
            (n.nsid, n.nsze, n.lba_size, n.size_bytes()),
            (3, 1000, 4096, 4096 * 1000)
        );
        assert_eq!((n.nguid, n.eui64), ([5; 16], [6; 8]));
        assert!(n.deallocate_reads_zeroes());
        assert!(NamespaceInfo::parse(3, &[0u8; IDENTIFY_LEN]).is_none());
        let mut l = [0u8; 16];
        l[0] = 1;
        l[4] = 5;
        assert_eq!(parse_ns_list(&l), vec![1, 5]);
    }
}
