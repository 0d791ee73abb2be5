//! Reservations (NVMe Base Specification, "Reservations"): the command
//! dwords and data of Reservation Register/Report/Acquire/Release, the
//! Reservation Status data structures, the Reservation Notification log
//! page (80h) and the capability bits a target advertises.
//!
//! Command dword 10 decoders are infallible: they only split bits. Whether a
//! value is reserved is a status decision (Invalid Field in Command) that
//! belongs to the command's executor, so the raw values are kept and the
//! enums below offer `from_raw` returning `None` for reserved encodings.

use crate::{WireError, le64, need, put16, put32, put64};

/// Reservation Notification log page identifier.
pub const LID_RESERVATION_NOTIFICATION: u8 = 0x80;
/// Feature identifiers (Set/Get Features).
pub const FID_RESV_NOTIFICATION_MASK: u8 = 0x81;
pub const FID_RESV_PERSISTENCE: u8 = 0x83;
/// Reservation Notification Mask (feature 81h, cdw11): a set bit suppresses that kind.
pub const MASK_REGISTRATION_PREEMPTED: u32 = 1 << 1;
pub const MASK_RESERVATION_RELEASED: u32 = 1 << 2;
pub const MASK_RESERVATION_PREEMPTED: u32 = 1 << 3;
/// Reservation Persistence (feature 83h, cdw11 bit 0): Persist Through Power Loss.
pub const PERSISTENCE_PTPL: u32 = 1 << 0;

/// Identify Controller ONCS bit: the Reservation commands are supported.
pub const ONCS_RESERVATIONS: u16 = 1 << 5;
/// Byte offset of RESCAP in Identify Namespace (after NMIC at 30).
pub const RESCAP_OFFSET: usize = 31;
/// RESCAP bits: Persist Through Power Loss, one bit per type (1 << type), and
/// bit 7 "Ignore Existing Key" meaning IEKEY behaves as defined from 1.3 on.
pub const RESCAP_PTPL: u8 = 1 << 0;
pub const RESCAP_IEKEY_13: u8 = 1 << 7;
/// All six reservation types.
pub const RESCAP_ALL_TYPES: u8 = 0x7E;

/// Reservation type (RTYPE), values 1..=6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ResvType {
    WriteExclusive = 1,
    ExclusiveAccess = 2,
    WriteExclusiveRegistrantsOnly = 3,
    ExclusiveAccessRegistrantsOnly = 4,
    WriteExclusiveAllRegistrants = 5,
    ExclusiveAccessAllRegistrants = 6,
}

impl ResvType {
    pub const ALL: [ResvType; 6] = [
        ResvType::WriteExclusive,
        ResvType::ExclusiveAccess,
        ResvType::WriteExclusiveRegistrantsOnly,
        ResvType::ExclusiveAccessRegistrantsOnly,
        ResvType::WriteExclusiveAllRegistrants,
        ResvType::ExclusiveAccessAllRegistrants,
    ];

    pub fn from_raw(v: u8) -> Option<ResvType> {
        Self::ALL.get(usize::from(v).wrapping_sub(1)).copied()
    }
    pub fn raw(self) -> u8 {
        self as u8
    }
    /// Every registrant is a reservation holder.
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            ResvType::WriteExclusiveAllRegistrants | ResvType::ExclusiveAccessAllRegistrants
        )
    }
    /// Registrants (not only the holder) get full access.
    pub fn registrants_access(self) -> bool {
        !matches!(self, ResvType::WriteExclusive | ResvType::ExclusiveAccess)
    }
    /// Reads are fenced too, not only writes.
    pub fn exclusive_access(self) -> bool {
        matches!(
            self,
            ResvType::ExclusiveAccess
                | ResvType::ExclusiveAccessRegistrantsOnly
                | ResvType::ExclusiveAccessAllRegistrants
        )
    }
    /// The RESCAP bit that advertises this type.
    pub fn rescap_bit(self) -> u8 {
        1 << self.raw()
    }
}

/// Reservation Register Action (RREGA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterAction {
    Register,
    Unregister,
    Replace,
}

impl RegisterAction {
    pub fn from_raw(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Register),
            1 => Some(Self::Unregister),
            2 => Some(Self::Replace),
            _ => None,
        }
    }
}

