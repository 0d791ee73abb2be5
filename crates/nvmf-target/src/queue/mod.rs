//! The transport-free command core: one `QueueCore` per queue pair.
//!
//! A transport feeds it decoded events (a command capsule, the host data it
//! asked for, a finished device I/O) and carries out what the core asks of
//! it through the [`Transport`] trait: send a completion, send read data,
//! fetch host data, wait for a device I/O, close. The core owns everything
//! an NVMe command *means*: the SQ head, command slots (their index is the
//! transfer tag), Connect sequencing, the CC.EN check, SGL and data length
//! checks, namespace snapshots, held AERs, statistics, the error log and
//! every status decision. It does no socket I/O, so unit tests, property
//! tests and the fuzzer drive it directly (the shape of quinn-proto, and of
//! nvmet's `nvmet_req_init`/`nvmet_req_execute`).

mod connect;
mod execute;
pub mod sgl;

#[cfg(test)]
mod qos_tests;
#[cfg(test)]
mod resv_tests;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::{Duration, Instant};

use blockdev::{AlignedBuf, BlockOp, IoDone, IoFuture};
use nvme_wire::cqe::Cqe;
use nvme_wire::sqe::{FUSE_MASK, Sqe, io_opc};
use nvme_wire::status::{self, Status};
use nvme_wire::tls_psk::PskIdentity;
use parking_lot::Mutex;

use crate::Target;
use crate::auth::AuthSession;
use crate::bufpool::BufPool;
use crate::config::ADMIN_IN_CAPSULE_DATA;
use crate::controller::{AER_LIMIT, Controller, FreeReason, QueueStats};
use crate::fabrics;
use crate::io::{self, IoPlan};
use crate::qos::QosCaches;
use crate::stats::NsIoStats;
use crate::subsystem::{Namespace, find_namespace};
use sgl::{Sgl, check_sgl};

/// Transient Transport Error (generic status 0x22): host data arrived with a
/// bad data digest; the host may retry.
pub const SC_TRANSIENT_TRANSPORT: u8 = 0x22;
/// The longest authentication message taken or given (an ffdhe8192
/// Reply with SHA-512 is 1168 bytes; Linux hosts read with 4 KiB).
pub const AUTH_MAX_LEN: u32 = 16384;
/// How often I/O queues refresh the keep-alive clock: small next to a 1 s KATO.
const TOUCH_EVERY: Duration = Duration::from_millis(100);

/// What a transport does for the core. Calls come in the order the host
/// must see their effects (read data before its completion).
pub trait Transport {
    /// Send a completion queue entry (NVMe/TCP: CapsuleResp).
    fn respond(&mut self, cqe: Cqe);
    /// Send `buf[..len]` as the data of command `cid` (NVMe/TCP: C2HData).
    /// With `success` the data also completes the command and no `respond`
    /// follows (only offered when the host disabled SQ flow control).
    fn send_data(&mut self, cid: u16, buf: AlignedBuf, len: usize, success: bool);
    /// Fetch `buf.len()` bytes of host data for command `cid` in slot `tag`
    /// (NVMe/TCP: R2T/H2CData) and hand them back with [`QueueCore::on_data`].
    fn request_data(&mut self, tag: u16, cid: u16, buf: AlignedBuf);
    /// A device I/O is in flight: poll `fut`, then call [`QueueCore::on_io_done`].
    fn wait_io(&mut self, tag: u16, fut: IoFuture);
    /// The host disconnected this queue (Fabrics Disconnect): send what is
    /// queued, then close.
    fn disconnect(&mut self);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Waiting for host data the transport is fetching.
    AwaitData,
    Busy,
    /// A held Async Event Request.
    Aer,
}

/// What to run once a command's host data has arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterData {
    Nothing,
    Connect,
    /// Authentication Send: hand the message to the queue's `AuthSession`.
    AuthSend,
    /// By NSID and instance (the address of its reservation state): the
    /// snapshot may be reloaded while data is in flight, and a namespace
    /// removed and added again under the same NSID is another one.
    Io {
        nsid: u32,
        inst: usize,
        plan: IoPlan,
    },
}

