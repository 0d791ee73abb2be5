//! The NVMe-oF target: subsystems, controllers, namespaces, discovery, ANA,
//! and the NVMe/TCP transport that carries them.
//!
//! Command families live in their own files, found by their spec names:
//! `fabrics.rs` (Connect, Property Get/Set), `admin.rs` (Identify, Get Log
//! Page, features, AER, Keep Alive), `io.rs` (Read, Write, Flush, Write
//! Zeroes, Dataset Management), `discovery.rs`, `ana.rs`. `tcp/` is only the
//! transport: PDU framing, R2T tracking, reactors.

pub mod admin;
pub mod ana;
pub mod bufpool;
pub mod config;
pub mod controller;
pub mod discovery;
pub mod fabrics;
pub mod io;
<<<<<<< HEAD
pub mod queue;
=======
>>>>>>> h-resv
pub mod reservation;
pub mod subsystem;
mod target;
pub mod tcp;

pub use config::{ListenerConfig, ListenerKind, TransportConfig};
pub use controller::{Controller, FreeReason};
pub use subsystem::{Namespace, NamespaceError, Subsystem};
pub use target::Target;
pub use tcp::{Server, StartError};

/// Our IEEE vendor id field: 0x1D1D is unassigned in PCI-SIG's list; fabrics hosts ignore it.
pub const VENDOR_ID: u16 = 0x1d1d;
pub const FIRMWARE_REV: &str = env!("CARGO_PKG_VERSION");
