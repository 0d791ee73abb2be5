//! The task behind one queue: owns the socket, sends capsules and H2CData,
//! receives CapsuleResp, C2HData, R2T and C2HTermReq.
//!
//! Reads and writes are non-blocking and interleaved, so a connection with
//! much to send in both directions never deadlocks on full socket buffers.
//! Large read payloads go straight from the socket into the command's
//! buffer; everything else is parsed out of one receive buffer, many PDUs
//! per read.

use std::future::poll_fn;
use std::io::{ErrorKind, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use blockdev::AlignedBuf;
use nvme_tls::Stream;
use nvme_wire::digest::{DIGEST_LEN, DataDigest, data_digest_trailer};
use nvme_wire::pdu::{
    Fes, H2CDataHdr, PDU_HDR_MAX, PduType, R2THdr, TERMREQ_HLEN, TERMREQ_MAX_DATA, TermReq,
    encode_capsule_cmd,
};
use nvme_wire::sqe::{SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK, SglDesc};
use tokio::time::Sleep;

use crate::error::HostError;
use crate::out::{DataSource, MAX_IOVECS, Out};
use crate::slot::{DataDir, Outcome, Shared, Slot, Submission};

mod rx;

/// Receive buffer: room for a burst of small responses and 4 KiB read PDUs.
const RX_LEN: usize = 256 * 1024;
/// Payload bytes left at which we read straight into the command's buffer.
const DIRECT_MIN: usize = 16 * 1024;
/// Reads per turn before letting the callers on this thread run.
const READ_BUDGET: usize = 16;
/// How long a closing connection tries to send what it still has queued.
const CLOSE_FLUSH: Duration = Duration::from_secs(1);

/// A command in flight, owned by the connection task.
struct Inflight {
    opcode: u8,
    fabrics_type: Option<u8>,
    dir: DataDir,
    buf: AlignedBuf,
    /// C2HData bytes received so far.
    received: usize,
    /// Data segments of this command still queued for sending.
    out_refs: u32,
    at: Instant,
    /// A data digest error seen on its read data.
    data_error: Option<HostError>,
}

/// Receiving a C2HData payload.
struct DataRx {
    cid: u16,
    /// Padding between header and data still to skip.
    skip: usize,
    /// Where the next payload byte goes in the command's buffer.
    off: usize,
    left: usize,
    datal: usize,
    digest: Option<DataDigest>,
    dgst: [u8; DIGEST_LEN],
    dgst_left: usize,
    success: bool,
}

/// Why the connection ends, and what to tell the target first.
struct Fatal {
    err: HostError,
    /// H2CTermReq: FES, FEI and the offending header.
    term: Option<(Fes, u32, Vec<u8>)>,
}

impl From<HostError> for Fatal {
    fn from(err: HostError) -> Self {
        Fatal { err, term: None }
    }
}

enum Turn {
    Idle,
    Progress,
    Closing,
}

/// In-flight commands by command id; the data source of the out queue.
struct Table {
    cmds: Vec<Option<Inflight>>,
    count: usize,
}

impl DataSource for Table {
    fn data(&self, cid: u16) -> &[u8] {
        self.cmds[usize::from(cid)]
            .as_ref()
            .map_or(&[], |f| &f.buf[..])
    }
    fn sent(&mut self, cid: u16) {
        if let Some(f) = self.cmds[usize::from(cid)].as_mut() {
            f.out_refs = f.out_refs.saturating_sub(1);
        }
    }
}

pub(crate) struct Conn {
    sh: Arc<Shared>,
    stream: Stream,
    table: Table,
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    rx_data: Option<DataRx>,
    out: Out,
    batch: Vec<Submission>,
    done: Vec<(u16, Outcome, AlignedBuf)>,
    wakers: Vec<Waker>,
    tick: Pin<Box<Sleep>>,
    tick_armed: bool,
    tick_every: Duration,
    /// Adaptive polling: when the socket last delivered data or we last sent.
    last_busy: Instant,
}

impl Conn {
    pub fn new(sh: Arc<Shared>, stream: Stream) -> Self {
        let depth = usize::from(sh.p.depth);
        let tick_every =
            (sh.p.timeout / 8).clamp(Duration::from_millis(10), Duration::from_secs(1));
        Conn {
            table: Table {
                cmds: (0..depth).map(|_| None).collect(),
                count: 0,
            },
            rx: vec![0u8; RX_LEN].into_boxed_slice(),
            rx_start: 0,
            rx_end: 0,
            rx_data: None,
            out: if sh.p.pdu_per_write {
                Out::one_pdu_per_write()
            } else {
                Out::default()
            },
            batch: Vec::with_capacity(depth),
            done: Vec::with_capacity(depth),
            wakers: Vec::with_capacity(depth),
            tick: Box::pin(tokio::time::sleep(tick_every)),
            tick_armed: false,
            tick_every,
            last_busy: Instant::now(),
            sh,
            stream,
        }
    }

    pub async fn run(mut self) {
        let end = loop {
            match self.turn() {
                Err(f) => break Some(f),
                Ok(Turn::Closing) => break None,
                Ok(Turn::Progress) => {
                    if !self.sh.p.poll.is_zero() {
                        self.last_busy = Instant::now();
                    }
                    yield_once().await
                }
                // Adaptive polling: with commands in flight and recent activity, let the
                // runtime poll the sockets without sleeping (yield_now defers to the
                // driver) rather than park the thread and pay for the wake-up.
                Ok(Turn::Idle)
                    if self.table.count > 0 && self.last_busy.elapsed() < self.sh.p.poll =>
                {
                    tokio::task::yield_now().await
                }
                Ok(Turn::Idle) => poll_fn(|cx| self.poll_wait(cx)).await,
            }
        };
        self.finish(end).await;
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.sh.p.addr
    }

    fn protocol(&self, msg: String, fes: Fes, fei: u32, hdr: &[u8]) -> Fatal {
        Fatal {
            err: HostError::Protocol {
                addr: self.addr(),
                msg,
            },
            term: Some((fes, fei, hdr[..hdr.len().min(TERMREQ_MAX_DATA)].to_vec())),
        }
    }

    fn lost(&self, e: std::io::Error) -> Fatal {
        HostError::ConnectionLost {
            addr: self.addr(),
            msg: e.to_string(),
        }
        .into()
    }

    /// One pass: queue new commands, write, read and parse, publish completions.
    fn turn(&mut self) -> Result<Turn, Fatal> {
        let mut batch = std::mem::take(&mut self.batch);
        let closing = {
            let mut st = self.sh.state.lock();
            std::mem::swap(&mut st.pending, &mut batch);
            st.closing
        };
        let mut progress = !batch.is_empty();
        for s in batch.drain(..) {
            self.encode_cmd(s);
        }
        self.batch = batch;
        if closing {
            return Ok(Turn::Closing);
        }
        progress |= self.write_some()?;
        progress |= self.read_some()?;
        if self.tick_armed
            && self
                .tick
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_ready()
        {
            self.tick_armed = false;
            self.check_timeouts()?;
        }
        self.publish();
        Ok(if progress { Turn::Progress } else { Turn::Idle })
    }

    /// Ready when there is something to do: new commands, socket readiness, a timer tick.
    fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        {
            let mut st = self.sh.state.lock();
            if !st.pending.is_empty() || st.closing {
                return Poll::Ready(());
            }
            if !st
                .conn_waker
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                st.conn_waker = Some(cx.waker().clone());
            }
        }
        let mut ready = self.stream.poll_read_ready(cx).is_ready();
        if !self.out.is_empty() {
            ready |= self.stream.poll_write_ready(cx).is_ready();
        }
        if self.table.count > 0 {
            if !self.tick_armed {
                self.tick
                    .as_mut()
                    .reset(tokio::time::Instant::now() + self.tick_every);
                self.tick_armed = true;
            }
            ready |= self.tick.as_mut().poll(cx).is_ready();
        }
        if ready {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    // ---- sending

    fn encode_cmd(&mut self, s: Submission) {
        let neg = self.sh.neg;
        let dm = neg.digests();
        let len = s.buf.len();
        let mut sqe = s.sqe;
        let in_capsule = s.dir == DataDir::InCapsule && len > 0;
        sqe.sgl = SglDesc {
            addr: 0,
            length: if s.dir == DataDir::None {
                0
            } else {
                len as u32
            },
            type_byte: if in_capsule {
                SGL_DATA_BLOCK_OFFSET
            } else {
                SGL_TRANSPORT_DATA_BLOCK
            },
        };
        let icd_len = if in_capsule { len as u32 } else { 0 };
        let mut b = [0u8; PDU_HDR_MAX];
        let n = encode_capsule_cmd(&sqe.encode(), icd_len, dm, neg.cpda, &mut b);
        let digest = (in_capsule && dm.data).then(|| data_digest_trailer(&s.buf));
        let fabrics_type = sqe.is_fabrics().then(|| sqe.fctype());
        self.table.cmds[usize::from(s.cid)] = Some(Inflight {
            opcode: sqe.opcode,
            fabrics_type,
            dir: s.dir,
            buf: s.buf,
            received: 0,
            out_refs: u32::from(in_capsule),
            at: s.at,
            data_error: None,
        });
        self.table.count += 1;
        self.out.begin_pdu();
        self.out.push_small(&b[..n]);
        if in_capsule {
            self.out.push_data(s.cid, 0, len);
            if let Some(d) = digest {
                self.out.push_small(&d);
            }
        }
    }

    fn write_some(&mut self) -> Result<bool, Fatal> {
        let mut progress = false;
        while !self.out.is_empty() {
            let r = {
                let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
                let n = self.out.fill_iov(&self.table, &mut iov);
                self.stream.try_write_vectored(&iov[..n])
            };
            match r {
                Ok(0) => return Err(self.lost(ErrorKind::WriteZero.into())),
                Ok(n) => {
                    self.out.consume(n, &mut self.table);
                    progress = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.lost(e)),
            }
        }
        Ok(progress)
    }

    /// Queues H2CData PDUs for bytes `r2to..r2to + r2tl` of a write, each at most MAXH2CDATA.
    fn on_r2t(&mut self, r: R2THdr, hdr: &[u8]) -> Result<(), Fatal> {
        let neg = self.sh.neg;
        let Some(f) = self
            .table
            .cmds
            .get_mut(usize::from(r.cccid))
            .and_then(Option::as_mut)
        else {
            return Err(self.protocol(
                format!("R2T for command id {}, which is not outstanding", r.cccid),
                Fes::InvalidHeaderField,
                8,
                hdr,
            ));
        };
        let len = f.buf.len();
        let end = u64::from(r.r2to) + u64::from(r.r2tl);
        if f.dir != DataDir::FromHost || r.r2tl == 0 || end > len as u64 {
            let msg = format!(
                "R2T for command id {} asks for bytes {}..{end}, but the command sends {} bytes{}",
                r.cccid,
                r.r2to,
                if f.dir == DataDir::FromHost { len } else { 0 },
                if f.dir == DataDir::InCapsule {
                    " (all in the capsule)"
                } else {
                    ""
                }
            );
            return Err(self.protocol(msg, Fes::DataTransferOutOfRange, 12, hdr));
        }
        let dm = neg.digests();
        let mut off = r.r2to as usize;
        let end = end as usize;
        while off < end {
            let n = (end - off).min(neg.maxh2cdata as usize);
            let mut b = [0u8; PDU_HDR_MAX];
            let pdo = H2CDataHdr {
                cccid: r.cccid,
                ttag: r.ttag,
                datao: off as u32,
                datal: n as u32,
            }
            .encode_pdu(off + n == end, dm, neg.cpda, &mut b);
            self.out.begin_pdu();
            self.out.push_small(&b[..pdo]);
            self.out.push_data(r.cccid, off, off + n);
            f.out_refs += 1;
            if dm.data {
                self.out
                    .push_small(&data_digest_trailer(&f.buf[off..off + n]));
            }
            off += n;
        }
        Ok(())
    }

    fn complete(&mut self, cid: u16, outcome: Outcome) {
        if let Some(f) = self.table.cmds[usize::from(cid)].take() {
            self.table.count -= 1;
            self.done.push((cid, outcome, f.buf));
        }
    }

    /// Hands finished commands to their callers: one lock, then the wake-ups.
    fn publish(&mut self) {
        if self.done.is_empty() {
            return;
        }
        let mut freed = 0;
        {
            let mut st = self.sh.state.lock();
            for (cid, outcome, buf) in self.done.drain(..) {
                let i = usize::from(cid);
                match std::mem::replace(&mut st.slots[i], Slot::Free) {
                    Slot::Waiting(w) => {
                        st.slots[i] = Slot::Done(outcome, buf);
                        if let Some(w) = w {
                            self.wakers.push(w);
                        }
                    }
                    Slot::Abandoned => {
                        st.free.push(cid);
                        freed += 1;
                    }
                    other => st.slots[i] = other,
                }
            }
        }
        if freed > 0 {
            self.sh.permits.add_permits(freed);
        }
        for w in self.wakers.drain(..) {
            w.wake();
        }
    }

    fn check_timeouts(&mut self) -> Result<(), Fatal> {
        let now = Instant::now();
        let limit = self.sh.p.timeout;
        let late = self
            .table
            .cmds
            .iter()
            .enumerate()
            .filter_map(|(cid, f)| f.as_ref().map(|f| (cid, f)))
            .find(|(_, f)| now.duration_since(f.at) > limit);
        if let Some((cid, f)) = late {
            return Err(HostError::Timeout {
                addr: self.addr(),
                what: format!(
                    "{} (command id {cid}) on queue {}",
                    command_name(self.sh.p.qid, f.opcode, f.fabrics_type),
                    self.sh.p.qid
                ),
                after: limit,
            }
            .into());
        }
        Ok(())
    }

    // ---- the end

    async fn finish(mut self, fatal: Option<Fatal>) {
        let err = match fatal {
            None => self.sh.closed_error("closed by the host"),
            Some(f) => {
                tracing::warn!("queue {} to {}: {}", self.sh.p.qid, self.addr(), f.err);
                self.out.clear();
                if let Some((fes, fei, hdr)) = &f.term {
                    let mut b = [0u8; TERMREQ_HLEN + TERMREQ_MAX_DATA];
                    let n = TermReq {
                        fes: *fes as u16,
                        fei: *fei,
                    }
                    .encode(PduType::H2CTermReq, hdr, &mut b);
                    self.out.begin_pdu();
                    self.out.push_small(&b[..n.min(TERMREQ_HLEN)]);
                    if n > TERMREQ_HLEN {
                        // The offending header may exceed one inline segment.
                        for c in b[TERMREQ_HLEN..n].chunks(128) {
                            self.out.push_small(c);
                        }
                    }
                }
                f.err
            }
        };
        let pending = {
            let mut st = self.sh.state.lock();
            st.dead = Some(err.clone());
            std::mem::take(&mut st.pending)
        };
        self.sh.permits.close();
        // What is queued still goes out (on a fatal error: only the TermReq).
        let deadline = tokio::time::Instant::now() + CLOSE_FLUSH;
        while !self.out.is_empty() {
            match tokio::time::timeout_at(deadline, self.stream.writable()).await {
                Ok(Ok(())) => {
                    if self.write_some().is_err() {
                        break;
                    }
                }
                _ => break,
            }
        }
        for s in pending {
            self.done.push((s.cid, Err(err.clone()), s.buf));
        }
        for cid in 0..self.table.cmds.len() {
            if let Some(f) = self.table.cmds[cid].take() {
                self.done.push((cid as u16, Err(err.clone()), f.buf));
            }
        }
        self.table.count = 0;
        self.publish();
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut self.stream).await;
    }
}

