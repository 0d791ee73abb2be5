//! The state a queue's callers and its connection task share: the command
//! slots, the pending submissions and the settings both sides read.
//!
//! It sits apart from `queue` (the callers' side) and `conn` (the socket
//! task's side) so each imports these types without importing the other.

use std::net::SocketAddr;
use std::task::Waker;
use std::time::{Duration, Instant};

use blockdev::AlignedBuf;
use nvme_wire::pdu::DigestMode;
use nvme_wire::sqe::Sqe;
use nvme_wire::status::Status;
use parking_lot::Mutex;
use tokio::sync::Semaphore;

use crate::error::{HostError, Result};

/// How a command's data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataDir {
    None,
    /// Controller to host: C2HData PDUs into the buffer.
    ToHost,
    /// Host to controller: in-capsule when it fits the queue's limit, else R2T/H2CData.
    FromHost,
    /// Host to controller, in the capsule whatever the limit (Connect data).
    InCapsule,
}

/// A command's completion entry, as far as callers need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Response {
    pub status: Status,
    pub dw0: u32,
    pub dw1: u32,
}

pub(crate) type Outcome = Result<Response>;

/// What a queue is asked to be.
#[derive(Debug, Clone)]
pub(crate) struct QueueParams {
    pub addr: SocketAddr,
    pub qid: u16,
    /// Commands in flight at most (the Connect SQSIZE is this minus one).
    pub depth: u16,
    pub hdr_digest: bool,
    pub data_digest: bool,
    pub timeout: Duration,
    /// Write data up to this many bytes goes inside the command capsule.
    pub icd_limit: u32,
    /// Keep polling the socket this long after activity before sleeping (0: never poll).
    pub poll: Duration,
    /// One PDU per write system call (see `HostOptions::pdu_per_write`).
    pub pdu_per_write: bool,
    /// Open a TLS 1.3 channel before the ICReq.
    pub tls: Option<TlsChannel>,
}

/// The PSK a queue's TLS channel offers: the host's configured key and the
/// identity (host and subsystem NQN, version) it is derived for.
#[derive(Debug, Clone)]
pub struct TlsChannel {
    pub key: nvme_wire::tls_psk::ConfiguredPsk,
    pub hostnqn: String,
    pub subnqn: String,
    /// PSK identity version: 0 (`NVMe0R..`) or 1 (with the PSK digest).
    pub version: u8,
}

/// What the ICReq/ICResp exchange settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Negotiated {
    pub hdgst: bool,
    pub ddgst: bool,
    pub maxh2cdata: u32,
    /// Alignment of data in the PDUs we send: (CPDA + 1) dwords.
    pub cpda: u8,
}

impl Negotiated {
    pub fn digests(&self) -> DigestMode {
        DigestMode {
            header: self.hdgst,
            data: self.ddgst,
        }
    }
}

pub(crate) struct Submission {
    pub cid: u16,
    pub sqe: Sqe,
    pub dir: DataDir,
    pub buf: AlignedBuf,
    pub at: Instant,
}

pub(crate) enum Slot {
    Free,
    /// In flight; the waker of the caller awaiting it.
    Waiting(Option<Waker>),
    /// In flight, but its caller stopped waiting: free it on completion.
    Abandoned,
    Done(Outcome, AlignedBuf),
}

pub(crate) struct State {
    pub pending: Vec<Submission>,
    pub slots: Vec<Slot>,
    pub free: Vec<u16>,
    pub conn_waker: Option<Waker>,
    pub closing: bool,
    pub dead: Option<HostError>,
}

pub(crate) struct Shared {
    pub p: QueueParams,
    pub neg: Negotiated,
    pub state: Mutex<State>,
    pub permits: Semaphore,
}

impl Shared {
    pub fn closed_error(&self, why: &'static str) -> HostError {
        HostError::Closed {
            addr: self.p.addr,
            qid: self.p.qid,
            why,
        }
    }

    pub fn wake_conn(&self) {
        let w = self.state.lock().conn_waker.take();
        if let Some(w) = w {
            w.wake();
        }
    }
}
