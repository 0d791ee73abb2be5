//! NVM subsystems and their namespaces.
//!
//! The namespace list is a snapshot (`Arc<[Namespace]>`) swapped whole when
//! a namespace is added or removed at run time; I/O queues keep their
//! snapshot and reload it only when `ns_version` moves (one relaxed load per
//! command), so the I/O path takes no lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use blockdev::BlockDevice;
use nvme_wire::tls_psk::ConfiguredPsk;
use parking_lot::RwLock;

use crate::ns_resv::NsReservations;
use crate::qos::NsQos;
use crate::stats::NsIoStats;

/// One namespace: a block device with its identifiers. Immutable once built,
/// so I/O queues read it without locks.
#[derive(Clone)]
pub struct Namespace {
    pub nsid: u32,
    pub dev: Arc<dyn BlockDevice>,
    pub block_size: u32,
    pub lba_shift: u8,
    pub num_blocks: u64,
    pub uuid: [u8; 16],
    pub nguid: [u8; 16],
    pub ana_group: u32,
    /// Registrations and the reservation; shared by every snapshot.
    pub resv: Arc<NsReservations>,
    /// I/O counters and latencies, shared by every snapshot.
    pub stats: Arc<NsIoStats>,
    /// QoS limits and buckets, shared by every snapshot (and changed live).
    pub qos: Arc<NsQos>,
}

impl Namespace {
    pub fn new(nsid: u32, dev: Arc<dyn BlockDevice>, uuid: [u8; 16], nguid: [u8; 16]) -> Self {
        let g = dev.geometry();
        Namespace {
            nsid,
            block_size: g.block_size,
            lba_shift: g.block_size.trailing_zeros() as u8,
            num_blocks: g.num_blocks,
            uuid,
            nguid,
            ana_group: crate::ana::DEFAULT_GROUP,
            resv: Arc::new(NsReservations::load(&*dev)),
            stats: Arc::default(),
            qos: Arc::default(),
            dev,
        }
    }

    /// The same namespace under these QoS limits (kept by the caller, who
    /// changes them live with [`NsQos::set`]).
    pub fn with_qos(mut self, qos: Arc<NsQos>) -> Self {
        self.qos = qos;
        self
    }

    /// The same namespace in ANA group `grpid` (1..=`ana::MAX_GROUPS`).
    pub fn with_ana_group(mut self, grpid: u32) -> Result<Self, NamespaceError> {
        if !crate::ana::AnaGroups::valid_group(grpid) {
            return Err(NamespaceError::AnaGroupOutOfRange {
                grpid,
                max: crate::ana::MAX_GROUPS,
            });
        }
        self.ana_group = grpid;
        Ok(self)
    }
}

pub struct Subsystem {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    /// Sorted by NSID.
    namespaces: RwLock<Arc<[Namespace]>>,
    ns_version: AtomicU64,
    /// Served by every node of the cluster: the discovery log lists it on
    /// the peer portals too.
    cluster_wide: AtomicBool,
    /// DH-HMAC-CHAP secrets by host NQN: these hosts must authenticate.
    host_auth: std::collections::HashMap<String, Arc<crate::auth::HostAuth>>,
    /// Configured TLS PSKs by host NQN: these hosts must use TLS.
    host_tls: std::collections::HashMap<String, ConfiguredPsk>,
    /// Every host must come over TLS.
    require_tls: bool,
}

/// Why a namespace could not be added or removed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceError {
    #[error("subsystem {nqn} already has namespace {nsid}; pick another nsid")]
    NsidInUse { nqn: String, nsid: u32 },
    #[error("nsid {nsid} is out of range; use 1 to {max}")]
    NsidOutOfRange { nsid: u32, max: u32 },
    #[error("subsystem {nqn} has no namespace {nsid}")]
    NoSuchNamespace { nqn: String, nsid: u32 },
    #[error("no subsystem {0}; declare it in the node's TOML ([[subsystem]])")]
    NoSuchSubsystem(String),
    #[error("subsystem {0} exists already")]
    SubsystemExists(String),
    #[error("ANA group {grpid} is out of range; use 1 to {max}")]
    AnaGroupOutOfRange { grpid: u32, max: u32 },
}

impl Subsystem {
    /// `namespaces` in any order; NSIDs must be distinct.
    pub fn new(
        nqn: String,
        serial: String,
        model: String,
        allow_any_host: bool,
        hosts: Vec<String>,
        mut namespaces: Vec<Namespace>,
    ) -> Subsystem {
        namespaces.sort_by_key(|n| n.nsid);
        Subsystem {
            nqn,
            serial,
            model,
            allow_any_host,
            hosts,
            namespaces: RwLock::new(namespaces.into()),
            ns_version: AtomicU64::new(0),
            cluster_wide: AtomicBool::new(false),
            host_auth: Default::default(),
            host_tls: Default::default(),
            require_tls: false,
        }
    }

    /// `hostnqn` must connect over TLS with a PSK derived from `key`.
    pub fn set_host_tls(&mut self, hostnqn: String, key: ConfiguredPsk) {
        self.host_tls.insert(hostnqn, key);
    }