/// Reservation Acquire Action (RACQA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireAction {
    Acquire,
    Preempt,
    PreemptAndAbort,
}

impl AcquireAction {
    pub fn from_raw(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Acquire),
            1 => Some(Self::Preempt),
            2 => Some(Self::PreemptAndAbort),
            _ => None,
        }
    }
}

/// Reservation Release Action (RRELA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAction {
    Release,
    Clear,
}

impl ReleaseAction {
    pub fn from_raw(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Release),
            1 => Some(Self::Clear),
            _ => None,
        }
    }
}

/// Change Persist Through Power Loss State (CPTPL) values.
pub mod cptpl {
    pub const NO_CHANGE: u8 = 0;
    pub const RESERVED: u8 = 1;
    pub const CLEAR: u8 = 2;
    pub const SET: u8 = 3;
}

/// Reservation Register command dword 10.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterCdw10 {
    pub rrega: u8,
    pub iekey: bool,
    pub cptpl: u8,
}

impl RegisterCdw10 {
    pub fn decode(cdw10: u32) -> Self {
        RegisterCdw10 {
            rrega: (cdw10 & 7) as u8,
            iekey: cdw10 & (1 << 3) != 0,
            cptpl: (cdw10 >> 30) as u8,
        }
    }
    pub fn encode(&self) -> u32 {
        u32::from(self.rrega & 7) | (u32::from(self.iekey) << 3) | (u32::from(self.cptpl & 3) << 30)
    }
}

/// Reservation Acquire command dword 10.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireCdw10 {
    pub racqa: u8,
    pub iekey: bool,
    pub rtype: u8,
}

impl AcquireCdw10 {
    pub fn decode(cdw10: u32) -> Self {
        AcquireCdw10 {
            racqa: (cdw10 & 7) as u8,
            iekey: cdw10 & (1 << 3) != 0,
            rtype: (cdw10 >> 8) as u8,
        }
    }
    pub fn encode(&self) -> u32 {
        u32::from(self.racqa & 7) | (u32::from(self.iekey) << 3) | (u32::from(self.rtype) << 8)
    }
}

/// Reservation Release command dword 10.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseCdw10 {
    pub rrela: u8,
    pub iekey: bool,
    pub rtype: u8,
}

impl ReleaseCdw10 {
    pub fn decode(cdw10: u32) -> Self {
        ReleaseCdw10 {
            rrela: (cdw10 & 7) as u8,
            iekey: cdw10 & (1 << 3) != 0,
            rtype: (cdw10 >> 8) as u8,
        }
    }
    pub fn encode(&self) -> u32 {
        u32::from(self.rrela & 7) | (u32::from(self.iekey) << 3) | (u32::from(self.rtype) << 8)
    }
}

/// Reservation Report command: NUMD (0-based dwords) in cdw10, EDS in cdw11 bit 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportCmd {
    pub numd: u32,
    pub eds: bool,
}

impl ReportCmd {
    pub fn decode(cdw10: u32, cdw11: u32) -> Self {
        ReportCmd {
            numd: cdw10,
            eds: cdw11 & 1 != 0,
        }
    }
    /// (cdw10, cdw11).
    pub fn encode(&self) -> (u32, u32) {
        (self.numd, u32::from(self.eds))
    }
    /// A report of `len` bytes (a multiple of 4, at least 4).
    pub fn for_len(len: usize, eds: bool) -> Self {
        ReportCmd {
            numd: (len / 4).max(1) as u32 - 1,
            eds,
        }
    }
    /// Bytes the host asked for; u64 because NUMD = FFFFFFFFh is 16 GiB.
    pub fn len_bytes(&self) -> u64 {
        (u64::from(self.numd) + 1) * 4
    }
}

/// Reservation Register data: Current and New Reservation Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterData {
    pub crkey: u64,
    pub nrkey: u64,
}

pub const REGISTER_DATA_LEN: usize = 16;
pub const ACQUIRE_DATA_LEN: usize = 16;
pub const RELEASE_DATA_LEN: usize = 8;

