//! Identify data structures (CNS 00h, 01h, 02h, 03h, 05h, 06h, 08h, 1Ch), 4096 bytes each.

use crate::{put_str, put16, put32, put64};

pub const IDENTIFY_LEN: usize = 4096;

pub mod cns {
    pub const NAMESPACE: u8 = 0x00;
    pub const CONTROLLER: u8 = 0x01;
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    pub const NS_ID_DESCRIPTORS: u8 = 0x03;
    /// I/O command set specific Identify Namespace (CSI in CDW11 bits 31:24).
    pub const CS_NAMESPACE: u8 = 0x05;
    /// I/O command set specific Identify Controller.
    pub const CS_CONTROLLER: u8 = 0x06;
    /// I/O command set independent Identify Namespace.
    pub const CS_INDEP_NAMESPACE: u8 = 0x08;
    /// I/O Command Set data structure: the supported command set combinations.
    pub const IO_COMMAND_SETS: u8 = 0x1C;
}

/// Command Set Identifiers (CSI).
pub mod csi {
    pub const NVM: u8 = 0x00;
}

/// The CSI field of an Identify command (CDW11 bits 31:24).
pub fn identify_csi(cdw11: u32) -> u8 {
    (cdw11 >> 24) as u8
}

/// Controller types (CNTRLTYPE).
pub const CNTRLTYPE_IO: u8 = 1;
pub const CNTRLTYPE_DISCOVERY: u8 = 2;

// OAES bits.
pub const OAES_NS_ATTR: u32 = 1 << 8;
pub const OAES_ANA_CHANGE: u32 = 1 << 11;
pub const OAES_DISC_LOG_CHANGE: u32 = 1 << 31;

// CMIC bits.
pub const CMIC_MULTI_PORT: u8 = 1 << 0;
pub const CMIC_MULTI_CTRL: u8 = 1 << 1;
pub const CMIC_ANA: u8 = 1 << 3;

// ONCS bits.
pub const ONCS_DSM: u16 = 1 << 2;
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
/// Save field in Set Features and Select field in Get Features supported.
pub const ONCS_SAVE_SELECT: u16 = 1 << 4;

/// VWC: a volatile write cache is present (bit 0); bits 2:1 = 10b: Flush
/// with NSID FFFFFFFFh is not supported.
pub const VWC_PRESENT_NO_BROADCAST_FLUSH: u8 = 0b101;

/// NSFEAT bits.
pub const NSFEAT_THIN: u8 = 1 << 0;
pub const NSFEAT_OPTPERF: u8 = 1 << 4;
/// NMIC bit 0: the namespace may be attached to several controllers.
pub const NMIC_SHARED: u8 = 1 << 0;
/// NSTAT bit 0 (CNS 08h): the namespace is ready.
pub const NSTAT_READY: u8 = 1 << 0;

/// CTRATT bit 0: 128-bit host identifier; bit 6: traffic-based keep alive.
pub const CTRATT_HOSTID_128: u32 = 1 << 0;
pub const CTRATT_TBKAS: u32 = 1 << 6;

/// SGLS: SGLs supported (no alignment), SGL offsets supported (bit 20).
pub const SGLS_TCP: u32 = 0x0010_0001;

/// What the target fills into Identify Controller.
#[derive(Debug, Clone)]
pub struct ControllerInfo<'a> {
    pub vid: u16,
    pub serial: &'a str,
    pub model: &'a str,
    pub firmware: &'a str,
    pub cntlid: u16,
    pub version: u32,
    pub cntrltype: u8,
    /// Max data transfer size as a power of two of 4 KiB pages (0 = no limit).
    pub mdts: u8,
    pub oaes: u32,
    pub ctratt: u32,
    pub cmic: u8,
    /// Async event request limit, 0-based.
    pub aerl: u8,
    /// Error log entries, 0-based.
    pub elpe: u8,
    /// Keep-alive granularity in 100 ms units.
    pub kas: u16,
    pub maxcmd: u16,
    /// Number of namespaces (highest valid NSID).
    pub nn: u32,
    pub oncs: u16,
    pub vwc: u8,
    /// Warning composite temperature threshold, kelvin (0 = not reported).
    pub wctemp: u16,
    pub subnqn: &'a str,
    /// In-capsule data bytes the controller accepts on I/O queues.
    pub in_capsule_data: u32,
    /// ANA: transition time (s), capabilities, max group id, number of groups.
    pub ana: Option<(u8, u8, u32, u32)>,
}

