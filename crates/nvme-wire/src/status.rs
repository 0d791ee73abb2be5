//! Completion status: Status Code Type, Status Code, Do Not Retry.

/// A completion status as carried in CQE dword 3 bits 17..31.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub sct: u8,
    pub sc: u8,
    pub dnr: bool,
}

impl Status {
    pub const SUCCESS: Status = Status::generic(0x00);

    pub const fn generic(sc: u8) -> Status {
        Status {
            sct: SCT_GENERIC,
            sc,
            dnr: sc != 0,
        }
    }
    pub const fn cmd_specific(sc: u8) -> Status {
        Status {
            sct: SCT_CMD_SPECIFIC,
            sc,
            dnr: true,
        }
    }
    pub const fn media(sc: u8) -> Status {
        Status {
            sct: SCT_MEDIA,
            sc,
            dnr: false,
        }
    }
    /// A path-related status (SCT 3h): the host may retry on another path.
    pub const fn path(sc: u8) -> Status {
        Status {
            sct: SCT_PATH,
            sc,
            dnr: false,
        }
    }
    pub const fn retryable(mut self) -> Status {
        self.dnr = false;
        self
    }
    pub fn is_success(&self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// The 15-bit status field (bits 1..15 of the CQE's last halfword; phase bit 0 left clear).
    pub fn to_field(self) -> u16 {
        (u16::from(self.sc) << 1) | (u16::from(self.sct & 7) << 9) | (u16::from(self.dnr) << 15)
    }

    pub fn from_field(f: u16) -> Status {
        Status {
            sc: (f >> 1) as u8,
            sct: ((f >> 9) & 7) as u8,
            dnr: f & (1 << 15) != 0,
        }
    }
}

pub const SCT_GENERIC: u8 = 0;
pub const SCT_CMD_SPECIFIC: u8 = 1;
pub const SCT_MEDIA: u8 = 2;
pub const SCT_PATH: u8 = 3;

// Generic command status (SCT 0).
pub const SC_INVALID_OPCODE: u8 = 0x01;
pub const SC_INVALID_FIELD: u8 = 0x02;
pub const SC_CMDID_CONFLICT: u8 = 0x03;
pub const SC_DATA_XFER_ERROR: u8 = 0x04;
pub const SC_INTERNAL: u8 = 0x06;
pub const SC_ABORT_REQ: u8 = 0x07;
pub const SC_INVALID_NS: u8 = 0x0B;
pub const SC_CMD_SEQ_ERROR: u8 = 0x0C;
pub const SC_SGL_INVALID_DATA_LEN: u8 = 0x0F;
pub const SC_SGL_INVALID_TYPE: u8 = 0x11;
pub const SC_SGL_INVALID_OFFSET: u8 = 0x16;
/// The host asked for a format whose Host Identifier width differs from the one it connected with.
pub const SC_HOST_ID_INCONSISTENT: u8 = 0x18;
/// A write to a write-protected namespace (a snapshot).
pub const SC_NS_WRITE_PROTECTED: u8 = 0x20;
pub const SC_LBA_RANGE: u8 = 0x80;
pub const SC_CAP_EXCEEDED: u8 = 0x81;
pub const SC_NS_NOT_READY: u8 = 0x82;
pub const SC_RESERVATION_CONFLICT: u8 = 0x83;

// Command specific status (SCT 1).
pub const SC_INVALID_QID: u8 = 0x01;
pub const SC_INVALID_QSIZE: u8 = 0x02;
pub const SC_ASYNC_LIMIT: u8 = 0x05;
pub const SC_INVALID_LOG_PAGE: u8 = 0x09;
pub const SC_FEATURE_NOT_SAVEABLE: u8 = 0x0D;
pub const SC_IOCS_COMBINATION_REJECTED: u8 = 0x2B;
pub const SC_CONNECT_FORMAT: u8 = 0x80;
pub const SC_CONNECT_CTRL_BUSY: u8 = 0x81;
pub const SC_CONNECT_INVALID_PARAM: u8 = 0x82;
pub const SC_CONNECT_RESTART_DISC: u8 = 0x83;
pub const SC_CONNECT_INVALID_HOST: u8 = 0x84;
/// Fabrics (SCT 1): the queue has not authenticated yet (DH-HMAC-CHAP).
pub const SC_AUTH_REQUIRED: u8 = 0x91;

// Media and data integrity errors (SCT 2).
pub const SC_WRITE_FAULT: u8 = 0x80;
pub const SC_UNRECOVERED_READ: u8 = 0x81;

// Path Related Status (SCT 3h).
/// Asymmetric Access Persistent Loss: the namespace is gone from this controller for good.
pub const SC_ANA_PERSISTENT_LOSS: u8 = 0x01;
/// Asymmetric Access Inaccessible: this controller cannot reach the namespace now.
pub const SC_ANA_INACCESSIBLE: u8 = 0x02;
/// Asymmetric Access Transition.
pub const SC_ANA_TRANSITION: u8 = 0x03;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_round_trip() {
        let s = Status::cmd_specific(SC_CONNECT_INVALID_HOST);
        let f = s.to_field();
        assert_eq!(f, (0x84 << 1) | (1 << 9) | (1 << 15));
        assert_eq!(Status::from_field(f), s);
        assert_eq!(Status::SUCCESS.to_field(), 0);
        assert!(!Status::generic(0).dnr, "success never sets DNR");
    }
}
