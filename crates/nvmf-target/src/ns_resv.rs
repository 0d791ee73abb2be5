//! One namespace's reservation state (`NsReservations`): the state machine
//! of `reservation.rs` behind a lock, the I/O path's lock-free checks, the
//! preempted-host audit, and the record kept on the device (PTPL, or always
//! for a device shared by several nodes' controllers: a cluster volume).
//!
//! It sits apart from the reservation commands (`resv_cmd`) because every
//! `Namespace` holds one: `subsystem` imports it without importing the
//! command layer, which imports `subsystem` and `controller`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use blockdev::{BlockDevice, RecordKind};
use nvme_wire::status::{self, Status};
use parking_lot::Mutex;

use crate::reservation::{Access, HostId, NotificationKind, Outcome, ReservationState};
use crate::resv_record::{self, MAX_PREEMPTED};

/// One namespace's reservations, shared by every snapshot of it.
pub struct NsReservations {
    pub(crate) state: Mutex<ReservationState>,
    /// Mirrors `state.is_reserved()` for the I/O path's lock-free check.
    reserved: AtomicBool,
    /// Whether the device keeps the record (RESCAP bit 0).
    persistent: bool,
    /// The device is one volume that controllers on several nodes serve in
    /// turn (a cluster volume): every change is stored, PTPL or not, and the
    /// node that starts serving it reloads the state ([`Self::reload`]).
    shared: bool,
    /// Hosts whose registration a Preempt (or Preempt and Abort) removed and
    /// that have not registered again: fenced hosts, whose writes must not
    /// land. The newest [`MAX_PREEMPTED`].
    preempted: Mutex<Vec<HostId>>,
    /// Mirrors `!preempted.is_empty()` for the I/O path.
    any_preempted: AtomicBool,
    /// Writes accepted from `preempted` hosts: an audit that stays 0 unless
    /// fencing regressed (or the reservation type lets them write).
    stale_writes: AtomicU64,
}

impl NsReservations {
    fn with(
        state: ReservationState,
        preempted: Vec<HostId>,
        persistent: bool,
        shared: bool,
    ) -> Self {
        NsReservations {
            reserved: AtomicBool::new(state.is_reserved()),
            state: Mutex::new(state),
            persistent,
            shared,
            any_preempted: AtomicBool::new(!preempted.is_empty()),
            preempted: Mutex::new(preempted),
            stale_writes: AtomicU64::new(0),
        }
    }

    /// Fresh state, or the one the device kept with Persist Through Power
    /// Loss on. A record that cannot be read is logged and ignored.
    pub fn load(dev: &dyn BlockDevice) -> Self {
        let persistent = dev.keeps_records();
        let mut state = ReservationState::new();
        if persistent {
            match dev.load_record(RecordKind::Reservations) {
                Ok(Some(b)) => match resv_record::decode(&b) {
                    Ok((s, _)) if s.ptpl() => state = s,
                    Ok(_) => {}
                    Err(e) => tracing::warn!("{}: reservation record ignored: {e}", dev.describe()),
                },
                Ok(None) => {}
                Err(e) => tracing::warn!(
                    "{}: cannot read the reservation record: {e}",
                    dev.describe()
                ),
            }
        }
        Self::with(state, Vec::new(), persistent, false)
    }

    /// Empty state for a device that controllers on several nodes serve in
    /// turn. All controllers of one NVM subsystem see the same reservations,
    /// so the state lives with the device, not with this node: every change
    /// is stored on it (a command whose store fails is refused), and
    /// [`Self::reload`] reads it when this node starts serving the device.
    /// RESCAP reports PTPL on every node: the record outlives any one node.
    pub fn shared() -> Self {
        Self::with(ReservationState::new(), Vec::new(), true, true)
    }

    /// Whether the state is kept with a device shared by several nodes.
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// Replaces the whole state (registrants, reservation, generation,
    /// PTPL, preempted hosts) with the one `dev` keeps, or with an empty one
    /// when it keeps none. Called before this node serves `dev` (the ANA
    /// group still refuses commands). An unreadable record leaves the state
    /// empty and is the error.
    pub fn reload(&self, dev: &dyn BlockDevice) -> Result<(), String> {
        let read = match dev.load_record(RecordKind::Reservations) {
            Ok(Some(b)) => resv_record::decode(&b).map_err(|e| e.to_string()),
            Ok(None) => Ok((ReservationState::new(), Vec::new())),
            Err(e) => Err(format!("cannot read the reservation record: {e}")),
        };
        let (state, preempted, res) = match read {
            Ok((s, p)) => (s, p, Ok(())),
            Err(e) => (ReservationState::new(), Vec::new(), Err(e)),
        };
        let mut cur = self.state.lock();
        let mut p = self.preempted.lock();
        self.reserved.store(state.is_reserved(), Ordering::SeqCst);
        *cur = state;
        self.any_preempted
            .store(!preempted.is_empty(), Ordering::SeqCst);
        *p = preempted;
        res
    }