impl ControllerInfo<'_> {
    pub fn encode(&self, b: &mut [u8; IDENTIFY_LEN]) {
        b.fill(0);
        put16(b, 0, self.vid);
        put16(b, 2, self.vid); // SSVID
        put_str(&mut b[4..24], self.serial, b' ');
        put_str(&mut b[24..64], self.model, b' ');
        put_str(&mut b[64..72], self.firmware, b' ');
        b[72] = 6; // RAB: 64 commands
        b[76] = self.cmic;
        b[77] = self.mdts;
        put16(b, 78, self.cntlid);
        put32(b, 80, self.version);
        put32(b, 92, self.oaes);
        put32(b, 96, self.ctratt);
        b[111] = self.cntrltype;
        // OACS 0: no optional admin commands. ACL 3: four Aborts (0-based).
        b[258] = 3;
        b[259] = self.aerl;
        b[260] = 0x03; // FRMW: slot 1 read-only, one slot
        b[261] = 0x07; // LPA: per-namespace SMART, command effects log, extended data
        b[262] = self.elpe;
        b[263] = 0; // NPSS: one power state (0-based), described at byte 2048
        put16(b, 266, self.wctemp);
        put16(b, 320, self.kas);
        if let Some((anatt, anacap, anagrpmax, nanagrpid)) = self.ana {
            b[342] = anatt;
            b[343] = anacap;
            put32(b, 344, anagrpmax);
            put32(b, 348, nanagrpid);
        }
        b[512] = 0x66; // SQES: 64-byte entries
        b[513] = 0x44; // CQES: 16-byte entries
        put16(b, 514, self.maxcmd);
        put32(b, 516, self.nn);
        put16(b, 520, self.oncs);
        b[525] = self.vwc;
        put32(b, 536, SGLS_TCP);
        put32(b, 540, self.nn); // MNAN
        put_str(&mut b[768..1024], self.subnqn, 0);
        // Fabrics: IOCCSZ/IORCSZ in 16-byte units, ICDOFF 0, FCATT 0 (dynamic model), MSDBD 1.
        put32(b, 1792, (64 + self.in_capsule_data) / 16);
        put32(b, 1796, 1);
        put16(b, 1800, 0);
        b[1802] = 0;
        b[1803] = 1;
        // Power state descriptor 0: nothing to manage over a fabric; MP 0 and
        // the latencies 0 mean "not reported". Operational state (NOPS clear).
        b[2048..2080].fill(0);
    }
}

/// What the target fills into Identify Namespace.
#[derive(Debug, Clone, Copy)]
pub struct NamespaceInfo {
    pub nsze: u64,
    /// Blocks in use (NUSE); NSZE unless thin.
    pub nuse: u64,
    /// Thin provisioned: NUSE says what is allocated (NSFEAT bit 0).
    pub thin: bool,
    pub lba_shift: u8,
    /// DLFEAT: deallocated blocks read as zeroes, Write Zeroes may deallocate.
    pub dealloc_reads_zeroes: bool,
    pub shared: bool,
    pub anagrpid: u32,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    /// Preferred write granularity and alignment, in blocks (0 = not reported).
    pub npwg: u16,
    /// Reservation Capabilities (RESCAP).
    pub rescap: u8,
    /// NSATTR bit 0: writes are refused (a snapshot); Linux sets the disk read-only.
    pub write_protected: bool,
}

impl NamespaceInfo {
    pub fn encode(&self, b: &mut [u8; IDENTIFY_LEN]) {
        b.fill(0);
        put64(b, 0, self.nsze);
        // NCAP: every block may be allocated, thin or not.
        put64(b, 8, self.nsze);
        put64(b, 16, self.nuse.min(self.nsze));
        // NSFEAT bit 0: thin provisioning; bit 4: NPWG/NPWA/NPDG/NPDA/NOWS are valid.
        b[24] = if self.npwg > 0 { NSFEAT_OPTPERF } else { 0 }
            | if self.thin { NSFEAT_THIN } else { 0 };
        b[25] = 0; // NLBAF: one format (0-based)
        b[26] = 0; // FLBAS: format 0, no metadata
        if self.dealloc_reads_zeroes {
            b[33] = 0x01 | (1 << 3);
        }
        b[30] = if self.shared { NMIC_SHARED } else { 0 };
        b[31] = self.rescap;
        if self.npwg > 0 {
            let g = self.npwg - 1;
            put16(b, 64, g); // NPWG
            put16(b, 66, g); // NPWA
            put16(b, 68, g); // NPDG
            put16(b, 70, g); // NPDA
            put16(b, 72, g); // NOWS
        }
        put32(b, 92, self.anagrpid);
        b[99] = u8::from(self.write_protected); // NSATTR
        b[104..120].copy_from_slice(&self.nguid);
        b[120..128].copy_from_slice(&self.eui64);
        // LBA format 0: no metadata, LBADS, relative performance "best".
        b[128 + 2] = self.lba_shift;
    }
}

