//! The `remote` block device: a namespace on another node, reached over
//! NVMe/TCP, usable wherever a `BlockDevice` is (a volume member, a
//! namespace of our own target).
//!
//! - `url.rs`: `tcp://ADDR:PORT/NQN?nsid=N`.
//! - `link.rs`: one association at a time (admin queue with keep-alive,
//!   several I/O queues), the identity check on every connect, and the
//!   task that reconnects with back-off and publishes the [`LinkState`].
//! - `ana.rs`: a namespace's state in an ANA log page ([`RemoteDevice::ana_state`]).
//! - `reactors.rs`: queues bound to the threads that submit (target reactors).
//! - `device.rs`: [`RemoteDevice`]: the I/O path (queue choice, MDTS
//!   splitting, one retry on a new connection, NVMe status to
//!   `BlockError`), and the reservation helpers.
//!
//! The connections run on a runtime the device does not borrow from its
//! callers (by default a process-wide one with two threads, see
//! [`runtime`]): `submit` is called from target reactor threads and from
//! other runtimes, and its future only needs a waker, so it can be polled by
//! any executor.

mod ana;
mod device;
mod link;
mod reactors;
mod url;

use std::fmt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use device::RemoteDevice;
pub use reactors::bind_reactors;
pub use url::{DEFAULT_PORT, RemoteUrl};

use crate::options::HostOptions;

/// How a remote device connects and how it rides out a lost connection.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Host identity (hostnqn, hostid: the reservation registrant), digests,
    /// queue depth, connect timeout. `nr_io_queues`, `kato_ms` and
    /// `lazy_io_queues` are set from the fields below.
    pub host: HostOptions,
    /// Shared I/O queues (connections) to the namespace, which any thread
    /// may use; a registered reactor with a steady load adds one of its own
    /// ([`bind_reactors`]).
    pub io_queues: u16,
    /// Keep-alive timeout asked for; the host sends Keep Alive every half of it.
    pub kato: Duration,
    /// A command unanswered this long tears its connection down (it cannot
    /// be trusted any more) and goes through reconnect.
    pub io_timeout: Duration,
    /// Unreachable longer than this, waiting and new I/O fail at once with
    /// `BlockError::Unreachable`; reconnect attempts go on in the background.
    pub fail_after: Duration,
    /// Back-off between reconnect attempts: from `reconnect_min`, doubling, at most `reconnect_max`.
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// The identity the namespace must have; None: the one found on the first connect.
    pub expect: Option<NsIdentity>,
    /// Runtime for the shared queues' connections; None: the process-wide
    /// [`runtime`]. (A reactor's queue runs on that reactor's runtime.)
    pub runtime: Option<tokio::runtime::Handle>,
    /// Ask the controller for one more I/O queue per registered reactor
    /// ([`bind_reactors`]; as many as the machine has CPUs while none is
    /// registered yet). Off: the shared queues only, and no reactor binds.
    pub reactor_queues: bool,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            host: HostOptions {
                queue_depth: 128,
                timeout: Duration::from_secs(5),
                ..HostOptions::default()
            },
            io_queues: 2,
            kato: Duration::from_secs(3),
            io_timeout: Duration::from_secs(5),
            fail_after: Duration::from_secs(2),
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(1),
            expect: None,
            runtime: None,
            reactor_queues: true,
        }
    }
}

/// Where the connection to a remote namespace stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// Serving I/O.
    Connected,
    /// Lost at `since`; I/O waits (at most until `fail_after`).
    Reconnecting { since: Instant },
    /// Unreachable since `since` for longer than `fail_after`: I/O fails at
    /// once; reconnect attempts go on, and the state returns to Connected.
    Down { since: Instant, why: String },
    /// A reconnect found another namespace (or subsystem) behind the URL.
    /// Final: every I/O fails with `BlockError::IdentityChanged`.
    IdentityChanged { why: String },
    /// Shut down by its owner.
    Closed,
}

/// What makes a namespace that namespace: checked on every (re)connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsIdentity {
    pub subnqn: String,
    /// NGUID (Identify Namespace or descriptor type 2); zeroes if none.
    pub nguid: [u8; 16],
    /// EUI-64; zeroes if none.
    pub eui64: [u8; 8],
    /// UUID from the descriptor list (type 3), if reported.
    pub uuid: Option<[u8; 16]>,
}

impl fmt::Display for NsIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        write!(f, "{} nguid {}", self.subnqn, hex(&self.nguid))?;
        if self.eui64 != [0; 8] {
            write!(f, " eui64 {}", hex(&self.eui64))?;
        }
        if let Some(u) = &self.uuid {
            write!(f, " uuid {}", hex(u))?;
        }
        Ok(())
    }
}

/// The process-wide runtime remote devices use unless given one: two
/// worker threads named `nvmf-host`, created on first use.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("nvmf-host")
            .enable_all()
            .build()
            .expect("cannot start the nvmf-host runtime")
    })
}
