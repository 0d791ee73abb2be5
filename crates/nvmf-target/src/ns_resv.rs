//! One namespace's reservation state (`NsReservations`): the state machine
//! of `reservation.rs` behind a lock, the I/O path's lock-free checks, the
//! preempted-host audit, and the PTPL record kept on the device.
//!
//! It sits apart from the reservation commands (`resv_cmd`) because every
//! `Namespace` holds one: `subsystem` imports it without importing the
//! command layer, which imports `subsystem` and `controller`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use blockdev::{BlockDevice, RecordKind};
use nvme_wire::status::{self, Status};
use parking_lot::Mutex;

use crate::reservation::{Access, HostId, NotificationKind, Outcome, ReservationState};

/// One namespace's reservations, shared by every snapshot of it.
pub struct NsReservations {
    pub(crate) state: Mutex<ReservationState>,
    /// Mirrors `state.is_reserved()` for the I/O path's lock-free check.
    reserved: AtomicBool,
    /// Whether the device keeps the PTPL record (RESCAP bit 0).
    persistent: bool,
    /// Hosts whose registration a Preempt (or Preempt and Abort) removed and
    /// that have not registered again: fenced hosts, whose writes must not land.
    preempted: Mutex<Vec<HostId>>,
    /// Mirrors `!preempted.is_empty()` for the I/O path.
    any_preempted: AtomicBool,
    /// Writes accepted from `preempted` hosts: an audit that stays 0 unless
    /// fencing regressed (or the reservation type lets them write).
    stale_writes: AtomicU64,
}

impl NsReservations {
    /// Fresh state, or the one the device kept with Persist Through Power
    /// Loss on. A record that cannot be read is logged and ignored.
    pub fn load(dev: &dyn BlockDevice) -> Self {
        let persistent = dev.keeps_records();
        let mut state = ReservationState::new();
        if persistent {
            match dev.load_record(RecordKind::Reservations) {
                Ok(Some(b)) => match ReservationState::decode_persistent(&b) {
                    Ok(s) if s.ptpl() => state = s,
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
        NsReservations {
            reserved: AtomicBool::new(state.is_reserved()),
            state: Mutex::new(state),
            persistent,
            preempted: Mutex::new(Vec::new()),
            any_preempted: AtomicBool::new(false),
            stale_writes: AtomicU64::new(0),
        }
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

    /// Keeps the preempted set after a command: victims of a Preempt join
    /// it, a host that registers leaves it.
    pub(crate) fn track_preempted(&self, out: &Outcome, registered: Option<&HostId>) {
        let mut p = self.preempted.lock();
        for (h, kind) in &out.notify {
            if *kind == NotificationKind::RegistrationPreempted && !p.contains(h) {
                p.push(*h);
            }
        }
        if let Some(h) = registered {
            p.retain(|x| x != h);
        }
        self.any_preempted.store(!p.is_empty(), Ordering::SeqCst);
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

    /// Runs `op` on a copy of the state; commits it only when the command
    /// succeeded and, with PTPL on (before or after), once the device holds
    /// the new record. A refused command changes nothing.
    pub(crate) fn apply(
        &self,
        dev: &dyn BlockDevice,
        op: impl FnOnce(&mut ReservationState) -> Result<Outcome, Status>,
    ) -> Result<Outcome, Status> {
        let mut cur = self.state.lock();
        let mut next = cur.clone();
        let out = op(&mut next)?;
        if (next.ptpl() || cur.ptpl()) && next != *cur {
            if !self.persistent {
                return Err(Status::generic(status::SC_INVALID_FIELD));
            }
            if let Err(e) = dev.store_record(RecordKind::Reservations, &next.encode_persistent()) {
                tracing::error!(
                    "{}: cannot persist the reservation record: {e}",
                    dev.describe()
                );
                return Err(Status::generic(status::SC_INTERNAL));
            }
        }
        self.reserved.store(next.is_reserved(), Ordering::SeqCst);
        *cur = next;
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