impl RegisterData {
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        need(b, REGISTER_DATA_LEN)?;
        Ok(RegisterData {
            crkey: le64(b, 0),
            nrkey: le64(b, 8),
        })
    }
    pub fn encode(&self) -> [u8; REGISTER_DATA_LEN] {
        let mut b = [0u8; REGISTER_DATA_LEN];
        put64(&mut b, 0, self.crkey);
        put64(&mut b, 8, self.nrkey);
        b
    }
}

/// Reservation Acquire data: Current and Preempt Reservation Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireData {
    pub crkey: u64,
    pub prkey: u64,
}

impl AcquireData {
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        need(b, ACQUIRE_DATA_LEN)?;
        Ok(AcquireData {
            crkey: le64(b, 0),
            prkey: le64(b, 8),
        })
    }
    pub fn encode(&self) -> [u8; ACQUIRE_DATA_LEN] {
        let mut b = [0u8; ACQUIRE_DATA_LEN];
        put64(&mut b, 0, self.crkey);
        put64(&mut b, 8, self.prkey);
        b
    }
}

/// Reservation Release data: Current Reservation Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseData {
    pub crkey: u64,
}

impl ReleaseData {
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        need(b, RELEASE_DATA_LEN)?;
        Ok(ReleaseData { crkey: le64(b, 0) })
    }
    pub fn encode(&self) -> [u8; RELEASE_DATA_LEN] {
        self.crkey.to_le_bytes()
    }
}

/// Reservation Status header fields shared by both formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportHeader {
    /// Generation (PRGEN), a wrapping counter.
    pub generation: u32,
    /// Current reservation type, 0 when none is held.
    pub rtype: u8,
    /// Number of registered controllers (REGCTL).
    pub regctl: u16,
    /// Persist Through Power Loss State.
    pub ptpls: bool,
}

/// One Registered Controller data structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisteredCtrl {
    pub cntlid: u16,
    /// RCSTS bit 0: this controller's host holds the reservation.
    pub holds: bool,
    /// Host Identifier; the classic (64-bit) format carries bytes 0..8 only.
    pub hostid: [u8; 16],
    pub rkey: u64,
}

pub const REPORT_HEADER_LEN: usize = 24;
pub const REPORT_ENTRY_LEN: usize = 24;
pub const REPORT_EXT_HEADER_LEN: usize = 64;
pub const REPORT_EXT_ENTRY_LEN: usize = 64;

/// Copies `src` to `buf[off..]`, dropping whatever falls past the buffer's end.
fn put_trunc(buf: &mut [u8], off: usize, src: &[u8]) {
    if off >= buf.len() {
        return;
    }
    let n = src.len().min(buf.len() - off);
    buf[off..off + n].copy_from_slice(&src[..n]);
}

fn encode_header(h: &ReportHeader, out: &mut [u8]) {
    put32(out, 0, h.generation);
    out[4] = h.rtype;
    put16(out, 5, h.regctl);
    out[9] = u8::from(h.ptpls);
}

/// Reservation Status (EDS = 0): 24-byte header, 24-byte entries with a
/// 64-bit Host Identifier. Writes as much as fits in `buf`, zero-filling
/// reserved bytes, and returns the full length of the structure.
pub fn encode_report(h: &ReportHeader, ctrls: &[RegisteredCtrl], buf: &mut [u8]) -> usize {
    let mut hdr = [0u8; REPORT_HEADER_LEN];
    encode_header(h, &mut hdr);
    put_trunc(buf, 0, &hdr);
    let mut off = REPORT_HEADER_LEN;
    for c in ctrls {
        let mut e = [0u8; REPORT_ENTRY_LEN];
        put16(&mut e, 0, c.cntlid);
        e[2] = u8::from(c.holds);
        e[8..16].copy_from_slice(&c.hostid[..8]);
        put64(&mut e, 16, c.rkey);
        put_trunc(buf, off, &e);
        off += REPORT_ENTRY_LEN;
    }
    off
}

