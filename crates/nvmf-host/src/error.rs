//! What can go wrong talking to a target, each error saying what happened,
//! with which values, and what to check.

use std::net::SocketAddr;
use std::time::Duration;

use nvme_wire::pdu::Fes;
use nvme_wire::status::{SCT_CMD_SPECIFIC, SCT_GENERIC, SCT_MEDIA, Status};

/// A failed completion status, shown with its spec name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmdStatus {
    pub status: Status,
    /// Fabrics commands name their command-specific codes differently.
    pub fabrics: bool,
}

impl std::fmt::Display for CmdStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.status;
        write!(
            f,
            "status SCT {:#x} SC {:#04x} ({})",
            s.sct,
            s.sc,
            status_name(s.sct, s.sc, self.fabrics)
        )?;
        if s.dnr {
            write!(f, ", do not retry")?;
        }
        Ok(())
    }
}

/// The spec's name for a status code.
pub fn status_name(sct: u8, sc: u8, fabrics: bool) -> &'static str {
    match (sct, sc) {
        (SCT_GENERIC, 0x00) => "Successful Completion",
        (SCT_GENERIC, 0x01) => "Invalid Command Opcode",
        (SCT_GENERIC, 0x02) => "Invalid Field in Command",
        (SCT_GENERIC, 0x03) => "Command ID Conflict",
        (SCT_GENERIC, 0x04) => "Data Transfer Error",
        (SCT_GENERIC, 0x05) => "Commands Aborted due to Power Loss Notification",
        (SCT_GENERIC, 0x06) => "Internal Error",
        (SCT_GENERIC, 0x07) => "Command Abort Requested",
        (SCT_GENERIC, 0x08) => "Command Aborted due to SQ Deletion",
        (SCT_GENERIC, 0x0B) => "Invalid Namespace or Format",
        (SCT_GENERIC, 0x0C) => "Command Sequence Error",
        (SCT_GENERIC, 0x0D) => "Invalid SGL Segment Descriptor",
        (SCT_GENERIC, 0x0E) => "Invalid Number of SGL Descriptors",
        (SCT_GENERIC, 0x0F) => "Data SGL Length Invalid",
        (SCT_GENERIC, 0x11) => "SGL Descriptor Type Invalid",
        (SCT_GENERIC, 0x16) => "SGL Offset Invalid",
        (SCT_GENERIC, 0x22) => "Transient Transport Error",
        (SCT_GENERIC, 0x80) => "LBA Out of Range",
        (SCT_GENERIC, 0x81) => "Capacity Exceeded",
        (SCT_GENERIC, 0x82) => "Namespace Not Ready",
        (SCT_GENERIC, 0x83) => "Reservation Conflict",
        (SCT_GENERIC, 0x18) => "Host Identifier Inconsistent Format",
        (SCT_CMD_SPECIFIC, 0x01) => "Invalid Queue Identifier",
        (SCT_CMD_SPECIFIC, 0x02) => "Invalid Queue Size",
        (SCT_CMD_SPECIFIC, 0x05) => "Asynchronous Event Request Limit Exceeded",
        (SCT_CMD_SPECIFIC, 0x09) => "Invalid Log Page",
        (SCT_CMD_SPECIFIC, 0x0D) => "Feature Identifier Not Saveable",
        (SCT_CMD_SPECIFIC, 0x80) if fabrics => "Connect Incompatible Format",
        (SCT_CMD_SPECIFIC, 0x81) if fabrics => "Connect Controller Busy",
        (SCT_CMD_SPECIFIC, 0x82) if fabrics => "Connect Invalid Parameters",
        (SCT_CMD_SPECIFIC, 0x83) if fabrics => "Connect Restart Discovery",
        (SCT_CMD_SPECIFIC, 0x84) if fabrics => "Connect Invalid Host",
        (SCT_CMD_SPECIFIC, 0x90) if fabrics => "Log Restart Discovery",
        (SCT_CMD_SPECIFIC, 0x91) if fabrics => "Authentication Required",
        (SCT_CMD_SPECIFIC, 0x80) => "Conflicting Attributes",
        (SCT_CMD_SPECIFIC, 0x81) => "Invalid Protection Information",
        (SCT_CMD_SPECIFIC, 0x82) => "Attempted Write to Read Only Range",
        (SCT_MEDIA, 0x80) => "Write Fault",
        (SCT_MEDIA, 0x81) => "Unrecovered Read Error",
        (SCT_MEDIA, 0x82) => "End-to-end Guard Check Error",
        (SCT_MEDIA, 0x85) => "Compare Failure",
        (SCT_MEDIA, 0x86) => "Access Denied",
        (SCT_MEDIA, 0x87) => "Deallocated or Unwritten Logical Block",
        (3, 0x00) => "Internal Path Error",
        (3, 0x01) => "Asymmetric Access Persistent Loss",
        (3, 0x02) => "Asymmetric Access Inaccessible",
        (3, 0x03) => "Asymmetric Access Transition",
        (3, 0x60) => "Controller Pathing Error",
        (3, 0x70) => "Host Pathing Error",
        (3, 0x71) => "Command Aborted By Host",
        _ => "unknown status code",
    }
}