/// I/O Command Set Independent Identify Namespace (CNS 08h).
#[derive(Debug, Clone, Copy)]
pub struct CsIndepNamespaceInfo {
    pub thin: bool,
    pub shared: bool,
    pub anagrpid: u32,
    pub ready: bool,
    pub write_protected: bool,
}

impl CsIndepNamespaceInfo {
    pub fn encode(&self, b: &mut [u8; IDENTIFY_LEN]) {
        b.fill(0);
        b[0] = if self.thin { NSFEAT_THIN } else { 0 }; // NSFEAT
        b[1] = if self.shared { NMIC_SHARED } else { 0 }; // NMIC
        // RESCAP 0 (no reservations), FPI 0 (no format in progress reported).
        put32(b, 4, self.anagrpid);
        b[8] = u8::from(self.write_protected); // NSATTR; NVMSETID/ENDGID 0
        b[14] = if self.ready { NSTAT_READY } else { 0 }; // NSTAT
    }
}

/// NVM command set specific Identify Namespace (CNS 05h, CSI 0): LBSTM, PIC
/// and the extended LBA formats. We have no protection information and no
/// storage tags, so all zero is the right answer.
pub fn encode_nvm_namespace(b: &mut [u8; IDENTIFY_LEN]) {
    b.fill(0);
}

/// NVM command set specific Identify Controller (CNS 06h, CSI 0). Sizes are
/// powers of two in units of CAP.MPSMIN (4 KiB); 0 means no limit (or, for
/// VSL/WUSL, nothing beyond MDTS: we do not implement Verify or Write
/// Uncorrectable).
#[derive(Debug, Clone, Copy, Default)]
pub struct NvmControllerInfo {
    pub vsl: u8,
    pub wzsl: u8,
    pub wusl: u8,
    /// Dataset Management ranges per command (0 = no limit beyond the command's 256).
    pub dmrl: u8,
    /// Blocks per Dataset Management range (0 = no limit).
    pub dmrsl: u32,
    /// Blocks per Dataset Management command (0 = no limit).
    pub dmsl: u64,
}

impl NvmControllerInfo {
    pub fn encode(&self, b: &mut [u8; IDENTIFY_LEN]) {
        b.fill(0);
        b[0] = self.vsl;
        b[1] = self.wzsl;
        b[2] = self.wusl;
        b[3] = self.dmrl;
        put32(b, 4, self.dmrsl);
        put64(b, 8, self.dmsl);
    }
}

/// I/O Command Set data structure (CNS 1Ch): 512 command set combination
/// vectors of 8 bytes. Ours has one, index 0: the NVM command set (bit 0).
pub fn encode_io_command_sets(b: &mut [u8; IDENTIFY_LEN]) {
    b.fill(0);
    put64(b, 0, 1 << csi::NVM);
}

/// Namespace identification descriptor types.
pub mod nidt {
    pub const EUI64: u8 = 1;
    pub const NGUID: u8 = 2;
    pub const UUID: u8 = 3;
    pub const CSI: u8 = 4;
}

/// Writes the NS ID descriptor list (CNS 0x03): NGUID, UUID and CSI (NVM).
pub fn encode_ns_descriptors(nguid: &[u8; 16], uuid: &[u8; 16], b: &mut [u8; IDENTIFY_LEN]) {
    b.fill(0);
    let mut off = 0;
    for (t, id) in [
        (nidt::NGUID, &nguid[..]),
        (nidt::UUID, &uuid[..]),
        (nidt::CSI, &[0u8][..]),
    ] {
        b[off] = t;
        b[off + 1] = id.len() as u8;
        b[off + 4..off + 4 + id.len()].copy_from_slice(id);
        off += 4 + id.len();
    }
}

/// Reads an NS ID descriptor list (CNS 0x03): `(NIDT, NID)` pairs until the
/// first zero type. A descriptor running past the buffer is an error.
pub fn decode_ns_descriptors(b: &[u8]) -> Result<Vec<(u8, &[u8])>, crate::WireError> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 4 <= b.len() && b[off] != 0 {
        let (t, len) = (b[off], usize::from(b[off + 1]));
        crate::need(&b[off + 4..], len)?;
        out.push((t, &b[off + 4..off + 4 + len]));
        off += 4 + len;
    }
    Ok(out)
}

