//! Reservation commands on a namespace (Register 0Dh, Report 0Eh, Acquire
//! 11h, Release 15h), run on the namespace's `NsReservations` (`ns_resv.rs`,
//! the state machine of `reservation.rs` behind a lock), plus what their
//! outcome asks for: log page 80h entries and AENs on the notified hosts'
//! controllers, the record persisted in the device's own metadata when PTPL
//! is on (always, for a device several nodes serve), and Preempt and Abort
//! draining the preempted hosts' writes before the command completes. On a
//! device that keeps records, a command that changes the state runs on the
//! namespace's store worker (`NsReservations::apply_queued`), so that the
//! reactor never waits for the record's write.
//!
//! The I/O path's check costs one atomic load while nothing is reserved. A
//! write first counts itself in flight on its queue, then checks (both
//! sequentially consistent); a preempt first changes the state, then waits
//! for the preempted hosts' in-flight writes. Either the write sees the new
//! reservation and is refused, or the preempt sees the write and waits for
//! it: no write of a preempted host reaches the device once the command has
//! completed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use nvme_wire::reservation::{
    ACQUIRE_DATA_LEN, AcquireCdw10, AcquireData, FID_RESV_NOTIFICATION_MASK, FID_RESV_PERSISTENCE,
    MASK_REGISTRATION_PREEMPTED, MASK_RESERVATION_PREEMPTED, MASK_RESERVATION_RELEASED,
    PERSISTENCE_PTPL, REGISTER_DATA_LEN, RELEASE_DATA_LEN, RESCAP_ALL_TYPES, RESCAP_IEKEY_13,
    RESCAP_PTPL, RegisterCdw10, RegisterData, ReleaseCdw10, ReleaseData, ReportCmd, ResvLogEntry,
    cptpl, log_type,
};
use nvme_wire::sqe::{Sqe, io_opc};
use nvme_wire::status::{self, Status};

use crate::Target;
use crate::controller::{Controller, QueueStats};
use crate::reservation::{HostId, HostRef, Outcome, ReservationState};
use crate::subsystem::Namespace;

pub use crate::ns_resv::NsReservations;

/// A reservation command, decoded from its SQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResvCmd {
    Register(RegisterCdw10),
    Acquire(AcquireCdw10),
    Release(ReleaseCdw10),
    Report(ReportCmd),
}

impl ResvCmd {
    pub fn from_sqe(sqe: &Sqe) -> Option<Self> {
        Some(match sqe.opcode {
            io_opc::RESV_REGISTER => ResvCmd::Register(RegisterCdw10::decode(sqe.cdw10)),
            io_opc::RESV_ACQUIRE => ResvCmd::Acquire(AcquireCdw10::decode(sqe.cdw10)),
            io_opc::RESV_RELEASE => ResvCmd::Release(ReleaseCdw10::decode(sqe.cdw10)),
            io_opc::RESV_REPORT => ResvCmd::Report(ReportCmd::decode(sqe.cdw10, sqe.cdw11)),
            _ => return None,
        })
    }

    /// Bytes the host sends with the command.
    pub fn host_to_ctrl_len(&self) -> u32 {
        match self {
            ResvCmd::Register(_) => REGISTER_DATA_LEN as u32,
            ResvCmd::Acquire(_) => ACQUIRE_DATA_LEN as u32,
            ResvCmd::Release(_) => RELEASE_DATA_LEN as u32,
            ResvCmd::Report(_) => 0,
        }
    }

    /// Bytes the controller returns (Report: what NUMD asks for).
    pub fn ctrl_to_host_len(&self) -> u64 {
        match self {
            ResvCmd::Report(r) => r.len_bytes(),
            _ => 0,
        }
    }
}

/// What a reservation command asks of the queue once it has run.
pub struct ResvDone {
    /// Preempt and Abort: wait for this before completing.
    pub drain: Option<Drain>,
}

/// A command's change to a namespace's reservation state.
type StateOp = Box<dyn FnOnce(&mut ReservationState) -> Result<Outcome, Status> + Send>;

/// How a reservation command ran.
pub enum Ran {
    Done(ResvDone),
    /// Its record is being stored on the namespace's store worker; the
    /// command completes when this resolves.
    Storing(Pin<Box<dyn Future<Output = Result<ResvDone, Status>> + Send>>),
}

