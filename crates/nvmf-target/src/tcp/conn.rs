//! One NVMe/TCP connection = one queue pair, owned by one reactor task.
//!
//! Receive: many PDUs per read into `rx`; each header is checked before its
//! body is awaited. Commands take a slot (its index is the R2T transfer tag).
//! Send: responses are coalesced in `out` and written once per loop turn.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use blockdev::{AlignedBuf, BlockOp, IoDone, IoFuture, IoRequest};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use nvme_wire::cqe::Cqe;
use nvme_wire::digest::{DIGEST_LEN, crc32c, data_digest};
use nvme_wire::fabrics::{CATTR_DISABLE_SQFLOW, ConnectCmd, PropertyCmd, fctype};
use nvme_wire::pdu::{
    C2HDataHdr, CH_LEN, CommonHeader, FLAG_DDGSTF, FLAG_HDGSTF, FLAG_LAST_PDU, FLAG_SUCCESS, Fes,
    H2C_OFF_CCCID, H2C_OFF_DATAL, H2C_OFF_DATAO, H2C_OFF_TTAG, H2CDataHdr, ICREQ_OFF_HPDA,
    ICREQ_OFF_PFV, ICReq, ICResp, PduType, R2THdr, TERMREQ_HLEN, TERMREQ_MAX_DATA, TermReq,
};
use nvme_wire::sqe::{
    FUSE_MASK, PSDT_MASK, SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK, Sqe, io_opc,
};
use nvme_wire::status::{self, Status};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::bufpool::BufPool;
use super::out::OutQueue;
use super::pdu_check::{Negotiated, PduLayout, TermError, check_header};
use crate::Target;
use crate::admin::{self, AdminCtx, AdminOutcome};
use crate::config::ADMIN_IN_CAPSULE_DATA;
use crate::controller::{AER_LIMIT, Controller, FreeReason, QueueStats};
use crate::fabrics;
use crate::io::{self, IoPlan};
use crate::subsystem::Namespace;

/// Transient Transport Error (generic status 0x22): a data digest mismatch.
const SC_TRANSIENT_TRANSPORT: u8 = 0x22;
/// How often I/O queues refresh the controller's keep-alive clock.
const TOUCH_EVERY: Duration = Duration::from_millis(500);
/// How long a closing connection waits to send its last PDUs.
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Waiting for H2CData after an R2T.
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
    Io { ns: usize, plan: IoPlan },
}

struct Slot {
    state: SlotState,
    sqe: Sqe,
    buf: Option<AlignedBuf>,
    xfer_len: u32,
    received: u32,
    digest_error: bool,
    after: AfterData,
}

impl Slot {
    fn empty() -> Self {
        Slot {
            state: SlotState::Free,
            sqe: Sqe::new(0, 0),
            buf: None,
            xfer_len: 0,
            received: 0,
            digest_error: false,
            after: AfterData::Nothing,
        }
    }
}

/// H2CData payloads at least this large skip the receive buffer.
const DIRECT_RX_MIN: usize = 16 * 1024;

/// Where the rest of an H2CData payload goes: slot `slot`'s buffer at `off`.
#[derive(Debug, Clone, Copy)]
struct DirectRx {
    slot: u16,
    off: usize,
    remaining: usize,
    datal: u32,
}

/// What the SGL says about the command's data.
#[derive(Debug, Clone, Copy)]
struct Sgl {
    len: u32,
    in_capsule: bool,
}

/// The queue this connection became by its Connect.
struct Queue {
    ctrl: Arc<Controller>,
    qid: u16,
    depth: u16,
    sqflow_off: bool,
    kill: watch::Receiver<Option<FreeReason>>,
    stats: Arc<QueueStats>,
    /// Snapshot of the subsystem's namespaces, reloaded when `ns_version`
    /// falls behind the subsystem's (a namespace added or removed).
    namespaces: Arc<[Namespace]>,
    ns_version: u64,
}

#[derive(Debug)]
enum End {
    Eof,
    IoError,
    Fatal(TermError, Vec<u8>),
    HostTermReq,
    Disconnect,
    Killed(FreeReason),
    KeepAlive(u32),
    Shutdown,
}

/// A backend I/O in flight, tagged with its slot.
struct Tagged {
    slot: u16,
    fut: IoFuture,
}

impl Future for Tagged {
    type Output = (u16, IoDone);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let slot = this.slot;
        Pin::new(&mut this.fut).poll(cx).map(|d| (slot, d))
    }
}

pub(crate) struct Conn {
    target: Arc<Target>,
    stream: TcpStream,
    peer: String,
    neg: Negotiated,
    /// Host PDU data alignment in bytes ((HPDA + 1) * 4).
    hpda_align: usize,
    queue: Option<Queue>,
    /// A Connect is waiting for its data: no second Connect meanwhile.
    connecting: bool,
    /// A large H2CData payload being read straight into its command's buffer.
    direct: Option<DirectRx>,
    sqhd: u16,
    slots: Vec<Slot>,
    free: Vec<u16>,
    aers: std::collections::VecDeque<u16>,
    pool: BufPool,
    inflight: FuturesUnordered<Tagged>,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    /// Whole PDUs in `rx` before this offset went through `hint_io`.
    rx_hinted: usize,
    out: OutQueue,
    end: Option<End>,
    last_touch: Instant,
    /// When this queue last received data, completed I/O or sent answers
    /// (adaptive polling).
    last_busy: Instant,
    poll: Option<Duration>,
}

pub(crate) async fn serve(stream: TcpStream, target: Arc<Target>, shutdown: watch::Receiver<bool>) {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let mut conn = Conn::new(stream, target, peer);
    let end = conn.run(shutdown).await;
    conn.finish(end).await;
}

