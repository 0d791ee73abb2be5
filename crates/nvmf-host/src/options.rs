//! What a host asks of a controller association (`HostOptions`, the TLS
//! key it offers) and who the host is (host NQN and host ID, derived the way
//! nvme-cli does), checked before any queue is opened.

use std::time::Duration;

use nvme_wire::fabrics::NQN_MAX_LEN;

use crate::error::{HostError, Result};
use crate::slot::TlsChannel;

/// How to reach a subsystem and how the queues should be set up.
#[derive(Debug, Clone)]
pub struct HostOptions {
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub hdr_digest: bool,
    pub data_digest: bool,
    /// Keep-alive timeout asked for in the admin Connect; 0 = none. Keep Alive goes out every KATO/2.
    pub kato_ms: u32,
    /// I/O queues to ask for (Set Features Number of Queues) and, unless `lazy_io_queues`, to connect.
    pub nr_io_queues: u16,
    /// Commands in flight per I/O queue (capped by the controller's CAP.MQES and MAXCMD).
    pub queue_depth: u16,
    /// Limit for connecting and for every command.
    pub timeout: Duration,
    /// Disable SQ flow control in the I/O Connects (the target may then answer reads with
    /// a C2HData carrying SUCCESS instead of a C2HData plus a CapsuleResp).
    pub disable_sqflow: bool,
    /// While commands are in flight, keep polling an I/O queue's socket for
    /// this many microseconds after its last activity instead of sleeping:
    /// waking a sleeping thread costs tens to hundreds of microseconds on
    /// small VMs. Burns CPU while it polls; 0 (the default) never polls.
    pub poll_us: u32,
    /// Put at most this many bytes of write data inside a command capsule
    /// (less if the controller's IOCCSZ allows less); more goes by R2T.
    /// None: as much as the controller allows.
    pub in_capsule_max: Option<u32>,
    /// Hand each PDU to the kernel in a write of its own instead of
    /// gathering whatever is queued into one writev (benchmarks: the
    /// send pattern of a client that does not batch).
    pub pdu_per_write: bool,
    /// Connect no I/O queue in `connect`; the caller adds each with
    /// [`Controller::add_io_queue`] on the runtime (thread) that will use it.
    pub lazy_io_queues: bool,
    /// DH-HMAC-CHAP secrets, used when a Connect response asks for
    /// authentication (AUTHREQ.ATR); without them such a Connect fails.
    pub dhchap: Option<crate::auth::DhchapKeys>,
    /// A configured TLS PSK: every queue then opens a TLS 1.3 channel
    /// (TP 8011) before its ICReq.
    pub tls: Option<TlsKey>,
}

/// The host's configured TLS PSK and the identity version it offers.
#[derive(Debug, Clone)]
pub struct TlsKey {
    pub key: nvme_wire::tls_psk::ConfiguredPsk,
    /// 0: `NVMe0Rhh <hostnqn> <subnqn>`; 1: the same with the PSK digest.
    pub identity_version: u8,
}

pub(crate) fn tls_channel(o: &HostOptions, subnqn: &str) -> Option<TlsChannel> {
    o.tls.as_ref().map(|t| TlsChannel {
        key: t.key.clone(),
        hostnqn: o.hostnqn.clone(),
        subnqn: subnqn.to_string(),
        version: t.identity_version,
    })
}

impl Default for HostOptions {
    fn default() -> Self {
        let (hostnqn, hostid) = default_host_identity();
        HostOptions {
            hostnqn,
            hostid,
            hdr_digest: false,
            data_digest: false,
            kato_ms: 5000,
            nr_io_queues: 1,
            queue_depth: 128,
            timeout: Duration::from_secs(10),
            disable_sqflow: true,
            poll_us: 0,
            in_capsule_max: None,
            pdu_per_write: false,
            lazy_io_queues: false,
            dhchap: None,
            tls: None,
        }
    }
}

/// The host identity nvme-cli would use (/etc/nvme/hostnqn, /etc/nvme/hostid),
/// else one derived from /etc/machine-id, so that a host keeps its NQN across runs.
pub fn default_host_identity() -> (String, [u8; 16]) {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let seed = read("/etc/machine-id")
        .or_else(|| read("/proc/sys/kernel/hostname"))
        .unwrap_or_else(|| "flashpool".into());
    let mut id = host_id_from(&seed);
    if let Some(h) = read("/etc/nvme/hostid").as_deref().and_then(parse_uuid) {
        id = h;
    }
    let nqn = read("/etc/nvme/hostnqn")
        .filter(|n| n.starts_with("nqn.") && n.len() <= NQN_MAX_LEN)
        .unwrap_or_else(|| format!("nqn.2014-08.org.nvmexpress:uuid:{}", uuid_string(&id)));
    (nqn, id)
}

/// A host ID (UUID-shaped) derived from `seed`: the same seed gives the same
/// ID on every run, so a host keeps its reservations.
pub fn host_id_from(seed: &str) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&fnv(seed.as_bytes(), 1).to_be_bytes());
    id[8..].copy_from_slice(&fnv(seed.as_bytes(), 2).to_be_bytes());
    id[6] = (id[6] & 0x0F) | 0x80;
    id[8] = (id[8] & 0x3F) | 0x80;
    id
}

/// A UUID in text (with or without dashes) as 16 bytes.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn fnv(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed.wrapping_mul(0x100_0000_01b3);
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn uuid_string(id: &[u8; 16]) -> String {
    let h: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

pub(crate) fn check_options(subnqn: &str, o: &HostOptions) -> Result<()> {
    for (what, nqn) in [("subsystem NQN", subnqn), ("host NQN", o.hostnqn.as_str())] {
        if nqn.is_empty() || nqn.len() > NQN_MAX_LEN {
            return Err(HostError::Invalid(format!(
                "{what} {nqn:?} must be 1 to {NQN_MAX_LEN} bytes"
            )));
        }
    }
    if o.queue_depth < 2 {
        return Err(HostError::Invalid(format!(
            "queue depth {} is too small; a queue needs at least 2 entries",
            o.queue_depth
        )));
    }
    if o.timeout.is_zero() {
        return Err(HostError::Invalid("timeout must be above zero".into()));
    }
    Ok(())
}