/// Returns Pending once after waking itself: lets the tasks we just woke run first.
async fn yield_once() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

fn pdu_name(t: PduType) -> &'static str {
    match t {
        PduType::CapsuleResp => "CapsuleResp",
        PduType::C2HData => "C2HData",
        PduType::R2T => "R2T",
        _ => "other",
    }
}

/// A command's name for messages.
pub(crate) fn command_name(qid: u16, opcode: u8, fctype: Option<u8>) -> &'static str {
    use nvme_wire::fabrics::fctype as f;
    use nvme_wire::sqe::{admin_opc as a, io_opc as io};
    if let Some(t) = fctype {
        return match t {
            f::CONNECT => "Connect",
            f::PROPERTY_GET => "Property Get",
            f::PROPERTY_SET => "Property Set",
            f::DISCONNECT => "Disconnect",
            _ => "Fabrics command",
        };
    }
    if qid == 0 {
        match opcode {
            a::GET_LOG_PAGE => "Get Log Page",
            a::IDENTIFY => "Identify",
            a::SET_FEATURES => "Set Features",
            a::GET_FEATURES => "Get Features",
            a::KEEP_ALIVE => "Keep Alive",
            a::ASYNC_EVENT_REQUEST => "Async Event Request",
            _ => "admin command",
        }
    } else {
        match opcode {
            io::READ => "Read",
            io::WRITE => "Write",
            io::FLUSH => "Flush",
            io::WRITE_ZEROES => "Write Zeroes",
            io::DATASET_MANAGEMENT => "Dataset Management",
            io::RESV_REGISTER => "Reservation Register",
            io::RESV_REPORT => "Reservation Report",
            io::RESV_ACQUIRE => "Reservation Acquire",
            io::RESV_RELEASE => "Reservation Release",
            _ => "I/O command",
        }
    }
}
