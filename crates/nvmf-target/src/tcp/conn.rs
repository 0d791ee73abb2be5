//! One NVMe/TCP connection = one queue pair, owned by one reactor task.
//!
//! This file only moves bytes: PDU framing and checks, digests, R2T and
//! H2CData tracking, C2HData, and socket I/O. What a command means, and
//! every NVMe status, is decided by the transport-free [`QueueCore`].
//!
//! Receive: many PDUs per read into `rx`; each header is checked before its
//! body is awaited. Send: responses are coalesced in `out` and written once
//! per loop turn.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use nvme_tls::{Stream, TlsAcceptor};
use nvme_wire::digest::{DIGEST_LEN, crc32c, data_digest};
use nvme_wire::pdu::{
    CH_LEN, CommonHeader, Fes, H2CDataHdr, ICREQ_OFF_HPDA, ICREQ_OFF_PFV, ICReq, ICResp, PduType,
    TERMREQ_HLEN, TERMREQ_MAX_DATA, TermReq,
};
use nvme_wire::sqe::{Sqe, io_opc};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::io::TcpIo;
use super::out::OutQueue;
use super::pdu_check::{Negotiated, PduLayout, TermError, check_header};
use super::poll::Poller;
use super::r2t::R2tTable;
use crate::Target;
use crate::config::{ADMIN_IN_CAPSULE_DATA, TlsMode};
use crate::controller::{Controller, FreeReason};
use crate::queue::QueueCore;

/// How long a closing connection waits to send its last PDUs.
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// H2CData payloads at least this large skip the receive buffer.
const DIRECT_RX_MIN: usize = 16 * 1024;

/// Where the rest of an H2CData payload goes: tag `tag`'s buffer at `off`.
#[derive(Debug, Clone, Copy)]
struct DirectRx {
    tag: u16,
    off: usize,
    remaining: usize,
    datal: u32,
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
    AuthTimeout(u32),
    Shutdown,
}

pub(crate) struct Conn {
    target: Arc<Target>,
    stream: Stream,
    peer: String,
    core: QueueCore,
    io: TcpIo,
    /// A fatal transport error or a host TermReq ends the connection.
    end: Option<End>,
    /// Set once the core is bound to a controller: its teardown signal.
    kill: Option<Signal<FreeReason>>,
    /// A large H2CData payload being read straight into its command's buffer.
    direct: Option<DirectRx>,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    /// Whole PDUs in `rx` before this offset went through `hint_io`.
    rx_hinted: usize,
    /// Adaptive polling.
    poll: Poller,
}

pub(crate) async fn serve(
    tcp: TcpStream,
    mode: TlsMode,
    tls: Option<TlsAcceptor>,
    target: Arc<Target>,
    shutdown: watch::Receiver<bool>,
) {
    let peer = tcp
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let counters = target.clone();
    counters.counters.connections_opened.fetch_add(1, Relaxed);
    let opened = tokio::select! {
        o = super::secure::open(tcp, mode, tls.as_ref(), &target, &peer) => o,
        _ = wait_shutdown(shutdown.clone()) => None,
    };
    let Some((stream, identity)) = opened else {
        counters.counters.connections_closed.fetch_add(1, Relaxed);
        return;
    };
    let mut conn = Conn::new(stream, target, peer);
    if let Some(id) = identity {
        conn.core.set_tls(id);
    }
    let end = conn.run(shutdown).await;
    conn.finish(end).await;
    counters.counters.connections_closed.fetch_add(1, Relaxed);
}

