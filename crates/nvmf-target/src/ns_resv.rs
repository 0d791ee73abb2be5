//! One namespace's reservation state (`NsReservations`): the state machine
//! of `reservation.rs` behind a lock, the I/O path's lock-free checks, the
//! preempted-host audit, and the record kept on the device (PTPL, or always
//! for a device shared by several nodes' controllers: a cluster volume).
//!
//! It sits apart from the reservation commands (`resv_cmd`) because every
//! `Namespace` holds one: `subsystem` imports it without importing the
//! command layer, which imports `subsystem` and `controller`.
//!
//! A command that may store the record runs on the namespace's store worker
//! ([`NsReservations::apply_queued`]), not on the reactor that received it:
//! a store writes every member of a volume, some across the network, and a
//! member that stopped answering would otherwise stall every connection of
//! that reactor for the member's timeout. The worker also keeps such
//! commands in order. The I/O path reads the committed state all along: a
//! command takes effect when its record is stored, and completes after.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use blockdev::{BlockDevice, BlockError, RecordKind};
use nvme_wire::status::{self, Status};
use parking_lot::Mutex;

use crate::reservation::{Access, HostId, NotificationKind, Outcome, ReservationState};
use crate::resv_record::{self, MAX_PREEMPTED};

/// One namespace's reservations, shared by every snapshot of it.
pub struct NsReservations {
    /// Held by whoever changes the state, from reading it to committing
    /// the new one (and across the store in between); never by the I/O path.
    order: Mutex<()>,
    /// Commands waiting for the store worker, and whether it runs.
    worker: Mutex<Worker>,
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
            order: Mutex::new(()),
            worker: Mutex::new(Worker::default()),
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
    ///
    /// Waits for a command that is storing (its record is then the one
    /// read): the state is never one that the device no longer holds.
    pub fn reload(&self, dev: &dyn BlockDevice) -> Result<(), String> {
        let _order = self.order.lock();
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
    /// nothing. Blocks the calling thread for the store: on a reactor, use
    /// [`Self::apply_queued`] where a store may happen.
    pub(crate) fn apply(
        &self,
        dev: &dyn BlockDevice,
        op: impl FnOnce(&mut ReservationState) -> Result<Outcome, Status>,
    ) -> Result<Outcome, Status> {
        let _order = self.order.lock();
        let (cur, cur_p) = (self.state.lock().clone(), self.preempted.lock().clone());
        let mut next = cur.clone();
        let out = op(&mut next)?;
        let next_p = next_preempted(&cur_p, &out, &next);
        let store = if self.shared {
            next != cur || next_p != cur_p
        } else {
            (next.ptpl() || cur.ptpl()) && next != cur
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
                return Err(match e {
                    // A deposed owner: the host retries on another path.
                    BlockError::Fenced(_) => Status::path(status::SC_ANA_INACCESSIBLE),
                    _ => Status::generic(status::SC_INTERNAL),
                });
            }
        }
        let mut st = self.state.lock();
        let mut p = self.preempted.lock();
        self.reserved.store(next.is_reserved(), Ordering::SeqCst);
        *st = next;
        self.any_preempted
            .store(!next_p.is_empty(), Ordering::SeqCst);
        *p = next_p;
        Ok(out)
    }

    /// Whether a command may store the record, and so belongs on the store
    /// worker ([`Self::apply_queued`]) rather than on the reactor: a shared
    /// record is stored on every change, a node's own only while PTPL is on
    /// or when the command sets it (`sets_ptpl`). A PTPL turned on by a
    /// command queued meanwhile makes a command run here store on the
    /// reactor: still correct, only slower, and as rare as that race.
    pub(crate) fn may_store(&self, sets_ptpl: bool) -> bool {
        self.persistent && (self.shared || sets_ptpl || self.ptpl())
    }

    /// [`Self::apply`] on the namespace's store worker, a thread that runs
    /// while commands wait for it (one per namespace at most), in the order
    /// they came; queued before this returns. `committed` runs on the worker
    /// right after a commit (the notifications, in the commits' order). The
    /// future resolves once the state is committed, or with the command's
    /// refusal.
    pub(crate) fn apply_queued(
        self: &Arc<Self>,
        dev: Arc<dyn BlockDevice>,
        op: impl FnOnce(&mut ReservationState) -> Result<Outcome, Status> + Send + 'static,
        committed: impl FnOnce(&Outcome) + Send + 'static,
    ) -> impl Future<Output = Result<Outcome, Status>> + Send + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let me = self.clone();
        let job: Job = Box::new(move || {
            let r = me.apply(&*dev, op);
            if let Ok(out) = &r {
                committed(out);
            }
            let _ = tx.send(r);
        });
        let spawn = {
            let mut w = self.worker.lock();
            w.jobs.push_back(job);
            !std::mem::replace(&mut w.running, true)
        };
        if spawn {
            let me = self.clone();
            let started = std::thread::Builder::new()
                .name("resv-store".into())
                .spawn(move || me.run_worker());
            if let Err(e) = started {
                // No thread to be had: run the queue here, as before the worker.
                tracing::warn!("no thread for a reservation store ({e}); storing in place");
                self.run_worker();
            }
        }
        async move {
            // A dropped sender: the job panicked (or never ran), before any commit.
            rx.await
                .unwrap_or_else(|_| Err(Status::generic(status::SC_INTERNAL)))
        }
    }

    /// Runs queued commands until none is left.
    fn run_worker(&self) {
        loop {
            let job = {
                let mut w = self.worker.lock();
                match w.jobs.pop_front() {
                    Some(j) => j,
                    None => {
                        w.running = false;
                        return;
                    }
                }
            };
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                tracing::error!("a reservation command panicked on the store worker; refused");
            }
        }
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

type Job = Box<dyn FnOnce() + Send>;

/// The store worker's queue.
#[derive(Default)]
struct Worker {
    jobs: VecDeque<Job>,
    running: bool,
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
