//! An async NVMe/TCP host (initiator) on tokio.
//!
//! ```no_run
//! # async fn demo() -> Result<(), nvmf_host::HostError> {
//! use nvmf_host::{Controller, HostOptions};
//! let addr = "127.0.0.1:4420".parse().unwrap();
//! let ctrl = Controller::connect(addr, "nqn.2026-01.io.flashpool:default", HostOptions::default()).await?;
//! let ns = ctrl.identify_namespace(1).await?;
//! let mut buf = vec![0u8; ns.lba_size as usize * 8];
//! ctrl.read(1, 1, 0, 8, &mut buf).await?;
//! ctrl.disconnect().await?;
//! # Ok(()) }
//! ```
//!
//! One queue pair is one TCP connection served by one task (`conn.rs`) on
//! the runtime that connected it; callers on any thread submit commands to
//! it (`queue.rs`). `controller.rs` is the bring-up and the admin commands,
//! `io.rs` the I/O commands, `resv.rs` the reservation commands,
//! `discovery.rs` the discovery service, and `remote/` the `BlockDevice` over
//! a remote namespace ([`remote::RemoteDevice`]).

mod auth;
mod conn;
mod controller;
mod discovery;
mod error;
#[cfg(test)]
mod fake_tests;
mod identify;
mod io;
mod options;
mod out;
mod queue;
pub mod remote;
mod resv;
mod slot;

pub use auth::DhchapKeys;
pub use controller::{ADMIN_QUEUE_DEPTH, Controller};
pub use discovery::{discover, discover_with};
pub use error::{CmdStatus, HostError, Result, fes_name, status_name};
pub use identify::{ControllerInfo, NamespaceInfo};
pub use io::{IoQueue, MAX_DSM_RANGES, MAX_NLB, RW_FUA};
pub use nvme_wire::auth::dhchap::{DhGroup, HashId, Secret, SecretError};
pub use nvme_wire::fabrics::discovery::Entry as DiscoveryEntry;
pub use nvme_wire::reservation::{
    AcquireAction, RegisterAction, RegisteredCtrl, ReleaseAction, ResvType, cptpl,
};
pub use nvme_wire::tls_psk::{ConfiguredPsk, PskError};
pub use options::{HostOptions, TlsKey, default_host_identity, host_id_from, parse_uuid};
pub use queue::{buf_from, zeroed_buf};
pub use resv::ReservationStatus;