/// Runs `cmd` for controller `ctrl` on namespace `ns` of its subsystem.
/// `data` is the host's data (Register/Acquire/Release) or the buffer the
/// report is written into. A command that may store the record is handed
/// to the store worker ([`Ran::Storing`]), so the reactor never waits for
/// a device's record write.
pub fn execute(
    target: &Arc<Target>,
    ctrl: &Arc<Controller>,
    ns: &Namespace,
    cmd: ResvCmd,
    data: &mut [u8],
) -> Result<Ran, Status> {
    if ctrl.hostid == [0; 16] {
        // Registrants are named by Host Identifier; a zero one names no host.
        return Err(Status::generic(status::SC_HOST_ID_INCONSISTENT));
    }
    let me = HostRef {
        hostid: ctrl.hostid,
        cntlid: ctrl.cntlid,
    };
    let bad_data = || Status::generic(status::SC_SGL_INVALID_DATA_LEN);
    // Register's CPTPL field (0: no change) is the only way a command
    // changes PTPL.
    let sets_ptpl = matches!(&cmd, ResvCmd::Register(c) if c.cptpl != cptpl::NO_CHANGE);
    let op: StateOp = match cmd {
        ResvCmd::Report(r) => {
            let ctrls_of = |h: &HostId| target.controller_ids_of(h, ctrl.subnqn());
            ns.resv.state.lock().report(r.eds, ctrls_of, data)?;
            return Ok(Ran::Done(ResvDone { drain: None }));
        }
        ResvCmd::Register(c) => {
            let d = RegisterData::decode(data).map_err(|_| bad_data())?;
            Box::new(move |s| s.register(&me, c.rrega, c.iekey, d.crkey, d.nrkey, c.cptpl))
        }
        ResvCmd::Acquire(c) => {
            let d = AcquireData::decode(data).map_err(|_| bad_data())?;
            Box::new(move |s| s.acquire(&me, c.racqa, c.iekey, c.rtype, d.crkey, d.prkey))
        }
        ResvCmd::Release(c) => {
            let d = ReleaseData::decode(data).map_err(|_| bad_data())?;
            Box::new(move |s| s.release(&me, c.rrela, c.iekey, c.rtype, d.crkey))
        }
    };
    let nsid = ns.nsid;
    if !ns.resv.may_store(sets_ptpl) {
        let out = ns.resv.apply(&*ns.dev, op)?;
        notify(target, ctrl, nsid, &out);
        return Ok(Ran::Done(drain_after(target, ctrl, nsid, out)));
    }
    let (t, c) = (target.clone(), ctrl.clone());
    let committed = move |out: &Outcome| notify(&t, &c, nsid, out);
    let stored = ns.resv.apply_queued(ns.dev.clone(), op, committed);
    let (target, ctrl) = (target.clone(), ctrl.clone());
    Ok(Ran::Storing(Box::pin(async move {
        Ok(drain_after(&target, &ctrl, nsid, stored.await?))
    })))
}

/// The notified hosts' log entries and AENs, once a command's outcome is
/// committed.
fn notify(target: &Target, ctrl: &Controller, nsid: u32, out: &Outcome) {
    for (host, kind) in &out.notify {
        for c in target.controllers_of(host, ctrl.subnqn()) {
            c.note_reservation(nsid, kind.log_type(), kind.mask_bit());
        }
    }
}

/// The preempted hosts' writes a committed outcome waits for.
fn drain_after(target: &Target, ctrl: &Controller, nsid: u32, out: Outcome) -> ResvDone {
    let drain = (!out.abort.is_empty()).then(|| {
        tracing::info!(
            "controller {}: preempt and abort of {} host(s) on nsid {nsid}",
            ctrl.cntlid,
            out.abort.len()
        );
        // Read after the new state was committed (SeqCst): every write that
        // could have passed the old check is counted in these.
        let queues = out
            .abort
            .iter()
            .flat_map(|h| target.queues_of(h, ctrl.subnqn()))
            .map(|q| {
                let started = q.writes_started.load(Ordering::SeqCst);
                (q, started)
            })
            .collect();
        Drain { queues }
    });
    ResvDone { drain }
}

/// The preempted hosts' writes that had started when the reservation
/// changed: done once each queue's `writes_done` has caught up.
pub struct Drain {
    queues: Vec<(Arc<QueueStats>, u64)>,
}

/// How often a waiting Preempt and Abort looks again.
const DRAIN_POLL: std::time::Duration = std::time::Duration::from_micros(200);

impl Drain {
    pub fn is_done(&self) -> bool {
        self.queues
            .iter()
            .all(|(q, started)| q.writes_done.load(Ordering::SeqCst) >= *started)
    }

