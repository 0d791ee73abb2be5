//! The NVMe-oF target: subsystems, controllers, namespaces, discovery, ANA,
//! and the NVMe/TCP transport that carries them.
//!
//! Command families live in their own files, found by their spec names:
//! `fabrics.rs` (Connect, Property Get/Set), `admin.rs` (Identify, Get Log
//! Page, features, AER, Keep Alive), `io.rs` (Read, Write, Flush, Write
//! Zeroes, Dataset Management, Reservations), `reservation.rs` (the
//! reservation state machine), `qos.rs` (per-namespace limits),
//! `discovery.rs`, `ana.rs`. `queue/` is the transport-free command core
//! every command goes through; `tcp/` is only the transport: PDU framing,
//! R2T tracking, reactors.

pub mod admin;
pub mod ana;
pub mod auth;
pub mod bufpool;
pub mod config;
pub mod controller;
pub mod discovery;
pub mod fabrics;
pub mod io;
pub mod ns_resv;
pub mod observer;
pub mod qos;
pub mod queue;
pub mod reservation;
pub mod resv_cmd;
pub mod resv_record;
pub mod stats;
pub mod subsystem;
mod target;
pub mod tcp;

pub use ana::AnaState;
pub use config::{ListenerConfig, ListenerKind, TlsMode, TransportConfig};
pub use controller::{Controller, FreeReason};
pub use observer::{ConnectObserver, HostConnected, HostRefused};
pub use subsystem::{Namespace, NamespaceError, Subsystem};
pub use target::{CntlidRangeError, PeerPortal, Target};
pub use tcp::{Server, StartError};

/// PCI vendor id (Identify Controller VID and SSVID). We have none assigned by
/// PCI-SIG, so 0, as Linux nvmet reports by default; 0x1D1D, used before,
/// belongs to another vendor (CNEX Labs in Linux's pci_ids.h).
pub const VENDOR_ID: u16 = 0;
pub const FIRMWARE_REV: &str = env!("CARGO_PKG_VERSION");
