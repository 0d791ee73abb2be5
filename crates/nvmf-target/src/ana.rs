//! Asymmetric Namespace Access. Every namespace belongs to one ANA group
//! (1..=MAX_GROUPS); the group's state lives in the Target, so all
//! controllers of all subsystems see one state per group. The cluster layer
//! gives each volume its own group and reports it Optimized on the owner
//! node and Inaccessible elsewhere; the Linux host's native multipath then
//! sends I/O only to the owner.
//!
//! The I/O path reads a group's state with one relaxed load from a fixed
//! table: no lock, no allocation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use parking_lot::RwLock;

use nvme_wire::log_page::ana;
use nvme_wire::status::{self, Status};

pub const DEFAULT_GROUP: u32 = 1;
/// Groups a controller may report (ANAGRPMAX, NANAGRPID). The Linux host
/// sizes its ANA log buffer as 16 + NANAGRPID * 32 + NN * 4 bytes (NN =
/// MAX_NSID when MNAN is 0) and turns ANA off when that exceeds MDTS: 8208
/// bytes here, so ANA needs a max transfer of 16 KiB or more (1 MiB default).
pub const MAX_GROUPS: u32 = 128;
/// Default ANA transition time in seconds.
pub const ANATT: u8 = 10;
/// ANACAP: reports optimized, non-optimized, inaccessible, persistent loss,
/// change; ANAGRPID does not change while attached (bit 6).
pub const ANACAP: u8 = 0x1F | (1 << 6);

/// The ANA log the Linux host reads at most (see `MAX_GROUPS`) from a
/// controller whose NN is `max_nsid`.
pub const fn host_ana_log_len(max_nsid: u32) -> usize {
    ana::HEADER_LEN + MAX_GROUPS as usize * ana::DESC_LEN + max_nsid as usize * 4
}

/// An ANA group's state, as the ANA log and the I/O path report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnaState {
    Optimized,
    NonOptimized,
    Inaccessible,
    PersistentLoss,
    Change,
}

impl AnaState {
    /// The ANA log's state value.
    pub const fn to_wire(self) -> u8 {
        match self {
            AnaState::Optimized => ana::STATE_OPTIMIZED,
            AnaState::NonOptimized => ana::STATE_NON_OPTIMIZED,
            AnaState::Inaccessible => ana::STATE_INACCESSIBLE,
            AnaState::PersistentLoss => ana::STATE_PERSISTENT_LOSS,
            AnaState::Change => ana::STATE_CHANGE,
        }
    }

    pub const fn from_wire(v: u8) -> Option<AnaState> {
        Some(match v {
            ana::STATE_OPTIMIZED => AnaState::Optimized,
            ana::STATE_NON_OPTIMIZED => AnaState::NonOptimized,
            ana::STATE_INACCESSIBLE => AnaState::Inaccessible,
            ana::STATE_PERSISTENT_LOSS => AnaState::PersistentLoss,
            ana::STATE_CHANGE => AnaState::Change,
            _ => return None,
        })
    }

    /// The path status an I/O command gets in this state; None: it runs.
    pub const fn io_status(self) -> Option<Status> {
        match self {
            AnaState::Optimized | AnaState::NonOptimized => None,
            AnaState::Inaccessible => Some(Status::path(status::SC_ANA_INACCESSIBLE)),
            AnaState::PersistentLoss => Some(Status::path(status::SC_ANA_PERSISTENT_LOSS)),
            AnaState::Change => Some(Status::path(status::SC_ANA_TRANSITION)),
        }
    }
}

/// What a group's Optimized (or Non-optimized) state hangs on: the
/// cluster's ownership lease, a monotonic deadline. A node frozen past it
/// (SIGSTOP) reports its lease-bound groups Inaccessible from the instant it
/// wakes, before its agent has run: the ANA log consults the lease itself.
pub trait AnaLease: Send + Sync {
    /// Whether the lease still holds now.
    fn valid(&self) -> bool;
}

/// Every group's state (indexed by ANAGRPID; slot 0 unused), the ANA log
/// change count, and ANATT.
pub struct AnaGroups {
    states: [AtomicU8; MAX_GROUPS as usize + 1],
    /// Groups whose accessible states hold only while `lease` does.
    leased: [AtomicBool; MAX_GROUPS as usize + 1],
    lease: RwLock<Option<Arc<dyn AnaLease>>>,
    change_count: AtomicU64,
    anatt: AtomicU8,
}