    /// The check for a command about to write the device; `audited` (Write,
    /// Write Zeroes, DSM) counts it in `stale_writes` when it is accepted
    /// from a preempted host.
    #[inline]
    pub fn check_write(&self, hostid: &HostId, audited: bool) -> Result<(), Status> {
        self.check(hostid, Access::Write)?;
        if audited
            && self.any_preempted.load(Ordering::SeqCst)
            && self.preempted.lock().contains(hostid)
        {
            self.stale_writes.fetch_add(1, Ordering::Relaxed);
            let id: String = hostid.iter().map(|b| format!("{b:02x}")).collect();
            tracing::warn!("write accepted from preempted host {id} (stale write audit)");
        }
        Ok(())
    }

    /// Writes accepted from preempted hosts on this namespace.
    pub fn stale_writes(&self) -> u64 {
        self.stale_writes.load(Ordering::Relaxed)
    }

    /// Hosts a Preempt removed and that have not registered since.
    pub fn preempted_hosts(&self) -> Vec<HostId> {
        self.preempted.lock().clone()
    }

    /// Whether registrations can persist through power loss here.
    pub fn persistent(&self) -> bool {
        self.persistent
    }

    /// The reservation access check for an I/O command of `hostid`.
    #[inline]
    pub fn check(&self, hostid: &HostId, access: Access) -> Result<(), Status> {
        if !self.reserved.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.state.lock().check(hostid, access)
    }

    pub fn ptpl(&self) -> bool {
        self.state.lock().ptpl()
    }

    /// A snapshot, for tests and reports.
    pub fn snapshot(&self) -> ReservationState {
        self.state.lock().clone()
    }

    /// Runs `op` on a copy of the state and works out the preempted set
    /// after it (victims of a Preempt join it, a host registered again
    /// leaves it); commits both only when the command succeeded and, when
    /// the device keeps them (PTPL on before or after, or a shared device),
    /// once the device holds the new record. A refused command changes
    /// nothing.
    pub(crate) fn apply(
        &self,
        dev: &dyn BlockDevice,
        op: impl FnOnce(&mut ReservationState) -> Result<Outcome, Status>,
    ) -> Result<Outcome, Status> {
        let mut cur = self.state.lock();
        let mut next = cur.clone();
        let out = op(&mut next)?;
        let mut p = self.preempted.lock();
        let next_p = next_preempted(&p, &out, &next);
        let store = if self.shared {
            next != *cur || next_p != *p
        } else {
            (next.ptpl() || cur.ptpl()) && next != *cur
        };
        if store {
            if !self.persistent {
                return Err(Status::generic(status::SC_INVALID_FIELD));
            }
            let rec = if self.shared {
                resv_record::encode(&next, &next_p)
            } else {
                next.encode_persistent()
            };
            if let Err(e) = dev.store_record(RecordKind::Reservations, &rec) {
                tracing::error!(
                    "{}: cannot store the reservation record ({e}); command refused",
                    dev.describe()
                );
                return Err(Status::generic(status::SC_INTERNAL));
            }
        }
        self.reserved.store(next.is_reserved(), Ordering::SeqCst);
        *cur = next;
        self.any_preempted
            .store(!next_p.is_empty(), Ordering::SeqCst);
        *p = next_p;
        Ok(out)
    }

    /// Set Features Reservation Persistence (83h).
    pub fn set_ptpl(&self, dev: &dyn BlockDevice, on: bool) -> Result<(), Status> {
        if on && !self.persistent {
            return Err(Status::generic(status::SC_INVALID_FIELD));
        }
        self.apply(dev, |s| {
            s.set_ptpl(on);
            Ok(Outcome::default())
        })
        .map(|_| ())
    }
}

/// The preempted set after a command with outcome `out` left `next`: the
/// victims of a Preempt join it (the newest [`MAX_PREEMPTED`] are kept), a
/// host that is registered (again) is not in it.
fn next_preempted(cur: &[HostId], out: &Outcome, next: &ReservationState) -> Vec<HostId> {
    let mut p: Vec<HostId> = cur.to_vec();
    for (h, kind) in &out.notify {
        if *kind == NotificationKind::RegistrationPreempted && !p.contains(h) {
            p.push(*h);
        }
    }
    p.retain(|h| !next.is_registered(h));
    if p.len() > MAX_PREEMPTED {
        p.drain(..p.len() - MAX_PREEMPTED);
    }
    p
}

#[cfg(test)]
#[path = "ns_resv_tests.rs"]
pub(crate) mod tests;