#[derive(Clone, Copy)]
struct Slot {
    state: SlotState,
    sqe: Sqe,
    after: AfterData,
    /// A write counted in `QueueStats::writes_started`; `writes_done` when freed.
    counted_write: bool,
    /// When an I/O command arrived (for its latency).
    started: Instant,
}

/// The queue a connection became by its Connect.
struct Bound {
    ctrl: Arc<Controller>,
    qid: u16,
    depth: u16,
    sqflow_off: bool,
    stats: Arc<QueueStats>,
    /// Snapshot of the subsystem's namespaces, reloaded when `ns_version`
    /// falls behind the subsystem's (a namespace added or removed).
    namespaces: Arc<[Namespace]>,
    ns_version: u64,
    /// The controller's reset generation when this queue connected.
    reset_gen: u64,
    /// DH-HMAC-CHAP, when the subsystem requires it of this host.
    auth: Option<AuthSession>,
    /// When an unauthenticated queue is closed.
    auth_by: Option<Instant>,
}

pub struct QueueCore {
    target: Arc<Target>,
    /// The host's address, for log lines.
    peer: String,
    /// The address the host reached (for the discovery log).
    local_ip: Option<IpAddr>,
    /// The PSK identity of this queue's TLS channel, if it has one.
    tls: Option<PskIdentity>,
    bound: Option<Bound>,
    /// A Connect is waiting for its data: no second Connect meanwhile.
    connecting: bool,
    sqhd: u16,
    slots: Vec<Slot>,
    free: Vec<u16>,
    aers: VecDeque<u16>,
    pool: BufPool,
    last_touch: Instant,
    /// The transport's clock for this batch of PDUs or completions (see
    /// `tick`); None: read the clock at each command.
    now: Option<Instant>,
    /// Tokens this queue took from limited namespaces' QoS buckets.
    qos: QosCaches,
    /// Set when the queue closes: commands QoS holds end unrun.
    held: Option<tokio::sync::watch::Sender<bool>>,
    /// Reservation commands on the store worker, by slot: the status each
    /// ends with, once it is known (none: success).
    resv_status: Vec<(u16, Arc<Mutex<Option<Status>>>)>,
}

impl QueueCore {
    pub fn new(target: Arc<Target>, peer: String, local_ip: Option<IpAddr>) -> Self {
        let t = &target.transport;
        let nslots = usize::from(t.max_queue_depth) + AER_LIMIT + 1;
        let empty = Slot {
            state: SlotState::Free,
            sqe: Sqe::new(0, 0),
            after: AfterData::Nothing,
            counted_write: false,
            started: Instant::now(),
        };
        QueueCore {
            pool: BufPool::new(t.max_transfer),
            slots: vec![empty; nslots],
            free: (0..nslots as u16).rev().collect(),
            aers: VecDeque::new(),
            bound: None,
            connecting: false,
            sqhd: 0,
            last_touch: Instant::now(),
            now: None,
            qos: QosCaches::default(),
            held: None,
            resv_status: Vec::new(),
            target,
            peer,
            local_ip,
            tls: None,
        }
    }

    /// This queue came over a TLS channel that proved `identity`.
    pub fn set_tls(&mut self, identity: PskIdentity) {
        self.tls = Some(identity);
    }

    // ---- what the transport reads

    /// Command slots: transfer tags are below this.
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// In-capsule data bytes a command may carry now (IOCCSZ on I/O queues).
    pub fn in_capsule_limit(&self) -> u32 {
        let t = &self.target.transport;
        match &self.bound {
            None => t.in_capsule_data.max(ADMIN_IN_CAPSULE_DATA),
            Some(b) if b.qid == 0 => ADMIN_IN_CAPSULE_DATA,
            Some(_) => t.in_capsule_data,
        }
    }

    /// The controller this queue belongs to, once connected.
    pub fn controller(&self) -> Option<&Arc<Controller>> {
        self.bound.as_ref().map(|b| &b.ctrl)
    }

    pub fn qid(&self) -> Option<u16> {
        self.bound.as_ref().map(|b| b.qid)
    }