    /// The configured TLS PSK of `hostnqn`, if it has one here.
    pub fn host_tls(&self, hostnqn: &str) -> Option<&ConfiguredPsk> {
        self.host_tls.get(hostnqn)
    }

    /// Every host must connect over TLS.
    pub fn set_require_tls(&mut self, on: bool) {
        self.require_tls = on;
    }

    pub fn require_tls(&self) -> bool {
        self.require_tls
    }

    /// Whether `hostnqn` may only connect over TLS.
    pub fn tls_required_for(&self, hostnqn: &str) -> bool {
        self.require_tls || self.host_tls.contains_key(hostnqn)
    }

    /// Requires DH-HMAC-CHAP from `hostnqn` with these secrets.
    pub fn set_host_auth(&mut self, hostnqn: String, auth: crate::auth::HostAuth) {
        self.host_auth.insert(hostnqn, Arc::new(auth));
    }

    /// The secrets `hostnqn` authenticates with, if it must.
    pub fn host_auth(&self, hostnqn: &str) -> Option<Arc<crate::auth::HostAuth>> {
        self.host_auth.get(hostnqn).cloned()
    }

    pub fn cluster_wide(&self) -> bool {
        self.cluster_wide.load(Ordering::Relaxed)
    }

    /// Marks the subsystem cluster-wide; returns the previous value. On a
    /// running target use `Target::set_cluster_wide`, which also tells
    /// discovery controllers.
    pub fn set_cluster_wide(&self, on: bool) -> bool {
        self.cluster_wide.swap(on, Ordering::Relaxed)
    }

    /// The current namespaces, sorted by NSID.
    pub fn namespaces(&self) -> Arc<[Namespace]> {
        self.namespaces.read().clone()
    }

    /// Bumped on every namespace change; queues compare it to reload.
    pub fn ns_version(&self) -> u64 {
        self.ns_version.load(Ordering::Acquire)
    }

    /// Adds a namespace. The caller tells live controllers (Target does).
    pub(crate) fn insert_namespace(&self, ns: Namespace) -> Result<(), NamespaceError> {
        if ns.nsid == 0 || ns.nsid > MAX_NSID {
            return Err(NamespaceError::NsidOutOfRange {
                nsid: ns.nsid,
                max: MAX_NSID,
            });
        }
        let mut cur = self.namespaces.write();
        if find_namespace(&cur, ns.nsid).is_some() {
            return Err(NamespaceError::NsidInUse {
                nqn: self.nqn.clone(),
                nsid: ns.nsid,
            });
        }
        let mut list: Vec<Namespace> = cur.iter().cloned().collect();
        list.push(ns);
        list.sort_by_key(|n| n.nsid);
        *cur = list.into();
        self.ns_version.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Removes a namespace; queues still holding the old snapshot finish
    /// their commands on it, new commands see it gone.
    pub(crate) fn take_namespace(&self, nsid: u32) -> Result<Namespace, NamespaceError> {
        let mut cur = self.namespaces.write();
        let Some(old) = find_namespace(&cur, nsid).cloned() else {
            return Err(NamespaceError::NoSuchNamespace {
                nqn: self.nqn.clone(),
                nsid,
            });
        };
        let list: Vec<Namespace> = cur.iter().filter(|n| n.nsid != nsid).cloned().collect();
        *cur = list.into();
        self.ns_version.fetch_add(1, Ordering::AcqRel);
        Ok(old)
    }

    /// Sets a namespace's size to what its device reports now (it grew);
    /// returns the old and new block counts. Queues reload the snapshot,
    /// so commands after this see the new size.
    pub(crate) fn refresh_size(&self, nsid: u32) -> Result<(u64, u64), NamespaceError> {
        let mut cur = self.namespaces.write();
        let Some(old) = find_namespace(&cur, nsid).cloned() else {
            return Err(NamespaceError::NoSuchNamespace {
                nqn: self.nqn.clone(),
                nsid,
            });
        };
        let g = old.dev.geometry();
        if g.block_size != old.block_size {
            // a device never changes its block size under a namespace
            return Ok((old.num_blocks, old.num_blocks));
        }
        let list: Vec<Namespace> = cur
            .iter()
            .map(|n| {
                let mut n = n.clone();
                if n.nsid == nsid {
                    n.num_blocks = g.num_blocks;
                }
                n
            })
            .collect();
        *cur = list.into();
        self.ns_version.fetch_add(1, Ordering::AcqRel);
        Ok((old.num_blocks, g.num_blocks))
    }

    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.hosts.iter().any(|h| h == hostnqn)
    }

    pub fn namespace(&self, nsid: u32) -> Option<Namespace> {
        find_namespace(&self.namespaces.read(), nsid).cloned()
    }
}

pub fn find_namespace(list: &[Namespace], nsid: u32) -> Option<&Namespace> {
    list.binary_search_by_key(&nsid, |n| n.nsid)
        .ok()
        .map(|i| &list[i])
}

/// Highest NSID a host may address (Identify Controller NN).
pub const MAX_NSID: u32 = 1024;
