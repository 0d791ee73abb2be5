//! Transport and listener parameters, already validated by the caller.

use std::net::SocketAddr;

#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// Entries per queue (CAP.MQES + 1).
    pub max_queue_depth: u16,
    pub max_io_queues: u16,
    /// In-capsule data bytes accepted on I/O queues (IOCCSZ).
    pub in_capsule_data: u32,
    /// Largest transfer of one command, in bytes (MDTS); a power of two >= 4 KiB.
    pub max_transfer: u32,
    /// Largest H2CData payload we accept (MAXH2CDATA).
    pub max_h2c_data: u32,
    pub header_digest: bool,
    pub data_digest: bool,
    pub kato_max_ms: u32,
    pub reactors: usize,
    /// CPUs to pin reactors to (reactor i -> cpus[i % len]); empty = no pinning.
    pub cpus: Vec<usize>,
    /// Microseconds a reactor spins on an idle socket before it sleeps in epoll.
    /// Waking a sleeping thread costs far more than a short spin on small VMs.
    pub poll_us: u32,
    /// A queue whose host must authenticate (DH-HMAC-CHAP) and has not
    /// finished within this long after its Connect is closed.
    pub auth_timeout_ms: u32,
}

/// In-capsule data accepted on the admin queue: enough for Connect data and small admin writes.
pub const ADMIN_IN_CAPSULE_DATA: u32 = 8192;

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            max_queue_depth: 128,
            max_io_queues: 8,
            in_capsule_data: 8192,
            max_transfer: 1 << 20,
            max_h2c_data: 128 * 1024,
            header_digest: true,
            data_digest: true,
            kato_max_ms: 120_000,
            reactors: 1,
            cpus: Vec::new(),
            poll_us: 0,
            auth_timeout_ms: 30_000,
        }
    }
}

impl TransportConfig {
    /// MDTS as a power of two of 4 KiB pages.
    pub fn mdts(&self) -> u8 {
        (self.max_transfer / 4096).max(1).ilog2() as u8
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerKind {
    /// Listed in the discovery log as a port for I/O controllers.
    Io,
    /// A port hosts use to reach the discovery controller.
    Discovery,
}

/// The listener's secure channel (TP 8011), as the discovery log's TREQ
/// and TSAS advertise it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// Plain TCP only.
    #[default]
    None,
    /// TLS 1.3 or plain TCP: the first byte of a connection tells them apart
    /// (a TLS handshake record is 16h, an ICReq 00h).
    Optional,
    /// TLS 1.3 only; a connection that does not start a handshake is closed.
    Required,
}

#[derive(Debug, Clone)]
pub struct ListenerConfig {
    pub addr: SocketAddr,
    pub kind: ListenerKind,
    pub tls: TlsMode,
}