    /// Whether Async Event Requests are held (the transport then wakes the
    /// core with `on_events` when the controller queues an event).
    pub fn holds_aers(&self) -> bool {
        !self.aers.is_empty()
    }

    /// Buffers for the transport's own use (sent data goes back here).
    pub fn pool(&mut self) -> &mut BufPool {
        &mut self.pool
    }

    /// On the admin queue: time left before the keep-alive timeout, if set.
    pub fn keep_alive_wait(&self) -> Option<Duration> {
        let b = self.bound.as_ref().filter(|b| b.qid == 0)?;
        let kato = u64::from(b.ctrl.kato_ms());
        if kato == 0 {
            return None;
        }
        Some(Duration::from_millis(
            kato.saturating_sub(b.ctrl.idle_ms()).max(1),
        ))
    }

    /// How long an unauthenticated queue may still wait for its host to
    /// finish DH-HMAC-CHAP.
    pub fn auth_wait(&self) -> Option<Duration> {
        let b = self.bound.as_ref()?;
        let by = b.auth_by?;
        b.auth.as_ref().filter(|a| !a.authenticated())?;
        Some(
            by.saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        )
    }

    /// The authentication timeout that passed, if this queue's host has not
    /// authenticated in time (logged here: the host and the queue).
    pub fn auth_expired(&self) -> Option<u32> {
        let b = self.bound.as_ref()?;
        let by = b.auth_by?;
        if Instant::now() < by || b.auth.as_ref().is_none_or(|a| a.authenticated()) {
            return None;
        }
        let ms = self.target.transport.auth_timeout_ms;
        tracing::warn!(
            "{}: host {} did not complete DH-HMAC-CHAP on queue {} within {ms} ms; closing it",
            self.peer,
            b.ctrl.hostnqn,
            b.qid
        );
        Some(ms)
    }

    /// The KATO that expired, if the host has been silent past it.
    pub fn keep_alive_expired(&self) -> Option<u32> {
        let b = self.bound.as_ref()?;
        let kato = b.ctrl.kato_ms();
        (kato > 0 && b.ctrl.idle_ms() >= u64::from(kato)).then_some(kato)
    }

    /// The transport took in a batch of PDUs or completions now: the
    /// commands it starts and ends are timed from here, one clock read per
    /// batch instead of two per command (a few percent of a 4 KiB read).
    pub fn tick(&mut self) -> Instant {
        let now = Instant::now();
        self.now = Some(now);
        now
    }

    fn clock(&self) -> Instant {
        self.now.unwrap_or_else(Instant::now)
    }

    /// Traffic on an I/O queue counts as keep-alive (TBKAS); the shared
    /// clock is written at most every `TOUCH_EVERY`.
    pub fn note_traffic(&mut self) {
        if let Some(b) = &self.bound
            && b.qid != 0
            && self.last_touch.elapsed() >= TOUCH_EVERY
        {
            b.ctrl.touch();
            self.last_touch = Instant::now();
        }
    }

    /// A hint that `sqe` will soon run: lets a RAM namespace prefetch.
    pub fn prefetch(&self, sqe: &Sqe) {
        if let Some(b) = self.bound.as_ref().filter(|b| b.qid != 0)
            && matches!(sqe.opcode, io_opc::READ | io_opc::WRITE)
            && let Some(ns) = find_namespace(&b.namespaces, sqe.nsid)
        {
            ns.dev.prefetch(sqe.slba(), sqe.nlb());
        }
    }

    /// Why the controller goes away when the connection simply closed.
    pub fn eof_reason(&self) -> FreeReason {
        match &self.bound {
            Some(b) if b.ctrl.state.lock().shutdown_requested => FreeReason::HostDisconnected,
            _ => FreeReason::ConnectionClosed,
        }
    }

    /// The connection is gone: an admin queue takes its controller with it,
    /// an I/O queue frees its QID.
    pub fn close(&mut self, reason: FreeReason) {
        if let Some(b) = self.bound.take() {
            b.stats.depth.store(0, Relaxed);
            if b.qid == 0 {
                self.target.remove_controller(&b.ctrl, reason);
            } else {
                fabrics::release_io_queue(&b.ctrl, b.qid);
            }
        }
    }