impl Conn {
    fn new(stream: Stream, target: Arc<Target>, peer: String) -> Self {
        let t = &target.transport;
        let max_data = t
            .max_h2c_data
            .max(t.in_capsule_data)
            .max(ADMIN_IN_CAPSULE_DATA) as usize;
        let rx_len = (2 * (max_data + 512)).max(128 * 1024);
        let local_ip = stream.local_addr().ok().map(|a| a.ip());
        let core = QueueCore::new(target.clone(), peer.clone(), local_ip);
        let io = TcpIo {
            neg: Negotiated {
                ic_done: false,
                hdgst: false,
                ddgst: false,
                max_capsule_data: core.in_capsule_limit(),
                maxh2cdata: t.max_h2c_data,
            },
            hpda: 0,
            out: OutQueue::new(),
            r2t: R2tTable::new(core.slot_count()),
            inflight: FuturesUnordered::new(),
            disconnected: false,
        };
        Conn {
            core,
            io,
            end: None,
            kill: None,
            direct: None,
            rx: vec![0; rx_len],
            rx_start: 0,
            rx_end: 0,
            rx_hinted: 0,
            poll: Poller::new(t.poll_us),
            target,
            stream,
            peer,
        }
    }

    async fn run(&mut self, shutdown: watch::Receiver<bool>) -> End {
        // Made once, not at each turn: a new watch future per turn registers
        // with (and leaves) the sender's waiter list, under its lock.
        let stop = shutdown.clone();
        let mut shutdown: Signal<()> = Box::pin(wait_shutdown(shutdown));
        loop {
            if !self.io.out.is_empty() {
                if let Some(end) = self.flush_watching(&mut shutdown).await {
                    return end;
                }
                // The poll window runs from our last answer, not from the data
                // that started the batch: a batch of 32 reads takes about as long
                // as the window, and the host's next commands follow our answers.
                if self.poll.enabled() {
                    self.poll.last_busy = Instant::now();
                }
            }
            if let Some(end) = self.end.take() {
                return end;
            }
            if self.io.disconnected {
                return End::Disconnect;
            }
            if *stop.borrow() {
                return End::Shutdown;
            }
            if self.rx.len() - self.rx_end < 4096 {
                self.compact_rx();
            }
            let ka = match (self.core.keep_alive_wait(), self.core.auth_wait()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let events = if self.core.holds_aers() {
                self.core.controller().cloned()
            } else {
                None
            };
            // Adaptive polling: right after activity, keep yielding to the
            // runtime (which polls the sockets without sleeping) instead of
            // parking the thread, for the window and while spins pay (poll.rs).
            let spin = self.poll.spin();
            let dst: &mut [u8] = match self.direct {
                Some(d) => &mut self.io.r2t.buf_mut(d.tag)[d.off..d.off + d.remaining],
                None => &mut self.rx[self.rx_end..],
            };
            tokio::select! {
                biased;
                _ = shutdown.as_mut() => return End::Shutdown,
                r = signalled(self.kill.as_mut()) => return End::Killed(r),
                Some((tag, done)) = self.io.inflight.next(), if !self.io.inflight.is_empty() => {
                    self.poll.last_busy = self.core.tick();
                    self.core.on_io_done(tag, done, &mut self.io);
                    // Complete whatever else is ready without another wake-up.
                    while let Some(Some((tag, done))) = futures_util::FutureExt::now_or_never(self.io.inflight.next()) {
                        self.core.on_io_done(tag, done, &mut self.io);
                    }
                }
                r = self.stream.read(dst) => match r {
                    Ok(0) => return End::Eof,
                    Ok(n) => {
                        let now = self.core.tick();
                        self.poll.host_sent(now, self.io.inflight.is_empty());
                        match self.direct.as_mut() {
                            Some(d) => {
                                d.off += n;
                                d.remaining -= n;
                                if d.remaining == 0 {
                                    let d = self.direct.take().expect("direct receive");
                                    self.h2c_received(d.tag, d.datal, false);
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
                    if let Some(kato) = self.core.keep_alive_expired() {
                        return End::KeepAlive(kato);
                    }
                    if let Some(ms) = self.core.auth_expired() {
                        return End::AuthTimeout(ms);
                    }
                }
                _ = notified(events.as_deref()) => self.core.on_events(&mut self.io),
                _ = tokio::task::yield_now(), if spin => {}
            }
        }
    }

    /// Sends queued PDUs. A host that stops reading must not pin the
    /// connection: shutdown, controller teardown and keep-alive still apply,
    /// and device completions are still taken in. Returns how the connection
    /// ends, or None to carry on (the queue may still hold bytes if the
    /// keep-alive timer woke us first).
    async fn flush_watching(&mut self, shutdown: &mut Signal<()>) -> Option<End> {
        loop {
            let ka = self.core.keep_alive_wait();
            let (out, pool) = (&mut self.io.out, self.core.pool());
            let inflight = &mut self.io.inflight;
            // Device I/O keeps completing while the host does not read: the
            // write counters a Preempt and Abort waits on must move.
            let done = tokio::select! {
                biased;
                r = out.flush(&mut self.stream, pool) => return r.err().map(|_| End::IoError),
                _ = shutdown.as_mut() => return Some(End::Shutdown),
                r = signalled(self.kill.as_mut()) => return Some(End::Killed(r)),
                _ = sleep_opt(ka) => return self.core.keep_alive_expired().map(End::KeepAlive),
                Some(done) = inflight.next(), if !inflight.is_empty() => done,
            };
            // Its answer joins the queue being flushed.
            self.core.tick();
            self.core.on_io_done(done.0, done.1, &mut self.io);
        }
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
        if self.core.qid().is_none_or(|q| q == 0) {
            return;
        }
        let from = self.rx_hinted.max(self.rx_start);
        let core = &self.core;
        let seen = scan_io(&self.rx[from..self.rx_end], |sqe| core.prefetch(sqe));
        self.rx_hinted = from + seen;
    }

    fn process_rx(&mut self) {
        self.hint_io();
        while self.end.is_none() && !self.io.disconnected {
            let avail = self.rx_end - self.rx_start;
            if avail < CH_LEN {
                break;
            }
            let head = &self.rx[self.rx_start..self.rx_end];
            let ch = CommonHeader::decode(head).expect("8 bytes available");
            let layout = match check_header(&ch, &self.io.neg) {
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
            self.on_pdu(&layout, &rx[start..start + layout.plen]);
            self.rx = rx;
        }
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
            self.rx_hinted = 0;
        }
        self.core.note_traffic();
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
            && let Some((tag, h)) = self.h2c_check(l, &pdu[..l.hlen])
        {
            let have = avail - l.data_off;
            let off = h.datao as usize;
            self.io.r2t.buf_mut(tag)[off..off + have].copy_from_slice(&pdu[l.data_off..]);
            self.direct = Some(DirectRx {
                tag,
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
        let c = &self.target.counters;
        c.protocol_errors.fetch_add(1, Relaxed);
        if e.fes == Fes::HeaderDigestError {
            c.header_digest_errors.fetch_add(1, Relaxed);
        }
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

    fn on_pdu(&mut self, l: &PduLayout, pdu: &[u8]) {
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
            PduType::CapsuleCmd => self.on_capsule(l, pdu),
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
        let neg = &mut self.io.neg;
        neg.hdgst = req.dgst & 1 != 0 && t.header_digest;
        neg.ddgst = req.dgst & 2 != 0 && t.data_digest;
        neg.ic_done = true;
        self.io.hpda = req.hpda;
        let resp = ICResp {
            pfv: 0,
            cpda: 0,
            dgst: u8::from(neg.hdgst) | (u8::from(neg.ddgst) << 1),
            maxh2cdata: t.max_h2c_data,
        };
        self.io.out.push_bytes(&resp.encode());
    }

    fn on_capsule(&mut self, l: &PduLayout, pdu: &[u8]) {
        let sqe = Sqe::decode(&pdu[CH_LEN..CH_LEN + 64]).expect("72-byte header");
        let data = &pdu[l.data_off..l.data_off + l.data_len];
        let digest_ok = !l.dd || digest_ok(data, &pdu[l.data_off + l.data_len..]);
        self.core.on_command(&sqe, data, digest_ok, &mut self.io);
        self.note_connected();
    }

    /// Once the core is bound by a Connect (whose data may have come in the
    /// capsule or after an R2T): watch its controller's teardown, and bound
    /// later capsules by this queue's IOCCSZ.
    fn note_connected(&mut self) {
        if self.kill.is_none()
            && let Some(c) = self.core.controller()
        {
            self.kill = Some(Box::pin(wait_kill(c.watch_kill())));
            self.io.neg.max_capsule_data = self.core.in_capsule_limit();
        }
    }

    // ---- host data: R2T/H2CData

    /// Checks an H2CData header against the R2T it answers. Returns the
    /// tag and the header, or None after queuing a fatal error.
    fn h2c_check(&mut self, l: &PduLayout, hdr: &[u8]) -> Option<(u16, H2CDataHdr)> {
        let h = H2CDataHdr::decode(hdr).expect("24-byte header");
        match self.io.r2t.check(&h, l.data_len, self.io.neg.maxh2cdata) {
            Ok(()) => Some((h.ttag, h)),
            Err((fes, fei)) => {
                self.fatal(TermError::new(fes, fei), hdr[..l.hlen].to_vec());
                None
            }
        }
    }

    fn on_h2c_data(&mut self, l: &PduLayout, pdu: &[u8]) {
        let Some((tag, h)) = self.h2c_check(l, &pdu[..l.hlen]) else {
            return;
        };
        let data = &pdu[l.data_off..l.data_off + l.data_len];
        let bad_digest = l.dd && !digest_ok(data, &pdu[l.data_off + l.data_len..]);
        let off = h.datao as usize;
        self.io.r2t.buf_mut(tag)[off..off + data.len()].copy_from_slice(data);
        self.h2c_received(tag, h.datal, bad_digest);
    }

    /// `datal` more bytes of tag `tag`'s data are in its buffer; once all
    /// are, they go to the core.
    fn h2c_received(&mut self, tag: u16, datal: u32, bad_digest: bool) {
        if let Some((buf, digest_ok)) = self.io.r2t.received(tag, datal, bad_digest) {
            self.core.on_data(tag, buf, digest_ok, &mut self.io);
            self.note_connected();
        }
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
                self.io.out.push_bytes(&b[..n]);
            }
            End::HostTermReq | End::Eof | End::IoError => self.io.out.discard(self.core.pool()),
            _ => {}
        }
        // In-flight backend I/O finishes before the queue goes away, so that
        // shutdown never leaves a write half-issued behind an answer; what
        // QoS still holds has not started and ends at once, unrun.
        self.core.abandon_held();
        while let Some((tag, done)) = self.io.inflight.next().await {
            if graceful {
                self.core.tick();
                self.core.on_io_done(tag, done, &mut self.io);
            } else {
                self.core.discard_io(tag, done);
            }
        }
        if !self.io.out.is_empty() {
            let _ = tokio::time::timeout(
                CLOSE_FLUSH_TIMEOUT,
                self.io.out.flush(&mut self.stream, self.core.pool()),
            )
            .await;
        }
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut self.stream).await;
        let reason = match end {
            End::Eof => self.core.eof_reason(),
            End::Disconnect => FreeReason::HostDisconnected,
            End::Killed(r) => r,
            End::KeepAlive(ms) => FreeReason::KeepAliveTimeout(ms),
            End::AuthTimeout(ms) => FreeReason::AuthTimeout(ms),
            End::Shutdown => FreeReason::Shutdown,
            End::IoError | End::Fatal(..) | End::HostTermReq => FreeReason::ConnectionError,
        };
        self.core.close(reason);
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

/// Resolves once the target shuts down.
async fn wait_shutdown(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|&s| s).await;
}

/// A signal a connection waits on at every turn, made once.
type Signal<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Resolves when `s` does; never without one.
async fn signalled<T>(s: Option<&mut Signal<T>>) -> T {
    match s {
        Some(s) => s.as_mut().await,
        None => std::future::pending().await,
    }
}

async fn wait_kill(mut rx: watch::Receiver<Option<FreeReason>>) -> FreeReason {
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
