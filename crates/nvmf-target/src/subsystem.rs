//! NVM subsystems and their namespaces.

use std::sync::Arc;

use blockdev::BlockDevice;

/// One namespace: a block device with its identifiers. Immutable once built,
/// so I/O queues read it without locks.
pub struct Namespace {
    pub nsid: u32,
    pub dev: Arc<dyn BlockDevice>,
    pub block_size: u32,
    pub lba_shift: u8,
    pub num_blocks: u64,
    pub uuid: [u8; 16],
    pub nguid: [u8; 16],
    pub ana_group: u32,
}

impl Namespace {
    pub fn new(nsid: u32, dev: Arc<dyn BlockDevice>, uuid: [u8; 16], nguid: [u8; 16]) -> Self {
        let g = dev.geometry();
        Namespace {
            nsid,
            block_size: g.block_size,
            lba_shift: g.block_size.trailing_zeros() as u8,
            num_blocks: g.num_blocks,
            dev,
            uuid,
            nguid,
            ana_group: crate::ana::DEFAULT_GROUP,
        }
    }
}

pub struct Subsystem {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    /// Sorted by NSID.
    pub namespaces: Arc<[Namespace]>,
}

impl Subsystem {
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.hosts.iter().any(|h| h == hostnqn)
    }

    pub fn namespace(&self, nsid: u32) -> Option<&Namespace> {
        find_namespace(&self.namespaces, nsid)
    }
}

pub fn find_namespace(list: &[Namespace], nsid: u32) -> Option<&Namespace> {
    list.binary_search_by_key(&nsid, |n| n.nsid)
        .ok()
        .map(|i| &list[i])
}

/// Highest NSID a host may address (Identify Controller NN).
pub const MAX_NSID: u32 = 1024;
