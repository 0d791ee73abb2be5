//! Get Log Page: the command's fields and the log pages the target serves.

use crate::sqe::Sqe;
use crate::{put_str, put16, put32, put64};

pub mod lid {
    pub const SUPPORTED_LOGS: u8 = 0x00;
    pub const ERROR: u8 = 0x01;
    pub const SMART: u8 = 0x02;
    pub const FW_SLOT: u8 = 0x03;
    pub const CHANGED_NS: u8 = 0x04;
    pub const CMD_EFFECTS: u8 = 0x05;
    pub const ANA: u8 = 0x0C;
    pub const DISCOVERY: u8 = 0x70;
}

/// Get Log Page fields: log id, specific field, retain-async-event, length and offset in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetLogPage {
    pub lid: u8,
    pub lsp: u8,
    pub rae: bool,
    pub len: u64,
    pub offset: u64,
}

impl GetLogPage {
    pub fn from_sqe(s: &Sqe) -> Self {
        let numdl = u64::from(s.cdw10 >> 16);
        let numdu = u64::from(s.cdw11 & 0xFFFF);
        GetLogPage {
            lid: s.cdw10 as u8,
            lsp: ((s.cdw10 >> 8) & 0x7F) as u8,
            rae: s.cdw10 & (1 << 15) != 0,
            len: ((numdu << 16 | numdl) + 1) * 4,
            offset: u64::from(s.cdw12) | (u64::from(s.cdw13) << 32),
        }
    }

    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(crate::sqe::admin_opc::GET_LOG_PAGE, cid);
        let numd = (self.len / 4).saturating_sub(1);
        s.cdw10 = u32::from(self.lid)
            | (u32::from(self.lsp) << 8)
            | (u32::from(self.rae) << 15)
            | (((numd & 0xFFFF) as u32) << 16);
        s.cdw11 = (numd >> 16) as u32 & 0xFFFF;
        s.cdw12 = self.offset as u32;
        s.cdw13 = (self.offset >> 32) as u32;
        s.nsid = 0xFFFF_FFFF;
        s
    }
}

pub const SUPPORTED_LOGS_LEN: usize = 1024;
/// Supported Log Pages: one dword per LID, bit 0 = supported.
pub fn encode_supported_logs(lids: &[u8], b: &mut [u8]) {
    b[..SUPPORTED_LOGS_LEN].fill(0);
    for &l in lids {
        put32(b, usize::from(l) * 4, 1);
    }
}

pub const ERROR_ENTRY_LEN: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorEntry {
    pub error_count: u64,
    pub sqid: u16,
    pub cid: u16,
    /// Status field (as in the CQE, phase bit clear).
    pub status: u16,
    pub param_location: u16,
    pub lba: u64,
    pub nsid: u32,
}

impl ErrorEntry {
    pub fn encode(&self, b: &mut [u8]) {
        b[..ERROR_ENTRY_LEN].fill(0);
        put64(b, 0, self.error_count);
        put16(b, 8, self.sqid);
        put16(b, 10, self.cid);
        put16(b, 12, self.status);
        put16(b, 14, self.param_location);
        put64(b, 16, self.lba);
        put32(b, 24, self.nsid);
        b[29] = 3; // transport type: TCP
    }
}

pub const SMART_LEN: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmartLog {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub read_cmds: u64,
    pub write_cmds: u64,
    pub power_on_hours: u64,
    pub media_errors: u64,
    pub error_log_entries: u64,
}

impl SmartLog {
    pub fn encode(&self, b: &mut [u8]) {
        b[..SMART_LEN].fill(0);
        put16(b, 1, 273 + 25); // composite temperature: 25 C in kelvin
        b[3] = 100; // available spare %
        b[4] = 10; // available spare threshold %
        // Data units are thousands of 512-byte units, rounded up.
        put64(b, 32, self.bytes_read.div_ceil(512_000));
        put64(b, 48, self.bytes_written.div_ceil(512_000));
        put64(b, 64, self.read_cmds);
        put64(b, 80, self.write_cmds);
        put64(b, 128, self.power_on_hours);
        put64(b, 160, self.media_errors);
        put64(b, 176, self.error_log_entries);
    }
}