impl Default for AnaGroups {
    fn default() -> Self {
        AnaGroups {
            states: std::array::from_fn(|_| AtomicU8::new(ana::STATE_OPTIMIZED)),
            leased: std::array::from_fn(|_| AtomicBool::new(false)),
            lease: RwLock::new(None),
            change_count: AtomicU64::new(0),
            anatt: AtomicU8::new(ANATT),
        }
    }
}

impl AnaGroups {
    pub fn valid_group(grpid: u32) -> bool {
        (1..=MAX_GROUPS).contains(&grpid)
    }

    /// The I/O path's check: one relaxed load. A group outside the table
    /// (a namespace built by hand) counts as Optimized, as before groups.
    #[inline]
    pub fn io_gate(&self, grpid: u32) -> Result<(), Status> {
        let Some(s) = self.states.get(grpid as usize) else {
            return Ok(());
        };
        let v = s.load(Ordering::Relaxed);
        if v <= ana::STATE_NON_OPTIMIZED {
            return Ok(());
        }
        match AnaState::from_wire(v).and_then(AnaState::io_status) {
            Some(st) => Err(st),
            None => Ok(()),
        }
    }

    /// The state the ANA log reports: the set state, except that a
    /// lease-bound group whose lease ran out is Inaccessible whatever was
    /// set (the I/O path needs no such check: the cluster's switch device
    /// refuses I/O past the lease on its own).
    pub fn state(&self, grpid: u32) -> AnaState {
        let set = self
            .states
            .get(grpid as usize)
            .and_then(|s| AnaState::from_wire(s.load(Ordering::Relaxed)))
            .unwrap_or(AnaState::Optimized);
        if matches!(set, AnaState::Optimized | AnaState::NonOptimized) && self.lapsed(grpid) {
            return AnaState::Inaccessible;
        }
        set
    }

    fn lapsed(&self, grpid: u32) -> bool {
        self.leased
            .get(grpid as usize)
            .is_some_and(|b| b.load(Ordering::Acquire))
            && self.lease.read().as_ref().is_some_and(|l| !l.valid())
    }

    /// The lease that lease-bound groups hang on.
    pub(crate) fn set_lease(&self, lease: Option<Arc<dyn AnaLease>>) {
        *self.lease.write() = lease;
    }

    /// Binds group `grpid` to the lease (or frees it).
    pub(crate) fn bind_to_lease(&self, grpid: u32, on: bool) {
        if let Some(b) = self.leased.get(grpid as usize) {
            b.store(on, Ordering::Release);
        }
    }

    /// Sets a group's state; true when it changed (the change count moved).
    pub(crate) fn set(&self, grpid: u32, state: AnaState) -> bool {
        if !Self::valid_group(grpid) {
            return false;
        }
        let old = self.states[grpid as usize].swap(state.to_wire(), Ordering::AcqRel);
        if old == state.to_wire() {
            return false;
        }
        self.change_count.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// The ANA log's Change Count: bumped by every state change.
    pub fn change_count(&self) -> u64 {
        self.change_count.load(Ordering::Acquire)
    }

    pub fn anatt(&self) -> u8 {
        self.anatt.load(Ordering::Relaxed)
    }

    /// ANATT 0 would make the Linux host time a transition out at once.
    pub(crate) fn set_anatt(&self, secs: u8) {
        self.anatt.store(secs.max(1), Ordering::Relaxed);
    }

    /// Builds the ANA log for a controller whose subsystem has the
    /// namespaces `members`, as (NSID, ANAGRPID) pairs: one descriptor per
    /// group they use, in group order; `rgo` leaves out the NSID lists.
    /// (Pairs rather than `Namespace`s, so this module stays below `subsystem`.)
    pub fn log(&self, members: &[(u32, u32)], rgo: bool) -> Vec<u8> {
        let mut grpids: Vec<u32> = members.iter().map(|&(_, g)| g).collect();
        grpids.sort_unstable();
        grpids.dedup();
        let nsids: Vec<Vec<u32>> = grpids
            .iter()
            .map(|g| {
                members
                    .iter()
                    .filter(|&&(_, grp)| grp == *g)
                    .map(|&(nsid, _)| nsid)
                    .collect()
            })
            .collect();
        let groups: Vec<ana::Group<'_>> = grpids
            .iter()
            .zip(&nsids)
            .map(|(&grpid, nsids)| ana::Group {
                grpid,
                state: self.state(grpid).to_wire(),
                nsids,
            })
            .collect();
        let mut b = vec![0u8; ana::log_len(&groups, rgo)];
        ana::encode(self.change_count(), &groups, rgo, &mut b);
        b
    }
}

#[cfg(test)]
#[path = "ana_tests.rs"]
mod tests;