/// The meaning of a TermReq Fatal Error Status code.
pub fn fes_name(fes: u16) -> &'static str {
    match Fes::from_u16(fes) {
        Some(Fes::InvalidHeaderField) => "invalid PDU header field",
        Some(Fes::PduSequenceError) => "PDU sequence error",
        Some(Fes::HeaderDigestError) => "header digest error",
        Some(Fes::DataTransferOutOfRange) => "data transfer out of range",
        Some(Fes::DataTransferLimitExceeded) => "data transfer limit exceeded (R2T limit)",
        Some(Fes::UnsupportedParameter) => "unsupported parameter",
        None => "unknown FES code",
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum HostError {
    #[error(
        "cannot connect to {addr}: connection refused; check that the target runs and listens \
         on this address and port (flashpool serve, or the kernel nvmet port)"
    )]
    Refused { addr: SocketAddr },

    #[error("cannot connect to {addr}: {msg}")]
    Connect { addr: SocketAddr, msg: String },

    #[error(
        "{addr}: {what} got no answer within {after:?}; the target may be hung or overloaded, \
         or this is not an NVMe/TCP port (raise the timeout if the target is just slow)"
    )]
    Timeout {
        addr: SocketAddr,
        what: String,
        after: Duration,
    },

    #[error(
        "{addr}: the target has no subsystem {subnqn} (Connect Invalid Parameters, IPO 256 = SUBNQN); \
         check the NQN, or list the subsystems with a discovery on port 8009"
    )]
    UnknownSubsystem { addr: SocketAddr, subnqn: String },

    #[error(
        "{addr}: host {hostnqn} is not allowed on {subnqn} (Connect Invalid Host, SCT 0x1 SC 0x84); \
         add this host NQN to the subsystem's hosts, or set allow_any_host = true there; \
         a host with a TLS key there must connect over TLS (the target's log says which)"
    )]
    HostNotAllowed {
        addr: SocketAddr,
        hostnqn: String,
        subnqn: String,
    },

    #[error("{addr}: DH-HMAC-CHAP authentication of queue {qid} failed: {why}")]
    Authentication {
        addr: SocketAddr,
        qid: u16,
        why: String,
    },

    #[error("{addr}: Connect refused: Invalid Parameters at {place}")]
    ConnectInvalidParameter { addr: SocketAddr, place: String },

    #[error("{addr}: {what} failed: {status}")]
    Status {
        addr: SocketAddr,
        what: String,
        status: CmdStatus,
    },

    #[error(
        "{addr}: header digest mismatch on a {pdu} PDU from the target (computed {computed:#010x}, \
         received {received:#010x}); the connection was closed"
    )]
    HeaderDigest {
        addr: SocketAddr,
        pdu: &'static str,
        computed: u32,
        received: u32,
    },

    #[error(
        "{addr}: data digest mismatch in read data for command {cid} (computed {computed:#010x}, \
         received {received:#010x}); the data is corrupt in transit"
    )]
    DataDigest {
        addr: SocketAddr,
        cid: u16,
        computed: u32,
        received: u32,
    },

    #[error(
        "{addr}: the target ended the connection with a C2HTermReq: FES {fes:#x} ({}), FEI {fei:#x}",
        fes_name(*.fes)
    )]
    TermReq {
        addr: SocketAddr,
        fes: u16,
        fei: u32,
    },

    #[error("{addr}: protocol error from the target: {msg}; the connection was closed")]
    Protocol { addr: SocketAddr, msg: String },

    #[error("{addr}: connection lost: {msg}")]
    ConnectionLost { addr: SocketAddr, msg: String },

    #[error(
        "{addr}: no TLS channel: {msg} (does the target have this host's TLS key for this subsystem?)"
    )]
    Tls { addr: SocketAddr, msg: String },

    #[error("{addr}: queue {qid} is closed ({why})")]
    Closed {
        addr: SocketAddr,
        qid: u16,
        why: &'static str,
    },

    #[error("{addr}: controller reported a fatal status (CSTS.CFS) after {when}")]
    ControllerFatal {
        addr: SocketAddr,
        when: &'static str,
    },

    #[error("invalid request: {0}")]
    Invalid(String),
}