impl Conn {
    fn new(stream: TcpStream, target: Arc<Target>, peer: String) -> Self {
        let t = &target.transport;
        let max_data = t
            .max_h2c_data
            .max(t.in_capsule_data)
            .max(ADMIN_IN_CAPSULE_DATA) as usize;
        let rx_len = (2 * (max_data + 512)).max(128 * 1024);
        let nslots = usize::from(t.max_queue_depth) + AER_LIMIT + 1;
        Conn {
            neg: Negotiated {
                ic_done: false,
                hdgst: false,
                ddgst: false,
                max_capsule_data: t.in_capsule_data.max(ADMIN_IN_CAPSULE_DATA),
                maxh2cdata: t.max_h2c_data,
            },
            hpda_align: 4,
            queue: None,
            connecting: false,
            direct: None,
            sqhd: 0,
            slots: (0..nslots).map(|_| Slot::empty()).collect(),
            free: (0..nslots as u16).rev().collect(),
            aers: Default::default(),
            pool: BufPool::new(t.max_transfer),
            inflight: FuturesUnordered::new(),
            rx: vec![0; rx_len],
            rx_start: 0,
            rx_end: 0,
            rx_hinted: 0,
            out: OutQueue::new(),
            end: None,
            last_touch: Instant::now(),
            last_busy: Instant::now(),
            poll: (t.poll_us > 0).then(|| Duration::from_micros(u64::from(t.poll_us))),
            target,
            stream,
            peer,
        }
    }

    async fn run(&mut self, mut shutdown: watch::Receiver<bool>) -> End {
        loop {
            if !self.out.is_empty() {
                if let Some(end) = self.flush_watching(&mut shutdown).await {
                    return end;
                }
                // The poll window runs from our last answer, not from the data
                // that started the batch: a batch of 32 reads takes about as long
                // as the window, and the host's next commands follow our answers.
                if self.poll.is_some() {
                    self.last_busy = Instant::now();
                }
            }
            if let Some(end) = self.end.take() {
                return end;
            }
            if *shutdown.borrow() {
                return End::Shutdown;
            }
            if self.rx.len() - self.rx_end < 4096 {
                self.compact_rx();
            }
            let ka = self.keep_alive_wait();
            let events = match &self.queue {
                Some(q) if q.qid == 0 && !self.aers.is_empty() => Some(q.ctrl.clone()),
                _ => None,
            };
            // Adaptive polling: right after activity, keep yielding to the
            // runtime (which polls the sockets without sleeping) instead of
            // parking the thread; an idle queue stops spinning after `poll`.
            let spin = self.poll.is_some_and(|p| self.last_busy.elapsed() < p);
            let kill = self.queue.as_mut().map(|q| &mut q.kill);
            let dst: &mut [u8] = match self.direct {
                Some(d) => {
                    let buf = self.slots[usize::from(d.slot)]
                        .buf
                        .as_mut()
                        .expect("direct buffer");
                    &mut buf[d.off..d.off + d.remaining]
                }
                None => &mut self.rx[self.rx_end..],
            };
            tokio::select! {
                biased;
                _ = shutdown.changed() => return End::Shutdown,
                r = wait_kill(kill) => return End::Killed(r),
                Some((slot, done)) = self.inflight.next(), if !self.inflight.is_empty() => {
                    self.last_busy = Instant::now();
                    self.on_io_done(slot, done);
                    // Complete whatever else is ready without another wake-up.
                    while let Some(Some((slot, done))) = futures_util::FutureExt::now_or_never(self.inflight.next()) {
                        self.on_io_done(slot, done);
                    }
                }
                r = self.stream.read(dst) => match r {
                    Ok(0) => return End::Eof,
                    Ok(n) => {
                        if self.poll.is_some() {
                            self.last_busy = Instant::now();
                        }
                        match self.direct.as_mut() {
                            Some(d) => {
                                d.off += n;
                                d.remaining -= n;
                                if d.remaining == 0 {
                                    let d = self.direct.take().expect("direct receive");
                                    self.h2c_received(d.slot, d.datal, false);
                                }
                            }
                            None => {
                                self.rx_end += n;
                                self.process_rx();
                            }
                        }
                    }
                    Err(_) => return End::IoError,
                },
                _ = sleep_opt(ka) => {
                    if let Some(q) = &self.queue {
                        let kato = q.ctrl.kato_ms();
                        if kato > 0 && q.ctrl.idle_ms() >= u64::from(kato) {
                            return End::KeepAlive(kato);
                        }
                    }
                }
                _ = notified(events.as_deref()) => self.deliver_events(),
                _ = tokio::task::yield_now(), if spin => {}
            }
        }
    }

    /// Sends queued PDUs. A host that stops reading must not pin the
    /// connection: shutdown, controller teardown and keep-alive still apply.
    /// Returns how the connection ends, or None to carry on (the queue may
    /// still hold bytes if the keep-alive timer woke us first).
    async fn flush_watching(&mut self, shutdown: &mut watch::Receiver<bool>) -> Option<End> {
        let ka = self.keep_alive_wait();
        let ctrl = self.queue.as_ref().map(|q| q.ctrl.clone());
        let kill = self.queue.as_mut().map(|q| &mut q.kill);
        tokio::select! {
            biased;
            r = self.out.flush(&mut self.stream, &mut self.pool) => r.err().map(|_| End::IoError),
            _ = shutdown.changed() => Some(End::Shutdown),
            r = wait_kill(kill) => Some(End::Killed(r)),
            _ = sleep_opt(ka) => {
                let c = ctrl.expect("keep-alive only with a controller");
                let kato = c.kato_ms();
                (kato > 0 && c.idle_ms() >= u64::from(kato)).then_some(End::KeepAlive(kato))
            }
        }
    }

    /// On the admin queue: time left before KATO expires, if one is set.
    fn keep_alive_wait(&self) -> Option<Duration> {
        let q = self.queue.as_ref().filter(|q| q.qid == 0)?;
        let kato = u64::from(q.ctrl.kato_ms());
        if kato == 0 {
            return None;
        }
        Some(Duration::from_millis(
            kato.saturating_sub(q.ctrl.idle_ms()).max(1),
        ))
    }

    fn compact_rx(&mut self) {
        if self.rx_start > 0 {
            self.rx.copy_within(self.rx_start..self.rx_end, 0);
            self.rx_end -= self.rx_start;
            self.rx_hinted = self.rx_hinted.saturating_sub(self.rx_start);
            self.rx_start = 0;
        }
    }

    /// Tells the backends about the reads and writes among the whole commands
    /// received so far, before any of them runs, so that their memory latencies
    /// overlap (a RAM namespace prefetches). Only a hint: `process_rx` checks
    /// the PDUs.
    fn hint_io(&mut self) {
        let Some(q) = self.queue.as_ref().filter(|q| q.qid != 0) else {
            return;
        };
        let from = self.rx_hinted.max(self.rx_start);
        let seen = scan_io(&self.rx[from..self.rx_end], |sqe| {
            if let Some(ns) = crate::subsystem::find_namespace(&q.namespaces, sqe.nsid) {
                ns.dev.prefetch(sqe.slba(), sqe.nlb());
            }
        });
        self.rx_hinted = from + seen;
    }