    // ---- events in

    /// A command capsule: its SQE, in-capsule data, and whether that data's
    /// digest (when data digests are on) matched.
    pub fn on_command<T: Transport>(&mut self, sqe: &Sqe, data: &[u8], digest_ok: bool, t: &mut T) {
        self.sqhd = match &self.bound {
            Some(b) => (self.sqhd + 1) % b.depth,
            None => self.sqhd.wrapping_add(1),
        };
        if !digest_ok {
            tracing::warn!(
                "{}: data digest error in command capsule cid {}",
                self.peer,
                sqe.cid
            );
            self.note_digest_error();
            let st = Status::generic(SC_TRANSIENT_TRANSPORT).retryable();
            return self.respond(sqe.cid, st, 0, 0, t);
        }
        let Some(slot) = self.alloc_slot(*sqe) else {
            // More commands than the queue has entries: the host broke SQ flow control.
            let st = Status::generic(status::SC_INTERNAL).retryable();
            return self.respond(sqe.cid, st, 0, 0, t);
        };
        if sqe.flags & FUSE_MASK != 0 {
            // Fused operations (Compare and Write) are not supported: running
            // the halves as plain commands would break their atomicity.
            return self.complete(slot, Status::generic(status::SC_INVALID_FIELD), 0, 0, t);
        }
        let sgl = match check_sgl(sqe, data.len(), self.in_capsule_limit()) {
            Ok(s) => s,
            Err(st) => return self.complete(slot, st, 0, 0, t),
        };
        if sqe.is_fabrics() {
            return self.fabrics(slot, sgl, data, t);
        }
        if let Some(b) = &self.bound
            && b.auth.as_ref().is_some_and(|a| !a.authenticated())
        {
            // As nvmet_check_auth_status: only Fabrics commands until the
            // queue has authenticated.
            tracing::debug!(
                "{}: host {} sent opcode {:#x} on queue {} before authenticating",
                self.peer,
                b.ctrl.hostnqn,
                sqe.opcode,
                b.qid
            );
            let st = Status::cmd_specific(status::SC_AUTH_REQUIRED);
            return self.complete(slot, st, 0, 0, t);
        }
        match &self.bound {
            None => self.complete(slot, Status::generic(status::SC_CMD_SEQ_ERROR), 0, 0, t),
            Some(b) if b.qid == 0 => self.admin(slot, sgl, t),
            Some(_) => self.io(slot, sgl, data, t),
        }
    }

    /// The host data asked for with `request_data` for slot `tag`.
    pub fn on_data<T: Transport>(&mut self, tag: u16, buf: AlignedBuf, digest_ok: bool, t: &mut T) {
        let Some(s) = self
            .slots
            .get_mut(usize::from(tag))
            .filter(|s| s.state == SlotState::AwaitData)
        else {
            // The transport checks tags; nothing waits on this one.
            debug_assert!(false, "data for slot {tag}, which awaits none");
            self.pool.put(buf);
            return;
        };
        s.state = SlotState::Busy;
        if !digest_ok {
            tracing::warn!(
                "{}: data digest error in host data for cid {}",
                self.peer,
                s.sqe.cid
            );
            self.note_digest_error();
            self.pool.put(buf);
            let st = Status::generic(SC_TRANSIENT_TRANSPORT).retryable();
            return self.complete(tag, st, 0, 0, t);
        }
        match s.after {
            AfterData::Connect => self.do_connect(tag, buf, t),
            AfterData::AuthSend => self.do_auth_send(tag, buf, t),
            AfterData::Io { nsid, inst, plan } => {
                self.execute_io(tag, nsid, Some(inst), plan, buf, t)
            }
            AfterData::Nothing => {
                self.pool.put(buf);
                self.complete(tag, Status::SUCCESS, 0, 0, t)
            }
        }
    }

    fn note_digest_error(&self) {
        self.target
            .counters
            .data_digest_errors
            .fetch_add(1, Relaxed);
        if let Some(b) = &self.bound {
            b.stats.digest_errors.fetch_add(1, Relaxed);
        }
    }