/// Reservation Status Extended (EDS = 1): 64-byte header, 64-byte entries
/// with the 128-bit Host Identifier. Truncates like [`encode_report`].
pub fn encode_report_ext(h: &ReportHeader, ctrls: &[RegisteredCtrl], buf: &mut [u8]) -> usize {
    let mut hdr = [0u8; REPORT_EXT_HEADER_LEN];
    encode_header(h, &mut hdr);
    put_trunc(buf, 0, &hdr);
    let mut off = REPORT_EXT_HEADER_LEN;
    for c in ctrls {
        let mut e = [0u8; REPORT_EXT_ENTRY_LEN];
        put16(&mut e, 0, c.cntlid);
        e[2] = u8::from(c.holds);
        put64(&mut e, 8, c.rkey);
        e[16..32].copy_from_slice(&c.hostid);
        put_trunc(buf, off, &e);
        off += REPORT_EXT_ENTRY_LEN;
    }
    off
}

/// Decodes a Reservation Status Extended structure (EDS = 1): the header
/// and the entries present in `b` (at most REGCTL; a short buffer gives
/// fewer, see `ReportHeader::regctl` for how many exist).
pub fn decode_report_ext(b: &[u8]) -> Result<(ReportHeader, Vec<RegisteredCtrl>), WireError> {
    need(b, REPORT_EXT_HEADER_LEN)?;
    let h = ReportHeader {
        generation: crate::le32(b, 0),
        rtype: b[4],
        regctl: crate::le16(b, 5),
        ptpls: b[9] & 1 != 0,
    };
    let ctrls = b[REPORT_EXT_HEADER_LEN..]
        .chunks_exact(REPORT_EXT_ENTRY_LEN)
        .take(usize::from(h.regctl))
        .map(|e| RegisteredCtrl {
            cntlid: crate::le16(e, 0),
            holds: e[2] & 1 != 0,
            rkey: le64(e, 8),
            hostid: e[16..32].try_into().expect("16 bytes"),
        })
        .collect();
    Ok((h, ctrls))
}

/// Reservation Notification log page entry types.
pub mod log_type {
    pub const EMPTY: u8 = 0;
    pub const REGISTRATION_PREEMPTED: u8 = 1;
    pub const RESERVATION_RELEASED: u8 = 2;
    pub const RESERVATION_PREEMPTED: u8 = 3;
}

pub const RESV_LOG_LEN: usize = 64;

/// Reservation Notification log page (80h): one 64-byte entry per read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResvLogEntry {
    /// Log Page Count: a 64-bit counter of entries created, 0 only for an empty page.
    pub count: u64,
    pub log_type: u8,
    /// Number of Available Log Pages still queued after this one.
    pub available: u8,
    pub nsid: u32,
}