    fn process_rx(&mut self) {
        self.hint_io();
        while self.end.is_none() {
            let avail = self.rx_end - self.rx_start;
            if avail < CH_LEN {
                break;
            }
            let head = &self.rx[self.rx_start..self.rx_end];
            let ch = CommonHeader::decode(head).expect("8 bytes available");
            let layout = match check_header(&ch, &self.neg) {
                Ok(l) => l,
                Err(e) => {
                    let n = avail
                        .min(TERMREQ_MAX_DATA)
                        .min(usize::from(ch.hlen).max(CH_LEN));
                    let offending = head[..n].to_vec();
                    self.fatal(e, offending);
                    return;
                }
            };
            if avail < layout.plen
                && layout.pdu_type == PduType::H2CData
                && !layout.dd
                && layout.data_len >= DIRECT_RX_MIN
                && avail >= layout.data_off
            {
                self.start_direct_rx(&layout);
                break;
            }
            if avail < layout.plen {
                if self.rx.len() - self.rx_start < layout.plen {
                    self.compact_rx();
                }
                break;
            }
            let start = self.rx_start;
            self.rx_start += layout.plen;
            let rx = std::mem::take(&mut self.rx);
            self.on_pdu(&ch, &layout, &rx[start..start + layout.plen]);
            self.rx = rx;
        }
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
            self.rx_hinted = 0;
        }
        if let Some(q) = &self.queue
            && q.qid != 0
            && self.last_touch.elapsed() >= TOUCH_EVERY
        {
            q.ctrl.touch();
            self.last_touch = Instant::now();
        }
    }

    /// The header of a large H2CData PDU is here but not all its data: move
    /// what arrived into the command's buffer and read the rest straight
    /// there, so write data is copied once (socket -> aligned buffer).
    fn start_direct_rx(&mut self, l: &PduLayout) {
        let start = self.rx_start;
        let avail = self.rx_end - start;
        let rx = std::mem::take(&mut self.rx);
        let pdu = &rx[start..self.rx_end];
        if self.header_digest_ok(l, pdu)
            && let Some((i, h)) = self.h2c_check(l, &pdu[..l.hlen])
        {
            let have = avail - l.data_off;
            let off = h.datao as usize;
            self.slots[usize::from(i)]
                .buf
                .as_mut()
                .expect("buffer while awaiting data")[off..off + have]
                .copy_from_slice(&pdu[l.data_off..]);
            self.direct = Some(DirectRx {
                slot: i,
                off: off + have,
                remaining: l.data_len - have,
                datal: h.datal,
            });
        }
        self.rx = rx;
        self.rx_start = 0;
        self.rx_end = 0;
        self.rx_hinted = 0;
    }

    fn fatal(&mut self, e: TermError, offending: Vec<u8>) {
        tracing::warn!(
            "{}: fatal transport error {:?} at header byte {}: sending C2HTermReq",
            self.peer,
            e.fes,
            e.fei
        );
        self.end = Some(End::Fatal(e, offending));
    }

    /// Checks the header digest (when on); a mismatch is fatal.
    fn header_digest_ok(&mut self, l: &PduLayout, pdu: &[u8]) -> bool {
        if l.hd == 0 {
            return true;
        }
        let want = crc32c(&pdu[..l.hlen]);
        let got = u32::from_le_bytes(pdu[l.hlen..l.hlen + 4].try_into().expect("4 bytes"));
        if want != got {
            self.fatal(
                TermError::new(Fes::HeaderDigestError, 0),
                pdu[..l.hlen].to_vec(),
            );
        }
        want == got
    }

    fn on_pdu(&mut self, ch: &CommonHeader, l: &PduLayout, pdu: &[u8]) {
        if !self.header_digest_ok(l, pdu) {
            return;
        }
        match l.pdu_type {
            PduType::ICReq => self.on_icreq(pdu),
            PduType::H2CTermReq => {
                let t = TermReq::decode(pdu).ok();
                tracing::warn!("{}: host terminated the connection: {:?}", self.peer, t);
                self.end = Some(End::HostTermReq);
            }
            PduType::CapsuleCmd => self.on_capsule(ch, l, pdu),
            PduType::H2CData => self.on_h2c_data(l, pdu),
            _ => self.fatal(
                TermError::new(Fes::InvalidHeaderField, 0),
                pdu[..CH_LEN].to_vec(),
            ),
        }
    }

    fn on_icreq(&mut self, pdu: &[u8]) {
        let Ok(req) = ICReq::decode(pdu) else {
            self.fatal(TermError::new(Fes::InvalidHeaderField, 4), pdu.to_vec());
            return;
        };
        if req.pfv != 0 {
            self.fatal(
                TermError::new(Fes::InvalidHeaderField, ICREQ_OFF_PFV),
                pdu.to_vec(),
            );
            return;
        }
        if req.hpda > 31 {
            self.fatal(
                TermError::new(Fes::InvalidHeaderField, ICREQ_OFF_HPDA),
                pdu.to_vec(),
            );
            return;
        }
        let t = &self.target.transport;
        self.neg.hdgst = req.dgst & 1 != 0 && t.header_digest;
        self.neg.ddgst = req.dgst & 2 != 0 && t.data_digest;
        self.neg.ic_done = true;
        self.hpda_align = (usize::from(req.hpda) + 1) * 4;
        let resp = ICResp {
            pfv: 0,
            cpda: 0,
            dgst: u8::from(self.neg.hdgst) | (u8::from(self.neg.ddgst) << 1),
            maxh2cdata: t.max_h2c_data,
        };
        self.out.push_bytes(&resp.encode());
    }

    fn on_capsule(&mut self, ch: &CommonHeader, l: &PduLayout, pdu: &[u8]) {
        let sqe = Sqe::decode(&pdu[CH_LEN..CH_LEN + 64]).expect("72-byte header");
        let data = &pdu[l.data_off..l.data_off + l.data_len];
        let depth = self.queue.as_ref().map_or(u16::MAX, |q| q.depth);
        self.sqhd = if depth == u16::MAX {
            self.sqhd.wrapping_add(1)
        } else {
            (self.sqhd + 1) % depth
        };
        if l.dd && !digest_ok(data, &pdu[l.data_off + l.data_len..]) {
            tracing::warn!(
                "{}: data digest error in command capsule cid {}",
                self.peer,
                sqe.cid
            );
            self.respond(
                sqe.cid,
                Status::generic(SC_TRANSIENT_TRANSPORT).retryable(),
                0,
                0,
            );
            return;
        }
        let _ = ch;
        let Some(slot) = self.alloc_slot(sqe) else {
            // More commands than the queue has entries: the host broke SQ flow control.
            self.respond(
                sqe.cid,
                Status::generic(status::SC_INTERNAL).retryable(),
                0,
                0,
            );
            return;
        };
        if sqe.flags & FUSE_MASK != 0 {
            // Fused operations (Compare and Write) are not supported: running
            // the halves as plain commands would break their atomicity.
            return self.complete(slot, Status::generic(status::SC_INVALID_FIELD), 0, 0);
        }
        let icd_limit = self.neg.max_capsule_data;
        let sgl = match check_sgl(&sqe, data.len(), icd_limit) {
            Ok(s) => s,
            Err(st) => return self.complete(slot, st, 0, 0),
        };
        if sqe.is_fabrics() {
            return self.fabrics(slot, sgl, data);
        }
        match &self.queue {
            None => self.complete(slot, Status::generic(status::SC_CMD_SEQ_ERROR), 0, 0),
            Some(q) if q.qid == 0 => self.admin(slot, sgl),
            Some(_) => self.io(slot, sgl, data),
        }
    }

    // ---- slots

    fn alloc_slot(&mut self, sqe: Sqe) -> Option<u16> {
        let i = self.free.pop()?;
        let s = &mut self.slots[usize::from(i)];
        s.state = SlotState::Busy;
        s.sqe = sqe;
        s.xfer_len = 0;
        s.received = 0;
        s.digest_error = false;
        s.after = AfterData::Nothing;
        Some(i)
    }

    fn free_slot(&mut self, i: u16) {
        let s = &mut self.slots[usize::from(i)];
        if s.after == AfterData::Connect {
            self.connecting = false;
        }
        if let Some(b) = s.buf.take() {
            self.pool.put(b);
        }
        s.state = SlotState::Free;
        self.free.push(i);
    }

    /// Sends the CapsuleResp for slot `i`, logs failures to the error log, frees the slot.
    fn complete(&mut self, i: u16, st: Status, dw0: u32, dw1: u32) {
        let sqe = self.slots[usize::from(i)].sqe;
        if !st.is_success()
            && !sqe.is_fabrics()
            && let Some(q) = &self.queue
        {
            q.ctrl.record_error(q.qid, sqe.cid, st, sqe.nsid, 0);
        }
        self.respond(sqe.cid, st, dw0, dw1);
        self.free_slot(i);
    }

    // ---- PDUs we send

    fn respond(&mut self, cid: u16, st: Status, dw0: u32, dw1: u32) {
        let cqe = Cqe {
            dw0,
            dw1,
            sqhd: self.sqhd,
            sqid: self.queue.as_ref().map_or(0, |q| q.qid),
            cid,
            status: st,
        }
        .encode();
        let hd = if self.neg.hdgst { DIGEST_LEN } else { 0 };
        let mut b = [0u8; 28];
        CommonHeader {
            pdu_type: PduType::CapsuleResp as u8,
            flags: if hd > 0 { FLAG_HDGSTF } else { 0 },
            hlen: 24,
            pdo: 0,
            plen: (24 + hd) as u32,
        }
        .encode(&mut b);
        b[CH_LEN..24].copy_from_slice(&cqe);
        self.push_header(&mut b, 24, hd);
    }

    /// Appends a header of `hlen` bytes from `b` plus its digest when on.
    fn push_header(&mut self, b: &mut [u8], hlen: usize, hd: usize) {
        if hd > 0 {
            let d = crc32c(&b[..hlen]);
            b[hlen..hlen + 4].copy_from_slice(&d.to_le_bytes());
        }
        self.out.push_bytes(&b[..hlen + hd]);
    }

    fn send_r2t(&mut self, i: u16) {
        let s = &self.slots[usize::from(i)];
        let hd = if self.neg.hdgst { DIGEST_LEN } else { 0 };
        let mut b = [0u8; 28];
        R2THdr {
            cccid: s.sqe.cid,
            ttag: i,
            r2to: 0,
            r2tl: s.xfer_len,
        }
        .encode(
            &mut b,
            CommonHeader {
                pdu_type: PduType::R2T as u8,
                flags: if hd > 0 { FLAG_HDGSTF } else { 0 },
                hlen: 24,
                pdo: 0,
                plen: (24 + hd) as u32,
            },
        );
        self.push_header(&mut b, 24, hd);
    }

    /// Sends `buf[..len]` in one C2HData PDU. With `success` the PDU also
    /// completes the command (only allowed when SQ flow control is off).
    fn send_c2h(&mut self, cid: u16, buf: AlignedBuf, len: usize, success: bool) {
        let hd = if self.neg.hdgst { DIGEST_LEN } else { 0 };
        let dd = if self.neg.ddgst { DIGEST_LEN } else { 0 };
        let pdo = (24 + hd).next_multiple_of(self.hpda_align);
        let mut flags = FLAG_LAST_PDU;
        if hd > 0 {
            flags |= FLAG_HDGSTF;
        }
        if dd > 0 {
            flags |= FLAG_DDGSTF;
        }
        if success {
            flags |= FLAG_SUCCESS;
        }
        let mut b = [0u8; 128];
        C2HDataHdr {
            cccid: cid,
            datao: 0,
            datal: len as u32,
        }
        .encode(
            &mut b,
            CommonHeader {
                pdu_type: PduType::C2HData as u8,
                flags,
                hlen: 24,
                pdo: pdo as u8,
                plen: (pdo + len + dd) as u32,
            },
        );
        if hd > 0 {
            let d = crc32c(&b[..24]);
            b[24..28].copy_from_slice(&d.to_le_bytes());
        }
        self.out.push_bytes(&b[..pdo]);
        let digest = (dd > 0).then(|| data_digest(&buf[..len]));
        self.out.push_buf(buf, len);
        if let Some(d) = digest {
            self.out.push_bytes(&d.to_le_bytes());
        }
    }

    // ---- host data: in-capsule or R2T/H2CData

    /// Puts `len` bytes of host data into slot `i`'s buffer. Returns true when
    /// they are there now; false when an R2T went out (or the command failed).
    fn fetch_host_data(&mut self, i: u16, sgl: Sgl, len: u32, in_capsule: &[u8]) -> bool {
        if sgl.len != len {
            self.complete(i, Status::generic(status::SC_SGL_INVALID_DATA_LEN), 0, 0);
            return false;
        }
        let mut buf = self.pool.get(len as usize);
        let s = &mut self.slots[usize::from(i)];
        if sgl.in_capsule {
            buf.copy_from_slice(in_capsule);
            s.buf = Some(buf);
            return true;
        }
        s.buf = Some(buf);
        s.xfer_len = len;
        s.received = 0;
        s.state = SlotState::AwaitData;
        self.send_r2t(i);
        false
    }

    /// Checks an H2CData header against the R2T it answers. Returns the
    /// slot and the header, or None after queuing a fatal error.
    fn h2c_check(&mut self, l: &PduLayout, hdr: &[u8]) -> Option<(u16, H2CDataHdr)> {
        let h = H2CDataHdr::decode(hdr).expect("24-byte header");
        let i = h.ttag;
        let err = match self
            .slots
            .get(usize::from(i))
            .filter(|s| s.state == SlotState::AwaitData)
        {
            None => Some((Fes::InvalidHeaderField, H2C_OFF_TTAG)),
            Some(s) if s.sqe.cid != h.cccid => Some((Fes::InvalidHeaderField, H2C_OFF_CCCID)),
            Some(_) if h.datal as usize != l.data_len || h.datal == 0 => {
                Some((Fes::InvalidHeaderField, H2C_OFF_DATAL))
            }
            Some(_) if h.datal > self.neg.maxh2cdata => {
                Some((Fes::DataTransferLimitExceeded, H2C_OFF_DATAL))
            }
            Some(s) if h.datao != s.received => Some((Fes::DataTransferOutOfRange, H2C_OFF_DATAO)),
            Some(s) if u64::from(h.datao) + u64::from(h.datal) > u64::from(s.xfer_len) => {
                Some((Fes::DataTransferOutOfRange, H2C_OFF_DATAL))
            }
            Some(_) => None,
        };
        match err {
            Some((fes, fei)) => {
                self.fatal(TermError::new(fes, fei), hdr[..l.hlen].to_vec());
                None
            }
            None => Some((i, h)),
        }
    }

    fn on_h2c_data(&mut self, l: &PduLayout, pdu: &[u8]) {
        let Some((i, h)) = self.h2c_check(l, &pdu[..l.hlen]) else {
            return;
        };
        let data = &pdu[l.data_off..l.data_off + l.data_len];
        let bad_digest = l.dd && !digest_ok(data, &pdu[l.data_off + l.data_len..]);
        let off = h.datao as usize;
        self.slots[usize::from(i)]
            .buf
            .as_mut()
            .expect("buffer while awaiting data")[off..off + data.len()]
            .copy_from_slice(data);
        self.h2c_received(i, h.datal, bad_digest);
    }

    /// `datal` more bytes of slot `i`'s data are in its buffer.
    fn h2c_received(&mut self, i: u16, datal: u32, bad_digest: bool) {
        let s = &mut self.slots[usize::from(i)];
        s.received += datal;
        s.digest_error |= bad_digest;
        if s.received < s.xfer_len {
            return;
        }
        s.state = SlotState::Busy;
        if s.digest_error {
            tracing::warn!(
                "{}: data digest error in H2CData for cid {}",
                self.peer,
                s.sqe.cid
            );
            return self.complete(i, Status::generic(SC_TRANSIENT_TRANSPORT).retryable(), 0, 0);
        }
        self.run_after_data(i);
    }

    fn run_after_data(&mut self, i: u16) {
        match self.slots[usize::from(i)].after {
            AfterData::Connect => self.do_connect(i),
            AfterData::Io { ns, plan } => self.execute_io(i, ns, plan),
            AfterData::Nothing => self.complete(i, Status::SUCCESS, 0, 0),
        }
    }

    // ---- Fabrics

    fn fabrics(&mut self, i: u16, sgl: Sgl, data: &[u8]) {
        let sqe = self.slots[usize::from(i)].sqe;
        let is_admin = self.queue.as_ref().map(|q| q.qid == 0);
        match sqe.fctype() {
            fctype::CONNECT => {
                if self.queue.is_some() || self.connecting {
                    return self.complete(i, Status::generic(status::SC_CMD_SEQ_ERROR), 0, 0);
                }
                self.slots[usize::from(i)].after = AfterData::Connect;
                self.connecting = true;
                if self.fetch_host_data(i, sgl, nvme_wire::fabrics::CONNECT_DATA_LEN as u32, data) {
                    self.do_connect(i);
                }
            }
            fctype::PROPERTY_GET | fctype::PROPERTY_SET => {
                let Some(q) = self.queue.as_ref() else {
                    return self.complete(i, Status::generic(status::SC_CMD_SEQ_ERROR), 0, 0);
                };
                if is_admin != Some(true) {
                    return self.complete(i, Status::generic(status::SC_INVALID_OPCODE), 0, 0);
                }
                let ctrl = q.ctrl.clone();
                ctrl.touch();
                let p = PropertyCmd::from_sqe(&sqe);
                if sqe.fctype() == fctype::PROPERTY_GET {
                    let cap =
                        nvme_wire::fabrics::prop::cap(self.target.transport.max_queue_depth, 15);
                    match ctrl.property_get(p.offset, p.size8, cap) {
                        Ok(v) => self.complete(i, Status::SUCCESS, v as u32, (v >> 32) as u32),
                        Err(st) => self.complete(i, st, 0, 0),
                    }
                } else {
                    match ctrl.property_set(p.offset, p.size8, p.value) {
                        Ok(()) => self.complete(i, Status::SUCCESS, 0, 0),
                        Err(st) => self.complete(i, st, 0, 0),
                    }
                }
            }
            fctype::DISCONNECT => {
                if self.queue.is_none() {
                    return self.complete(i, Status::generic(status::SC_CMD_SEQ_ERROR), 0, 0);
                }
                self.complete(i, Status::SUCCESS, 0, 0);
                self.end = Some(End::Disconnect);
            }
            _ => self.complete(i, Status::generic(status::SC_INVALID_OPCODE), 0, 0),
        }
    }

    fn do_connect(&mut self, i: u16) {
        let sqe = self.slots[usize::from(i)].sqe;
        let cmd = ConnectCmd::from_sqe(&sqe);
        let buf = self.slots[usize::from(i)].buf.take().expect("connect data");
        let res = fabrics::connect(&self.target, &cmd, &buf, &self.peer);
        self.pool.put(buf);
        match res {
            Ok(ctrl) => {
                let (namespaces, ns_version) = match ctrl.subsystem() {
                    Some(s) => (s.namespaces(), s.ns_version()),
                    None => (Arc::from(Vec::new()), 0),
                };
                self.neg.max_capsule_data = if cmd.qid == 0 {
                    ADMIN_IN_CAPSULE_DATA
                } else {
                    self.target.transport.in_capsule_data
                };
                self.sqhd = 1 % (cmd.sqsize + 1);
                self.queue = Some(Queue {
                    kill: ctrl.watch_kill(),
                    stats: ctrl.register_queue_stats(),
                    depth: cmd.sqsize + 1,
                    sqflow_off: cmd.cattr & CATTR_DISABLE_SQFLOW != 0,
                    qid: cmd.qid,
                    namespaces,
                    ns_version,
                    ctrl: ctrl.clone(),
                });
                tracing::debug!(
                    "{}: queue {} of controller {} connected",
                    self.peer,
                    cmd.qid,
                    ctrl.cntlid
                );
                self.complete(i, Status::SUCCESS, u32::from(ctrl.cntlid), 0);
            }
            Err(e) => self.complete(i, e.status, e.dw0, 0),
        }
    }

    // ---- Admin

    fn admin(&mut self, i: u16, sgl: Sgl) {
        let q = self.queue.as_ref().expect("admin queue");
        let ctrl = q.ctrl.clone();
        ctrl.touch();
        let sqe = self.slots[usize::from(i)].sqe;
        let mut buf = None;
        if let Some(want) = admin::data_in_len(&sqe) {
            if sgl.in_capsule {
                return self.complete(i, Status::generic(status::SC_INVALID_FIELD), 0, 0);
            }
            if u64::from(sgl.len) != want {
                return self.complete(i, Status::generic(status::SC_SGL_INVALID_DATA_LEN), 0, 0);
            }
            if sgl.len > self.target.transport.max_transfer {
                return self.complete(i, Status::generic(status::SC_INVALID_FIELD), 0, 0);
            }
            buf = Some(self.pool.get(sgl.len as usize));
        }
        let cx = AdminCtx {
            target: &self.target,
            ctrl: &ctrl,
            outstanding_aers: self.aers.len(),
            local_ip: self.stream.local_addr().ok().map(|a| a.ip()),
        };
        let outcome = admin::execute(&cx, &sqe, buf.as_deref_mut().unwrap_or(&mut []));
        match outcome {
            AdminOutcome::Complete { status, dw0, data } => match buf {
                Some(b) if data && status.is_success() => {
                    let len = b.len();
                    self.send_c2h(sqe.cid, b, len, false);
                    self.complete(i, status, dw0, 0);
                }
                b => {
                    if let Some(b) = b {
                        self.pool.put(b);
                    }
                    self.complete(i, status, dw0, 0);
                }
            },
            AdminOutcome::HoldAer => {
                self.slots[usize::from(i)].state = SlotState::Aer;
                self.aers.push_back(i);
                self.deliver_events();
            }
        }
    }

    /// Completes held AERs with queued async events.
    fn deliver_events(&mut self) {
        let Some(q) = &self.queue else { return };
        let ctrl = q.ctrl.clone();
        while !self.aers.is_empty() {
            let Some(ev) = ctrl.state.lock().pending_events.pop_front() else {
                break;
            };
            let i = self.aers.pop_front().expect("non-empty");
            self.complete(i, Status::SUCCESS, ev.0, 0);
        }
    }

    // ---- I/O

    fn io(&mut self, i: u16, sgl: Sgl, data: &[u8]) {
        let q = self.queue.as_mut().expect("I/O queue");
        if let Some(sub) = q.ctrl.subsystem() {
            let v = sub.ns_version();
            if v != q.ns_version {
                q.namespaces = sub.namespaces();
                q.ns_version = v;
            }
        }
        let q = self.queue.as_ref().expect("I/O queue");
        if !q.ctrl.is_ready() {
            // The host reset the controller (CC.EN 1 -> 0): its I/O queues are gone.
            return self.complete(i, Status::generic(status::SC_CMD_SEQ_ERROR), 0, 0);
        }
        let sqe = self.slots[usize::from(i)].sqe;
        let planned = io::plan(&q.namespaces, &sqe, self.target.transport.max_transfer)
            .map(|(ns, plan)| (ns.nsid, ns.block_size, plan));
        let (nsid, bs, plan) = match planned {
            Ok(p) => p,
            Err(rej) => {
                q.ctrl
                    .record_error(q.qid, sqe.cid, rej.status, sqe.nsid, rej.lba);
                self.respond(sqe.cid, rej.status, 0, 0);
                return self.free_slot(i);
            }
        };
        let ns = q
            .namespaces
            .binary_search_by_key(&nsid, |n| n.nsid)
            .expect("planned namespace exists");
        let c2h = plan.ctrl_to_host_len(bs);
        let h2c = plan.host_to_ctrl_len(bs);
        if c2h > 0 {
            if sgl.in_capsule {
                return self.complete(i, Status::generic(status::SC_INVALID_FIELD), 0, 0);
            }
            if sgl.len != c2h {
                return self.complete(i, Status::generic(status::SC_SGL_INVALID_DATA_LEN), 0, 0);
            }
            self.slots[usize::from(i)].buf = Some(self.pool.get(c2h as usize));
            self.execute_io(i, ns, plan);
        } else if h2c > 0 {
            self.slots[usize::from(i)].after = AfterData::Io { ns, plan };
            if self.fetch_host_data(i, sgl, h2c, data) {
                self.execute_io(i, ns, plan);
            }
        } else {
            self.execute_io(i, ns, plan);
        }
    }

    fn execute_io(&mut self, i: u16, ns: usize, plan: IoPlan) {
        let q = self.queue.as_ref().expect("I/O queue");
        let dev = q.namespaces[ns].dev.clone();
        let buf = match self.slots[usize::from(i)].buf.take() {
            Some(b) => b,
            None => self.pool.get(0),
        };
        let req = |op, lba, blocks, buf| IoRequest {
            op,
            lba,
            blocks,
            buf,
        };
        let fut = match plan {
            IoPlan::Read { lba, blocks } => dev.submit(req(BlockOp::Read, lba, blocks, buf)),
            IoPlan::Write { lba, blocks, fua } => {
                dev.submit(req(BlockOp::Write { fua }, lba, blocks, buf))
            }
            IoPlan::Flush => dev.submit(req(BlockOp::Flush, 0, 0, buf)),
            IoPlan::WriteZeroes { lba, blocks } => {
                dev.submit(req(BlockOp::WriteZeroes, lba, blocks, buf))
            }
            IoPlan::Dsm { ranges, deallocate } => {
                let checked = io::dsm_ranges(&q.namespaces[ns], &buf, ranges);
                match checked {
                    Err(rej) => {
                        self.pool.put(buf);
                        return self.complete(i, rej.status, 0, 0);
                    }
                    Ok(_) if !deallocate => IoFuture::ready(buf, Ok(())),
                    Ok(list) => IoFuture::Pending(Box::pin(async move {
                        let mut buf = buf;
                        for r in list {
                            let d = dev
                                .submit(req(BlockOp::Deallocate, r.slba, r.nlb, buf))
                                .await;
                            buf = d.buf;
                            if d.result.is_err() {
                                return IoDone {
                                    buf,
                                    result: d.result,
                                };
                            }
                        }
                        IoDone {
                            buf,
                            result: Ok(()),
                        }
                    })),
                }
            }
        };
        match fut {
            IoFuture::Ready(Some(done)) => self.on_io_done(i, done),
            fut => self.inflight.push(Tagged { slot: i, fut }),
        }
    }

    fn on_io_done(&mut self, i: u16, done: IoDone) {
        let q = self.queue.as_ref().expect("I/O queue");
        let sqe = self.slots[usize::from(i)].sqe;
        let len = done.buf.len();
        use std::sync::atomic::Ordering::Relaxed;
        match done.result {
            Err(e) => {
                let op = if sqe.opcode == io_opc::READ {
                    BlockOp::Read
                } else {
                    BlockOp::Write { fua: false }
                };
                let st = io::status_of(&e, op);
                tracing::warn!(
                    "{}: I/O error on nsid {} cid {}: {}",
                    self.peer,
                    sqe.nsid,
                    sqe.cid,
                    e
                );
                if st.sct == status::SCT_MEDIA {
                    q.stats.media_errors.fetch_add(1, Relaxed);
                }
                q.ctrl
                    .record_error(q.qid, sqe.cid, st, sqe.nsid, sqe.slba());
                self.pool.put(done.buf);
                self.respond(sqe.cid, st, 0, 0);
            }
            Ok(()) => match sqe.opcode {
                io_opc::READ => {
                    q.stats.read_cmds.fetch_add(1, Relaxed);
                    q.stats.bytes_read.fetch_add(len as u64, Relaxed);
                    let success = q.sqflow_off;
                    self.send_c2h(sqe.cid, done.buf, len, success);
                    if !success {
                        self.respond(sqe.cid, Status::SUCCESS, 0, 0);
                    }
                }
                opc => {
                    if opc == io_opc::WRITE {
                        q.stats.write_cmds.fetch_add(1, Relaxed);
                        q.stats.bytes_written.fetch_add(len as u64, Relaxed);
                    }
                    self.pool.put(done.buf);
                    self.respond(sqe.cid, Status::SUCCESS, 0, 0);
                }
            },
        }
        self.free_slot(i);
    }

    // ---- teardown

    async fn finish(mut self, end: End) {
        let graceful = matches!(end, End::Shutdown | End::Killed(_) | End::Disconnect);
        match &end {
            End::Fatal(e, offending) => {
                let mut b = [0u8; TERMREQ_HLEN + TERMREQ_MAX_DATA];
                let n = TermReq {
                    fes: e.fes as u16,
                    fei: e.fei,
                }
                .encode(PduType::C2HTermReq, offending, &mut b);
                self.out.push_bytes(&b[..n]);
            }
            End::HostTermReq | End::Eof | End::IoError => self.out.discard(&mut self.pool),
            _ => {}
        }
        // In-flight backend I/O finishes before the queue goes away, so that
        // shutdown never leaves a write half-issued behind an answer.
        while let Some((slot, done)) = self.inflight.next().await {
            if graceful {
                self.on_io_done(slot, done);
            } else {
                self.pool.put(done.buf);
                self.free_slot(slot);
            }
        }
        if !self.out.is_empty() {
            let _ = tokio::time::timeout(
                CLOSE_FLUSH_TIMEOUT,
                self.out.flush(&mut self.stream, &mut self.pool),
            )
            .await;
        }
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut self.stream).await;
        if let Some(q) = self.queue.take() {
            let reason = match end {
                End::Eof if q.ctrl.state.lock().shutdown_requested => FreeReason::HostDisconnected,
                End::Eof => FreeReason::ConnectionClosed,
                End::Disconnect => FreeReason::HostDisconnected,
                End::Killed(r) => r,
                End::KeepAlive(ms) => FreeReason::KeepAliveTimeout(ms),
                End::Shutdown => FreeReason::Shutdown,
                End::IoError | End::Fatal(..) | End::HostTermReq => FreeReason::ConnectionError,
            };
            if q.qid == 0 {
                self.target.remove_controller(&q.ctrl, reason);
            } else {
                fabrics::release_io_queue(&q.ctrl, q.qid);
            }
        }
    }
}