impl HostError {
    /// The completion status, for errors that are a command's failed status.
    pub fn status(&self) -> Option<Status> {
        match self {
            HostError::Status { status, .. } => Some(status.status),
            _ => None,
        }
    }

    /// A command refused with Reservation Conflict (SCT 0, SC 83h): another
    /// host holds a reservation, or this host's registration was preempted.
    pub fn is_reservation_conflict(&self) -> bool {
        self.status().is_some_and(|s| {
            s.sct == SCT_GENERIC && s.sc == nvme_wire::status::SC_RESERVATION_CONFLICT
        })
    }

    /// The connection ended or could not be made (as opposed to a command
    /// the controller answered with a status): a reconnect may help.
    pub fn is_transport(&self) -> bool {
        !matches!(
            self,
            HostError::Status { .. } | HostError::Invalid(_) | HostError::Authentication { .. }
        )
    }
}

pub type Result<T, E = HostError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        "127.0.0.1:4420".parse().unwrap()
    }

    #[test]
    fn status_shows_sct_sc_and_name() {
        let e = HostError::Status {
            addr: addr(),
            what: "Read nsid 1 LBA 100+8".into(),
            status: CmdStatus {
                status: Status::generic(0x80),
                fabrics: false,
            },
        };
        let s = e.to_string();
        assert!(s.contains("SCT 0x0 SC 0x80 (LBA Out of Range)"), "{s}");
        assert!(s.contains("Read nsid 1 LBA 100+8"), "{s}");
        assert_eq!(e.status().unwrap().sc, 0x80);
        let c = CmdStatus {
            status: Status::cmd_specific(0x82),
            fabrics: true,
        };
        assert!(c.to_string().contains("Connect Invalid Parameters"));
        let c = CmdStatus {
            status: Status::cmd_specific(0x82),
            fabrics: false,
        };
        assert!(c.to_string().contains("Read Only"));
    }

    #[test]
    fn termreq_names_fes_and_fei() {
        let s = HostError::TermReq {
            addr: addr(),
            fes: 3,
            fei: 0,
        }
        .to_string();
        assert!(s.contains("FES 0x3 (header digest error), FEI 0x0"), "{s}");
        assert_eq!(fes_name(99), "unknown FES code");
    }
}