    /// A device I/O handed out with `wait_io` finished.
    pub fn on_io_done<T: Transport>(&mut self, tag: u16, done: IoDone, t: &mut T) {
        if !self.resv_status.is_empty()
            && let Some(k) = self.resv_status.iter().position(|(s, _)| *s == tag)
            && self.bound.is_some()
        {
            let (_, cell) = self.resv_status.swap_remove(k);
            let st = cell.lock().take().unwrap_or(Status::SUCCESS);
            self.pool.put(done.buf);
            return self.complete(tag, st, 0, 0, t);
        }
        let Some(b) = self.bound.as_ref() else {
            self.pool.put(done.buf);
            return self.free_slot(tag);
        };
        let slot = &self.slots[usize::from(tag)];
        let sqe = slot.sqe;
        let len = done.buf.len();
        if matches!(sqe.opcode, io_opc::READ | io_opc::WRITE)
            && let Some(ns) = find_namespace(&b.namespaces, sqe.nsid)
        {
            record_io(
                &ns.stats,
                sqe.opcode,
                self.clock().saturating_duration_since(slot.started),
                len,
                done.result.is_ok(),
            );
        }
        match done.result {
            Err(e) => {
                let op = if sqe.opcode == io_opc::READ {
                    BlockOp::Read
                } else {
                    BlockOp::Write { fua: false }
                };
                let st = io::status_of(&e, op);
                if st.sct == status::SCT_PATH {
                    // Expected while a volume moves or is fenced: the host
                    // retries on another path; one line per command would
                    // flood the log during every failover.
                    tracing::debug!(
                        "{}: path error on nsid {} cid {}: {}",
                        self.peer,
                        sqe.nsid,
                        sqe.cid,
                        e
                    );
                } else {
                    tracing::warn!(
                        "{}: I/O error on nsid {} cid {}: {}",
                        self.peer,
                        sqe.nsid,
                        sqe.cid,
                        e
                    );
                }
                if st.sct == status::SCT_MEDIA {
                    b.stats.media_errors.fetch_add(1, Relaxed);
                }
                self.pool.put(done.buf);
                self.complete_lba(tag, st, sqe.slba(), t);
            }
            Ok(()) => match sqe.opcode {
                io_opc::READ => {
                    b.stats.read_cmds.fetch_add(1, Relaxed);
                    b.stats.bytes_read.fetch_add(len as u64, Relaxed);
                    let success = b.sqflow_off;
                    t.send_data(sqe.cid, done.buf, len, success);
                    if success {
                        self.free_slot(tag);
                    } else {
                        self.complete(tag, Status::SUCCESS, 0, 0, t);
                    }
                }
                opc => {
                    if opc == io_opc::WRITE {
                        b.stats.write_cmds.fetch_add(1, Relaxed);
                        b.stats.bytes_written.fetch_add(len as u64, Relaxed);
                    }
                    self.pool.put(done.buf);
                    self.complete(tag, Status::SUCCESS, 0, 0, t);
                }
            },
        }
    }

    /// A device I/O finished while the connection is being torn down
    /// without answers: drop its result.
    pub fn discard_io(&mut self, tag: u16, done: IoDone) {
        self.pool.put(done.buf);
        self.free_slot(tag);
    }

    /// The controller queued an async event: complete held AERs with them.
    pub fn on_events<T: Transport>(&mut self, t: &mut T) {
        let Some(b) = &self.bound else { return };
        let ctrl = b.ctrl.clone();
        while !self.aers.is_empty() {
            let Some(ev) = ctrl.state.lock().pending_events.pop_front() else {
                break;
            };
            let i = self.aers.pop_front().expect("non-empty");
            self.complete(i, Status::SUCCESS, ev.0, 0, t);
        }
    }

    // ---- slots and completions

    fn alloc_slot(&mut self, sqe: Sqe) -> Option<u16> {
        let i = self.free.pop()?;
        self.slots[usize::from(i)] = Slot {
            state: SlotState::Busy,
            sqe,
            after: AfterData::Nothing,
            counted_write: false,
            started: self.slots[usize::from(i)].started,
        };
        self.note_depth();
        Some(i)
    }