/// Calls `rw` for each Read or Write command among the whole PDUs at the
/// start of `rx`; returns how many bytes those PDUs take. Stops at the first
/// partial or implausible header: checking PDUs is `process_rx`'s job.
fn scan_io(rx: &[u8], mut rw: impl FnMut(&Sqe)) -> usize {
    let mut pos = 0;
    while let Some(b) = rx.get(pos..pos + CH_LEN + 64) {
        let plen = u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize;
        if plen < CH_LEN || plen > rx.len() - pos {
            break;
        }
        if b[0] == PduType::CapsuleCmd as u8
            && plen >= CH_LEN + 64
            && let Ok(sqe) = Sqe::decode(&b[CH_LEN..])
            && matches!(sqe.opcode, io_opc::READ | io_opc::WRITE)
        {
            rw(&sqe);
        }
        pos += plen;
    }
    pos
}

fn digest_ok(data: &[u8], digest: &[u8]) -> bool {
    digest.len() >= DIGEST_LEN
        && data_digest(data) == u32::from_le_bytes(digest[..4].try_into().expect("4 bytes"))
}

/// Reads the SGL of an NVMe/TCP command: in-capsule data or a transport data block.
fn check_sgl(sqe: &Sqe, in_capsule_len: usize, icd_limit: u32) -> Result<Sgl, Status> {
    if sqe.flags & PSDT_MASK == 0 {
        // PRPs have no meaning on a fabric.
        return Err(Status::generic(status::SC_INVALID_FIELD));
    }
    let d = sqe.sgl;
    match d.type_byte {
        SGL_DATA_BLOCK_OFFSET => {
            if d.addr != 0 || d.length > icd_limit {
                return Err(Status::generic(status::SC_SGL_INVALID_OFFSET));
            }
            if d.length as usize != in_capsule_len {
                return Err(Status::generic(status::SC_SGL_INVALID_DATA_LEN));
            }
            Ok(Sgl {
                len: d.length,
                in_capsule: true,
            })
        }
        SGL_TRANSPORT_DATA_BLOCK => {
            if in_capsule_len != 0 {
                return Err(Status::generic(status::SC_SGL_INVALID_DATA_LEN));
            }
            Ok(Sgl {
                len: d.length,
                in_capsule: false,
            })
        }
        _ if d.length == 0 && in_capsule_len == 0 => Ok(Sgl {
            len: 0,
            in_capsule: false,
        }),
        _ => Err(Status::generic(status::SC_SGL_INVALID_TYPE)),
    }
}