    /// Waits for the writes; they end within a device I/O's time, or when
    /// their connection drains them at teardown.
    pub async fn wait(self) {
        while !self.is_done() {
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }
}

/// Get Log Page 80h: the oldest unread notification (an empty entry when
/// there is none), removed as it is read. Reading with RAE cleared unmasks
/// the reservation AEN, which fires again at once if entries remain.
pub fn notification_log(ctrl: &Controller, rae: bool) -> Vec<u8> {
    let mut st = ctrl.state.lock();
    let entry = match st.resv_log.pop_front() {
        Some(mut e) => {
            e.available = st.resv_log.len().min(255) as u8;
            e
        }
        None => ResvLogEntry {
            count: 0,
            log_type: log_type::EMPTY,
            available: 0,
            nsid: 0,
        },
    };
    if !rae {
        st.resv_aen_masked = false;
        if !st.resv_log.is_empty() {
            drop(st);
            ctrl.queue_reservation_event();
        }
    }
    entry.encode().to_vec()
}

/// The namespaces a feature with `nsid` addresses: one, or all for FFFFFFFFh.
fn feature_namespaces(
    ctrl: &Controller,
    nsid: u32,
    all_ok: bool,
) -> Result<Vec<Namespace>, Status> {
    let list = ctrl.namespaces();
    if nsid == 0xFFFF_FFFF && all_ok {
        return Ok(list.to_vec());
    }
    match crate::subsystem::find_namespace(&list, nsid) {
        Some(ns) => Ok(vec![ns.clone()]),
        None => Err(Status::generic(status::SC_INVALID_NS)),
    }
}

const MASK_BITS: u32 =
    MASK_REGISTRATION_PREEMPTED | MASK_RESERVATION_RELEASED | MASK_RESERVATION_PREEMPTED;

/// How a Set Features of a reservation feature ran.
pub enum FeatureSet {
    Done,
    /// Reservation Persistence on a namespace that stores its record: on
    /// the store worker, as the reservation commands (see [`execute`]).
    Storing(Pin<Box<dyn Future<Output = Result<(), Status>> + Send>>),
}

/// Set Features 81h (Reservation Notification Mask) and 83h (Reservation
/// Persistence). None: not one of these.
pub fn set_feature(
    ctrl: &Controller,
    fid: u8,
    nsid: u32,
    v: u32,
) -> Option<Result<FeatureSet, Status>> {
    Some(match fid {
        FID_RESV_NOTIFICATION_MASK => feature_namespaces(ctrl, nsid, true).map(|list| {
            let mut st = ctrl.state.lock();
            for ns in list {
                st.resv_masks.insert(ns.nsid, v & MASK_BITS);
            }
            FeatureSet::Done
        }),
        FID_RESV_PERSISTENCE => {
            feature_namespaces(ctrl, nsid, true).and_then(|list| set_ptpl(list, v))
        }
        _ => return None,
    })
}

/// Reservation Persistence on each namespace of `list`, in order. Refused
/// as a whole (nothing changed) when one cannot persist and PTPL is asked.
fn set_ptpl(list: Vec<Namespace>, v: u32) -> Result<FeatureSet, Status> {
    let on = v & PERSISTENCE_PTPL != 0;
    if on && list.iter().any(|ns| !ns.resv.persistent()) {
        return Err(Status::generic(status::SC_INVALID_FIELD));
    }
    if !list.iter().any(|ns| ns.resv.may_store(true)) {
        for ns in &list {
            ns.resv.set_ptpl(&*ns.dev, on)?;
        }
        return Ok(FeatureSet::Done);
    }
    // Queued now, each on its namespace's worker. If one fails, those that
    // took the new value are set back: a refused command changes nothing.
    let before: Vec<bool> = list.iter().map(|ns| ns.resv.ptpl()).collect();
    let stores: Vec<_> = list.iter().map(|ns| queue_ptpl(ns, on)).collect();
    Ok(FeatureSet::Storing(Box::pin(async move {
        let mut refused = None;
        let mut took = Vec::new();
        for ((ns, st), was) in list.iter().zip(stores).zip(before) {
            match st.await {
                Ok(_) => took.push((ns, was)),
                Err(e) => {
                    refused.get_or_insert(e);
                }
            }
        }
        let Some(e) = refused else { return Ok(()) };
        for (ns, was) in took {
            if was != on && queue_ptpl(ns, was).await.is_err() {
                tracing::error!(
                    "nsid {}: Set Features PTPL was refused on another namespace, and its \
                     own change cannot be taken back",
                    ns.nsid
                );
            }
        }
        Err(e)
    })))
}

/// PTPL set to `on` on `ns`'s store worker.
fn queue_ptpl(
    ns: &Namespace,
    on: bool,
) -> impl Future<Output = Result<Outcome, Status>> + Send + 'static {
    let op = move |s: &mut ReservationState| {
        s.set_ptpl(on);
        Ok(Outcome::default())
    };
    ns.resv.apply_queued(ns.dev.clone(), op, |_| {})
}

/// Get Features 81h and 83h: (current, changeable) for one namespace.
pub fn get_feature(ctrl: &Controller, fid: u8, nsid: u32) -> Option<Result<(u32, bool), Status>> {
    Some(match fid {
        FID_RESV_NOTIFICATION_MASK => feature_namespaces(ctrl, nsid, false).map(|ns| {
            let m = ctrl.state.lock().resv_masks.get(&ns[0].nsid).copied();
            (m.unwrap_or(0), true)
        }),
        FID_RESV_PERSISTENCE => feature_namespaces(ctrl, nsid, false)
            .map(|ns| (u32::from(ns[0].resv.ptpl()), ns[0].resv.persistent())),
        _ => return None,
    })
}

/// Identify Namespace RESCAP: every type, IEKEY as NVMe 1.3 defines it,
/// and Persist Through Power Loss where the device keeps records.
pub fn rescap(ns: &Namespace) -> u8 {
    RESCAP_ALL_TYPES | RESCAP_IEKEY_13 | if ns.resv.persistent() { RESCAP_PTPL } else { 0 }
}