    fn free_slot(&mut self, i: u16) {
        if !self.resv_status.is_empty() {
            self.resv_status.retain(|(s, _)| *s != i);
        }
        let s = &mut self.slots[usize::from(i)];
        if s.counted_write {
            s.counted_write = false;
            if let Some(b) = &self.bound {
                b.stats.writes_done.fetch_add(1, SeqCst);
            }
        }
        if s.after == AfterData::Connect {
            self.connecting = false;
        }
        debug_assert!(s.state != SlotState::Free, "slot {i} freed twice");
        s.state = SlotState::Free;
        self.free.push(i);
        self.note_depth();
    }

    /// Commands (held AERs included) the queue has now, for the depth gauge:
    /// a plain store into the queue's own counters.
    #[inline]
    fn note_depth(&self) {
        if let Some(b) = &self.bound {
            let depth = (self.slots.len() - self.free.len()) as u64;
            b.stats.depth.store(depth, Relaxed);
        }
    }

    fn respond<T: Transport>(&mut self, cid: u16, st: Status, dw0: u32, dw1: u32, t: &mut T) {
        t.respond(Cqe {
            dw0,
            dw1,
            sqhd: self.sqhd,
            sqid: self.bound.as_ref().map_or(0, |b| b.qid),
            cid,
            status: st,
        });
    }

    /// Answers slot `i`, logs a failure in the error log, frees the slot.
    fn complete<T: Transport>(&mut self, i: u16, st: Status, dw0: u32, dw1: u32, t: &mut T) {
        self.finish(i, st, dw0, dw1, 0, t);
    }

    fn complete_lba<T: Transport>(&mut self, i: u16, st: Status, lba: u64, t: &mut T) {
        self.finish(i, st, 0, 0, lba, t);
    }

    fn finish<T: Transport>(
        &mut self,
        i: u16,
        st: Status,
        dw0: u32,
        dw1: u32,
        lba: u64,
        t: &mut T,
    ) {
        let sqe = self.slots[usize::from(i)].sqe;
        if !st.is_success()
            && !sqe.is_fabrics()
            && let Some(b) = &self.bound
        {
            b.ctrl.record_error(b.qid, sqe.cid, st, sqe.nsid, lba);
        }
        self.respond(sqe.cid, st, dw0, dw1, t);
        self.free_slot(i);
    }

    /// Gets `len` bytes of host data for slot `i`: returns them now when
    /// they came in the capsule, else asks the transport for them (and the
    /// command goes on in `on_data`).
    fn fetch_host_data<T: Transport>(
        &mut self,
        i: u16,
        sgl: Sgl,
        len: u32,
        in_capsule: &[u8],
        t: &mut T,
    ) -> Option<AlignedBuf> {
        if sgl.len != len {
            self.complete(i, Status::generic(status::SC_SGL_INVALID_DATA_LEN), 0, 0, t);
            return None;
        }
        let mut buf = self.pool.get(len as usize);
        if sgl.in_capsule {
            buf.copy_from_slice(in_capsule);
            return Some(buf);
        }
        let s = &mut self.slots[usize::from(i)];
        s.state = SlotState::AwaitData;
        t.request_data(i, s.sqe.cid, buf);
        None
    }
}

/// Counts a finished Read or Write in its namespace's stats.
#[inline]
fn record_io(s: &NsIoStats, opcode: u8, took: std::time::Duration, len: usize, ok: bool) {
    if opcode == io_opc::READ {
        if ok {
            s.reads.fetch_add(1, Relaxed);
            s.read_bytes.fetch_add(len as u64, Relaxed);
        } else {
            s.read_errors.fetch_add(1, Relaxed);
        }
        s.read_latency.record(took);
    } else {
        if ok {
            s.writes.fetch_add(1, Relaxed);
            s.write_bytes.fetch_add(len as u64, Relaxed);
        } else {
            s.write_errors.fetch_add(1, Relaxed);
        }
        s.write_latency.record(took);
    }
}