async fn wait_kill(rx: Option<&mut watch::Receiver<Option<FreeReason>>>) -> FreeReason {
    let Some(rx) = rx else {
        return std::future::pending().await;
    };
    loop {
        if let Some(r) = *rx.borrow_and_update() {
            return r;
        }
        if rx.changed().await.is_err() {
            return FreeReason::Shutdown;
        }
    }
}

async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

async fn notified(ctrl: Option<&Controller>) {
    match ctrl {
        Some(c) => c.event_notify.notified().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_wire::sqe::SglDesc;

    fn sqe_with(type_byte: u8, addr: u64, length: u32) -> Sqe {
        let mut s = Sqe::new(io_opc::WRITE, 1);
        s.sgl = SglDesc {
            addr,
            length,
            type_byte,
        };
        s
    }

    #[test]
    fn sgl_rules() {
        assert!(
            check_sgl(&sqe_with(SGL_DATA_BLOCK_OFFSET, 0, 512), 512, 8192)
                .unwrap()
                .in_capsule
        );
        let e = |s: Sqe, n| check_sgl(&s, n, 8192).unwrap_err().sc;
        assert_eq!(
            e(sqe_with(SGL_DATA_BLOCK_OFFSET, 4, 512), 512),
            status::SC_SGL_INVALID_OFFSET
        );
        assert_eq!(
            e(sqe_with(SGL_DATA_BLOCK_OFFSET, 0, 16384), 512),
            status::SC_SGL_INVALID_OFFSET
        );
        assert_eq!(
            e(sqe_with(SGL_DATA_BLOCK_OFFSET, 0, 1024), 512),
            status::SC_SGL_INVALID_DATA_LEN
        );
        assert_eq!(e(sqe_with(0x20, 0, 4096), 0), status::SC_SGL_INVALID_TYPE);
        assert_eq!(
            e(sqe_with(SGL_TRANSPORT_DATA_BLOCK, 0, 4096), 16),
            status::SC_SGL_INVALID_DATA_LEN
        );
        let mut prp = sqe_with(SGL_TRANSPORT_DATA_BLOCK, 0, 4096);
        prp.flags = 0;
        assert_eq!(
            check_sgl(&prp, 0, 8192).unwrap_err().sc,
            status::SC_INVALID_FIELD
        );
        assert_eq!(check_sgl(&sqe_with(0, 0, 0), 0, 8192).unwrap().len, 0);
    }

    /// A command capsule with `data` bytes of in-capsule data.
    fn capsule(opc: u8, slba: u64, data: usize) -> Vec<u8> {
        let mut s = Sqe::new(opc, 7);
        s.nsid = 1;
        s.cdw10 = slba as u32;
        s.cdw11 = (slba >> 32) as u32;
        s.cdw12 = 7;
        let mut b = vec![0u8; CH_LEN + 64 + data];
        CommonHeader {
            pdu_type: PduType::CapsuleCmd as u8,
            flags: 0,
            hlen: 72,
            pdo: if data > 0 { 72 } else { 0 },
            plen: b.len() as u32,
        }
        .encode(&mut b);
        b[CH_LEN..CH_LEN + 64].copy_from_slice(&s.encode());
        b
    }

    #[test]
    fn scan_io_sees_whole_read_and_write_capsules_only() {
        let scan = |rx: &[u8]| {
            let mut lbas = Vec::new();
            let n = scan_io(rx, |sqe| lbas.push((sqe.slba(), sqe.nlb())));
            (n, lbas)
        };
        let mut rx = capsule(io_opc::READ, 8, 0);
        rx.extend(capsule(io_opc::WRITE, 16, 4096));
        rx.extend(capsule(io_opc::FLUSH, 0, 0));
        rx.extend(capsule(io_opc::READ, 1 << 40, 0));
        let whole = rx.len();
        assert_eq!(scan(&rx), (whole, vec![(8, 8), (16, 8), (1 << 40, 8)]));
        // A partial PDU at the end stops the scan before it.
        rx.extend(&capsule(io_opc::READ, 24, 0)[..50]);
        assert_eq!(scan(&rx).0, whole);
        assert_eq!(scan(&rx[..whole - 1]).0, 72 + 72 + 4096 + 72);
        // Implausible lengths stop it too, without panicking.
        for plen in [0u32, 7, u32::MAX] {
            let mut bad = capsule(io_opc::READ, 8, 0);
            bad[4..8].copy_from_slice(&plen.to_le_bytes());
            assert_eq!(scan(&bad), (0, vec![]), "plen {plen}");
        }
        assert_eq!(scan(&[]).0, 0);
        assert_eq!(scan(&[0xFF; 71]).0, 0);
    }
}