/// Writes the active namespace list (CNS 0x02): NSIDs greater than `after`, ascending, up to 1024.
pub fn encode_active_ns_list(
    nsids: impl Iterator<Item = u32>,
    after: u32,
    b: &mut [u8; IDENTIFY_LEN],
) {
    b.fill(0);
    for (i, nsid) in nsids
        .filter(|&n| n > after)
        .take(IDENTIFY_LEN / 4)
        .enumerate()
    {
        put32(b, i * 4, nsid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{get_str, le16, le32, le64};

    #[test]
    fn controller_fields_land_where_hosts_read_them() {
        let mut b = [0u8; IDENTIFY_LEN];
        ControllerInfo {
            vid: 0x1d1d,
            serial: "SN123",
            model: "flashpool",
            firmware: "0.1.0",
            cntlid: 5,
            version: 0x10300,
            cntrltype: CNTRLTYPE_IO,
            mdts: 8,
            oaes: OAES_NS_ATTR,
            ctratt: CTRATT_HOSTID_128,
            cmic: CMIC_ANA,
            aerl: 3,
            elpe: 63,
            kas: 10,
            maxcmd: 128,
            nn: 1024,
            oncs: ONCS_DSM | ONCS_WRITE_ZEROES,
            vwc: 1,
            wctemp: 343,
            subnqn: "nqn.test",
            in_capsule_data: 8192,
            ana: Some((10, 0x47, 128, 128)),
        }
        .encode(&mut b);
        assert_eq!(&b[4..9], b"SN123");
        assert_eq!(b[9], b' ');
        assert_eq!(le16(&b, 78), 5);
        assert_eq!(b[77], 8);
        assert_eq!(b[111], 1);
        assert_eq!(le32(&b, 1792), (64 + 8192) / 16);
        assert_eq!(get_str(&b[768..1024]).unwrap(), "nqn.test");
        assert_eq!(le32(&b, 536), SGLS_TCP);
        assert_eq!(b[343], 0x47);
        assert_eq!((b[258], b[263], le16(&b, 266)), (3, 0, 343));
    }

    #[test]
    fn namespace_and_lists() {
        let mut b = [0u8; IDENTIFY_LEN];
        NamespaceInfo {
            nsze: 2048,
            nuse: 4096,
            thin: true,
            lba_shift: 9,
            dealloc_reads_zeroes: true,
            shared: true,
            anagrpid: 1,
            nguid: [1; 16],
            eui64: [2; 8],
            npwg: 8,
            rescap: 0xFE,
            write_protected: true,
        }
        .encode(&mut b);
        assert_eq!(b[31], 0xFE, "RESCAP");
        assert_eq!(b[99], 1, "NSATTR: write protected");
        assert_eq!(le64(&b, 0), 2048);
        assert_eq!(le64(&b, 16), 2048, "NUSE never exceeds NSZE");
        assert_eq!(b[24], NSFEAT_THIN | NSFEAT_OPTPERF);
        assert_eq!(b[130], 9);
        assert_eq!(le32(&b, 92), 1);
        assert_eq!(b[33], 0x09);
        encode_active_ns_list([1u32, 2, 5].into_iter(), 1, &mut b);
        assert_eq!((le32(&b, 0), le32(&b, 4), le32(&b, 8)), (2, 5, 0));
        encode_ns_descriptors(&[9; 16], &[8; 16], &mut b);
        let d = decode_ns_descriptors(&b).unwrap();
        assert_eq!(
            d,
            vec![
                (nidt::NGUID, &[9u8; 16][..]),
                (nidt::UUID, &[8u8; 16][..]),
                (nidt::CSI, &[0u8][..])
            ]
        );
        assert!(decode_ns_descriptors(&[2, 16, 0, 0, 1, 2]).is_err());
        assert_eq!((b[0], b[1], b[4]), (nidt::NGUID, 16, 9));
        assert_eq!((b[20], b[21], b[24]), (nidt::UUID, 16, 8));
        assert_eq!((b[40], b[41]), (nidt::CSI, 1));
    }

    #[test]
    fn command_set_structures() {
        let mut b = [0xAAu8; IDENTIFY_LEN];
        CsIndepNamespaceInfo {
            thin: true,
            shared: true,
            anagrpid: 7,
            ready: true,
            write_protected: true,
        }
        .encode(&mut b);
        assert_eq!((b[0], b[1], le32(&b, 4), b[8], b[14]), (1, 1, 7, 1, 1));
        assert!(b[15..].iter().all(|&x| x == 0));
        NvmControllerInfo {
            dmrsl: 9,
            dmsl: 10,
            ..Default::default()
        }
        .encode(&mut b);
        assert_eq!((le32(&b, 4), le64(&b, 8)), (9, 10));
        encode_io_command_sets(&mut b);
        assert_eq!(le64(&b, 0), 1);
        assert!(b[8..].iter().all(|&x| x == 0));
        encode_nvm_namespace(&mut b);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(identify_csi(0x0200_0000), 2);
    }
}