impl ResvLogEntry {
    pub fn encode(&self) -> [u8; RESV_LOG_LEN] {
        let mut b = [0u8; RESV_LOG_LEN];
        put64(&mut b, 0, self.count);
        b[8] = self.log_type;
        b[9] = self.available;
        put32(&mut b, 12, self.nsid);
        b
    }
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        need(b, RESV_LOG_LEN)?;
        Ok(ResvLogEntry {
            count: le64(b, 0),
            log_type: b[8],
            available: b[9],
            nsid: crate::le32(b, 12),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{le16, le32};

    #[test]
    fn types_and_rescap() {
        assert_eq!(ResvType::from_raw(0), None);
        assert_eq!(ResvType::from_raw(7), None);
        assert_eq!(ResvType::from_raw(255), None);
        for (i, t) in ResvType::ALL.iter().enumerate() {
            assert_eq!(ResvType::from_raw(i as u8 + 1), Some(*t));
            assert_eq!(t.raw(), i as u8 + 1);
        }
        let all = ResvType::ALL.iter().fold(0u8, |a, t| a | t.rescap_bit());
        assert_eq!(all, RESCAP_ALL_TYPES);
        assert!(ResvType::ExclusiveAccessAllRegistrants.all_registrants());
        assert!(!ResvType::WriteExclusiveRegistrantsOnly.all_registrants());
        assert!(ResvType::WriteExclusiveRegistrantsOnly.registrants_access());
        assert!(!ResvType::ExclusiveAccess.registrants_access());
        assert!(ResvType::ExclusiveAccessRegistrantsOnly.exclusive_access());
        assert!(!ResvType::WriteExclusiveAllRegistrants.exclusive_access());
    }

    #[test]
    fn report_ext_round_trip() {
        let h = ReportHeader {
            generation: 7,
            rtype: 2,
            regctl: 2,
            ptpls: true,
        };
        let c = [
            RegisteredCtrl {
                cntlid: 1,
                holds: true,
                hostid: [0xAB; 16],
                rkey: 0x1122,
            },
            RegisteredCtrl {
                cntlid: 0xFFFF,
                holds: false,
                hostid: [3; 16],
                rkey: 9,
            },
        ];
        let mut b = [0u8; 256];
        let n = encode_report_ext(&h, &c, &mut b);
        assert_eq!(n, 64 * 3);
        let (h2, c2) = decode_report_ext(&b[..n]).unwrap();
        assert_eq!((h2, c2.as_slice()), (h, &c[..]));
        // A short buffer gives the entries that fit.
        let (_, c3) = decode_report_ext(&b[..130]).unwrap();
        assert_eq!(c3.len(), 1);
        assert!(decode_report_ext(&b[..63]).is_err());
        let r = ReportCmd::for_len(4096, true);
        assert_eq!(ReportCmd::decode(r.encode().0, r.encode().1), r);
        assert_eq!(r.len_bytes(), 4096);
    }

    #[test]
    fn actions() {
        assert_eq!(RegisterAction::from_raw(2), Some(RegisterAction::Replace));
        assert_eq!(RegisterAction::from_raw(3), None);
        assert_eq!(
            AcquireAction::from_raw(2),
            Some(AcquireAction::PreemptAndAbort)
        );
        assert_eq!(AcquireAction::from_raw(7), None);
        assert_eq!(ReleaseAction::from_raw(1), Some(ReleaseAction::Clear));
        assert_eq!(ReleaseAction::from_raw(2), None);
    }

    #[test]
    fn cdw10_fields() {
        let r = RegisterCdw10::decode(2 | (1 << 3) | (3 << 30) | 0x0FF0_FF00);
        assert_eq!(
            r,
            RegisterCdw10 {
                rrega: 2,
                iekey: true,
                cptpl: 3
            }
        );
        assert_eq!(RegisterCdw10::decode(r.encode()), r);
        let a = AcquireCdw10::decode(1 | (6 << 8) | (0xAB << 16));
        assert_eq!(
            a,
            AcquireCdw10 {
                racqa: 1,
                iekey: false,
                rtype: 6
            }
        );
        assert_eq!(AcquireCdw10::decode(a.encode()), a);
        let l = ReleaseCdw10::decode(1 | (1 << 3) | (4 << 8));
        assert_eq!(
            l,
            ReleaseCdw10 {
                rrela: 1,
                iekey: true,
                rtype: 4
            }
        );
        assert_eq!(ReleaseCdw10::decode(l.encode()), l);
        let p = ReportCmd::decode(0xFFFF_FFFF, 0xFFFF_FFFE);
        assert!(!p.eds);
        assert_eq!(p.len_bytes(), 1 << 34);
        assert_eq!(ReportCmd::decode(5, 1).len_bytes(), 24);
        assert!(ReportCmd::decode(5, 1).eds);
    }

    #[test]
    fn data_structures() {
        let r = RegisterData {
            crkey: 0x1122_3344_5566_7788,
            nrkey: 0xDEAD_BEEF,
        };
        let b = r.encode();
        assert_eq!(b[0], 0x88);
        assert_eq!(RegisterData::decode(&b).unwrap(), r);
        assert_eq!(
            RegisterData::decode(&b[..15]),
            Err(WireError::Short { have: 15, need: 16 })
        );
        let a = AcquireData { crkey: 1, prkey: 2 };
        assert_eq!(AcquireData::decode(&a.encode()).unwrap(), a);
        assert!(AcquireData::decode(&[0; 8]).is_err());
        assert!(AcquireData::decode(&[]).is_err());
        let l = ReleaseData { crkey: 9 };
        assert_eq!(ReleaseData::decode(&l.encode()).unwrap(), l);
        assert!(ReleaseData::decode(&[0; 7]).is_err());
        // Longer buffers (a host sending a whole page) are fine.
        assert_eq!(ReleaseData::decode(&[0; 4096]).unwrap().crkey, 0);
    }

    fn sample() -> (ReportHeader, [RegisteredCtrl; 2]) {
        let h = ReportHeader {
            generation: 0x0102_0304,
            rtype: 3,
            regctl: 2,
            ptpls: true,
        };
        let c = [
            RegisteredCtrl {
                cntlid: 7,
                holds: true,
                hostid: [0xAA; 16],
                rkey: 0x55,
            },
            RegisteredCtrl {
                cntlid: 0xFFFF,
                holds: false,
                hostid: *b"0123456789abcdef",
                rkey: u64::MAX,
            },
        ];
        (h, c)
    }

    #[test]
    fn report_classic() {
        let (h, c) = sample();
        let mut b = [0xEEu8; 128];
        assert_eq!(encode_report(&h, &c, &mut b), 24 + 2 * 24);
        assert_eq!(le32(&b, 0), 0x0102_0304);
        assert_eq!(b[4], 3);
        assert_eq!(le16(&b, 5), 2);
        assert_eq!(&b[7..9], &[0, 0]);
        assert_eq!(b[9], 1);
        assert!(b[10..24].iter().all(|&x| x == 0));
        assert_eq!(le16(&b, 24), 7);
        assert_eq!(b[26], 1);
        assert_eq!(&b[32..40], &[0xAA; 8]);
        assert_eq!(crate::le64(&b, 40), 0x55);
        assert_eq!(le16(&b, 48), 0xFFFF);
        assert_eq!(b[50], 0);
        assert_eq!(&b[56..64], b"01234567");
        assert_eq!(crate::le64(&b, 64), u64::MAX);
        assert_eq!(b[72], 0xEE, "past the structure is untouched");
    }

    #[test]
    fn report_extended() {
        let (h, c) = sample();
        let mut b = vec![0xEEu8; 200];
        assert_eq!(encode_report_ext(&h, &c, &mut b), 64 * 3);
        assert_eq!(le32(&b, 0), 0x0102_0304);
        assert_eq!(b[4], 3);
        assert_eq!(le16(&b, 5), 2);
        assert_eq!(b[9], 1);
        assert!(b[10..64].iter().all(|&x| x == 0));
        assert_eq!(le16(&b, 64), 7);
        assert_eq!(b[66], 1);
        assert_eq!(crate::le64(&b, 72), 0x55);
        assert_eq!(&b[80..96], &[0xAA; 16]);
        assert!(b[96..128].iter().all(|&x| x == 0));
        assert_eq!(&b[128 + 16..128 + 32], b"0123456789abcdef");
        assert_eq!(b[192], 0xEE);
    }

    #[test]
    fn report_truncates_to_buffer() {
        let (h, c) = sample();
        for len in [0usize, 3, 4, 23, 24, 30, 47, 48, 71] {
            let mut b = vec![0u8; len];
            assert_eq!(encode_report(&h, &c, &mut b), 72);
            let mut full = [0u8; 72];
            encode_report(&h, &c, &mut full);
            assert_eq!(&b[..], &full[..len]);
        }
        for len in [0usize, 8, 63, 64, 100, 191] {
            let mut b = vec![0u8; len];
            assert_eq!(encode_report_ext(&h, &c, &mut b), 192);
            let mut full = [0u8; 192];
            encode_report_ext(&h, &c, &mut full);
            assert_eq!(&b[..], &full[..len]);
        }
        assert_eq!(encode_report(&h, &[], &mut []), 24);
        assert_eq!(encode_report_ext(&h, &[], &mut []), 64);
    }

    #[test]
    fn log_entry() {
        let e = ResvLogEntry {
            count: 0x1_0000_0002,
            log_type: log_type::RESERVATION_PREEMPTED,
            available: 4,
            nsid: 9,
        };
        let b = e.encode();
        assert_eq!(crate::le64(&b, 0), 0x1_0000_0002);
        assert_eq!(b[8], 3);
        assert_eq!(b[9], 4);
        assert_eq!(&b[10..12], &[0, 0]);
        assert_eq!(le32(&b, 12), 9);
        assert!(b[16..].iter().all(|&x| x == 0));
        assert_eq!(ResvLogEntry::decode(&b).unwrap(), e);
        assert!(ResvLogEntry::decode(&b[..63]).is_err());
        assert_eq!(ResvLogEntry::default().encode(), [0u8; 64]);
    }
}