pub const FW_SLOT_LEN: usize = 512;
pub fn encode_fw_slot(firmware: &str, b: &mut [u8]) {
    b[..FW_SLOT_LEN].fill(0);
    b[0] = 1; // AFI: slot 1 active
    put_str(&mut b[8..16], firmware, b' ');
}

pub const CHANGED_NS_LEN: usize = 4096;
pub const CMD_EFFECTS_LEN: usize = 4096;
/// Command Supported and Effects: CSUPP, and LBCC for commands that change data.
pub const EFFECT_CSUPP: u32 = 1 << 0;
pub const EFFECT_LBCC: u32 = 1 << 1;

pub fn encode_cmd_effects(admin: &[u8], io: &[(u8, bool)], b: &mut [u8]) {
    b[..CMD_EFFECTS_LEN].fill(0);
    for &opc in admin {
        put32(b, usize::from(opc) * 4, EFFECT_CSUPP);
    }
    for &(opc, changes_data) in io {
        let v = EFFECT_CSUPP | if changes_data { EFFECT_LBCC } else { 0 };
        put32(b, 1024 + usize::from(opc) * 4, v);
    }
}

/// ANA log: header, then per group a descriptor and its NSIDs.
pub mod ana {
    use super::*;
    pub const HEADER_LEN: usize = 16;
    pub const DESC_LEN: usize = 32;
    pub const STATE_OPTIMIZED: u8 = 0x01;
    pub const STATE_NON_OPTIMIZED: u8 = 0x02;
    pub const STATE_INACCESSIBLE: u8 = 0x03;
    pub const STATE_PERSISTENT_LOSS: u8 = 0x04;
    pub const STATE_CHANGE: u8 = 0x0F;
    /// LSP bit 0: return groups only (no NSIDs).
    pub const LSP_RGO: u8 = 1;

    pub struct Group<'a> {
        pub grpid: u32,
        pub state: u8,
        pub nsids: &'a [u32],
    }

    pub fn log_len(groups: &[Group<'_>], rgo: bool) -> usize {
        HEADER_LEN
            + groups
                .iter()
                .map(|g| DESC_LEN + if rgo { 0 } else { g.nsids.len() * 4 })
                .sum::<usize>()
    }

    /// Writes the log into `b` (at least `log_len` bytes).
    pub fn encode(change_count: u64, groups: &[Group<'_>], rgo: bool, b: &mut [u8]) {
        let len = log_len(groups, rgo);
        b[..len].fill(0);
        put64(b, 0, change_count);
        put16(b, 8, groups.len() as u16);
        let mut off = HEADER_LEN;
        for g in groups {
            put32(b, off, g.grpid);
            let n = if rgo { 0 } else { g.nsids.len() };
            put32(b, off + 4, n as u32);
            put64(b, off + 8, change_count);
            b[off + 16] = g.state;
            off += DESC_LEN;
            for &nsid in &g.nsids[..n] {
                put32(b, off, nsid);
                off += 4;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{le16, le32, le64};

    #[test]
    fn get_log_page_fields() {
        let g = GetLogPage {
            lid: lid::ANA,
            lsp: ana::LSP_RGO,
            rae: true,
            len: 0x4_0000 * 4 + 8,
            offset: 0x1_0000_0004,
        };
        let back = GetLogPage::from_sqe(&g.to_sqe(1));
        assert_eq!(back, g);
    }

    #[test]
    fn ana_layout() {
        let nsids = [1, 2];
        let groups = [ana::Group {
            grpid: 1,
            state: ana::STATE_OPTIMIZED,
            nsids: &nsids,
        }];
        let mut b = vec![0u8; ana::log_len(&groups, false)];
        ana::encode(3, &groups, false, &mut b);
        assert_eq!(b.len(), 16 + 32 + 8);
        assert_eq!((le64(&b, 0), le16(&b, 8)), (3, 1));
        assert_eq!((le32(&b, 16), le32(&b, 20), b[32]), (1, 2, 1));
        assert_eq!((le32(&b, 48), le32(&b, 52)), (1, 2));
        assert_eq!(ana::log_len(&groups, true), 48);
    }

    #[test]
    fn smart_units() {
        let mut b = [0u8; SMART_LEN];
        SmartLog {
            bytes_read: 512_001,
            ..Default::default()
        }
        .encode(&mut b);
        assert_eq!(le64(&b, 32), 2);
    }
}
