//! One NVMe/TCP queue pair = one TCP connection, driven by one task.
//!
//! Callers hand a command (SQE + owned data buffer) to the queue and await its
//! completion; the connection task owns the socket, batches what callers
//! queued into vectored writes, reads many PDUs per read, and demultiplexes
//! responses by command id. The only shared state is a short mutex-guarded
//! table (never held across an await) and a semaphore that bounds the
//! commands in flight to the queue depth.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use blockdev::AlignedBuf;
use nvme_tls::Stream;
use nvme_wire::pdu::{
    CH_LEN, CommonHeader, ICRESP_LEN, ICReq, ICResp, PduType, TERMREQ_HLEN, TERMREQ_MAX_DATA,
    TermReq,
};
use nvme_wire::sqe::Sqe;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::conn::Conn;
use crate::error::{HostError, Result};
use crate::slot::{DataDir, Negotiated, Outcome, QueueParams, Shared, Slot, State, Submission};

/// A connected queue pair. Dropping it closes the connection.
pub(crate) struct Queue {
    shared: Arc<Shared>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Queue {
    /// Opens the TCP connection and exchanges ICReq/ICResp. The connection
    /// task runs on the runtime this is called from.
    pub async fn connect(p: QueueParams) -> Result<Queue> {
        let addr = p.addr;
        let stream = match tokio::time::timeout(p.timeout, TcpStream::connect(addr)).await {
            Err(_) => {
                return Err(HostError::Timeout {
                    addr,
                    what: "TCP connect".into(),
                    after: p.timeout,
                });
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Err(HostError::Refused { addr });
            }
            Ok(Err(e)) => {
                return Err(HostError::Connect {
                    addr,
                    msg: e.to_string(),
                });
            }
            Ok(Ok(s)) => s,
        };
        let _ = stream.set_nodelay(true);
        let mut stream = match &p.tls {
            None => Stream::Plain(stream),
            Some(t) => {
                let psk = nvme_tls::ClientPsk::new(&t.key, &t.hostnqn, &t.subnqn, t.version);
                nvme_tls::connect(stream, psk, p.timeout)
                    .await
                    .map_err(|e| HostError::Tls {
                        addr,
                        msg: e.to_string(),
                    })?
            }
        };
        let want = u8::from(p.hdr_digest) | (u8::from(p.data_digest) << 1);
        let neg = match tokio::time::timeout(p.timeout, initialize(&mut stream, addr, want)).await {
            Err(_) => {
                return Err(HostError::Timeout {
                    addr,
                    what: "ICReq (connection initialization)".into(),
                    after: p.timeout,
                });
            }
            Ok(r) => r?,
        };
        let depth = p.depth.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pending: Vec::with_capacity(usize::from(depth)),
                slots: (0..depth).map(|_| Slot::Free).collect(),
                free: (0..depth).rev().collect(),
                conn_waker: None,
                closing: false,
                dead: None,
            }),
            permits: Semaphore::new(usize::from(depth)),
            neg,
            p: QueueParams { depth, ..p },
        });
        let conn = Conn::new(shared.clone(), stream);
        let task = tokio::spawn(conn.run());
        Ok(Queue {
            shared,
            task: Mutex::new(Some(task)),
        })
    }

    pub fn params(&self) -> &QueueParams {
        &self.shared.p
    }

    pub fn negotiated(&self) -> Negotiated {
        self.shared.neg
    }

    /// Sends one command and waits for its completion. The buffer comes back
    /// whatever happened. Errors are transport errors; a failed status is in
    /// the `Response`.
    pub async fn execute(
        &self,
        mut sqe: Sqe,
        dir: DataDir,
        buf: AlignedBuf,
    ) -> (AlignedBuf, Outcome) {
        let sh = &*self.shared;
        match sh.permits.acquire().await {
            Ok(p) => p.forget(),
            Err(_) => {
                let e = sh.state.lock().dead.clone();
                return (
                    buf,
                    Err(e.unwrap_or_else(|| sh.closed_error("connection closed"))),
                );
            }
        }
        let dir = match dir {
            DataDir::FromHost if buf.len() <= sh.p.icd_limit as usize => DataDir::InCapsule,
            d => d,
        };
        let (cid, waker) = {
            let mut st = sh.state.lock();
            if let Some(e) = &st.dead {
                let e = e.clone();
                drop(st);
                sh.permits.add_permits(1);
                return (buf, Err(e));
            }
            if st.closing {
                drop(st);
                sh.permits.add_permits(1);
                return (buf, Err(sh.closed_error("closed by the host")));
            }
            let cid = st
                .free
                .pop()
                .expect("a permit guarantees a free command id");
            sqe.cid = cid;
            st.slots[usize::from(cid)] = Slot::Waiting(None);
            st.pending.push(Submission {
                cid,
                sqe,
                dir,
                buf,
                at: Instant::now(),
            });
            (cid, st.conn_waker.take())
        };
        if let Some(w) = waker {
            w.wake();
        }
        Wait {
            shared: sh,
            cid,
            done: false,
        }
        .await
    }

    /// Asks the connection task to stop; commands in flight fail.
    pub fn close(&self) {
        self.shared.state.lock().closing = true;
        self.shared.wake_conn();
    }

    /// Closes and waits until the connection is shut down.
    pub async fn close_and_wait(&self) {
        self.close();
        let task = self.task.lock().take();
        if let Some(t) = task {
            let _ = t.await;
        }
    }

    /// The error that ended the connection, if it ended.
    pub fn dead(&self) -> Option<HostError> {
        self.shared.state.lock().dead.clone()
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.close();
    }
}

/// Waits for command `cid`; frees its id when done, or marks it abandoned if dropped first.
struct Wait<'a> {
    shared: &'a Shared,
    cid: u16,
    done: bool,
}

impl Future for Wait<'_> {
    type Output = (AlignedBuf, Outcome);
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let i = usize::from(self.cid);
        let mut st = self.shared.state.lock();
        match &mut st.slots[i] {
            Slot::Waiting(w) => {
                if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *w = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            Slot::Done(..) => {
                let Slot::Done(outcome, buf) = std::mem::replace(&mut st.slots[i], Slot::Free)
                else {
                    unreachable!("matched Done above")
                };
                st.free.push(self.cid);
                drop(st);
                self.shared.permits.add_permits(1);
                self.done = true;
                Poll::Ready((buf, outcome))
            }
            Slot::Free | Slot::Abandoned => {
                drop(st);
                self.done = true;
                Poll::Ready((
                    AlignedBuf::empty(),
                    Err(self.shared.closed_error("command state lost")),
                ))
            }
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let i = usize::from(self.cid);
        let mut st = self.shared.state.lock();
        match st.slots[i] {
            Slot::Done(..) => {
                st.slots[i] = Slot::Free;
                st.free.push(self.cid);
                drop(st);
                self.shared.permits.add_permits(1);
            }
            Slot::Waiting(_) => st.slots[i] = Slot::Abandoned,
            _ => {}
        }
    }
}

/// ICReq out, ICResp (or a C2HTermReq) in.
async fn initialize(stream: &mut Stream, addr: SocketAddr, want_dgst: u8) -> Result<Negotiated> {
    // A listener that requires TLS closes a plain connection at its ICReq.
    let hint = if stream.is_tls() {
        ""
    } else {
        " (a target listener with tls = \"required\" closes plain connections: give this \
         host its TLS key)"
    };
    let lost = |e: std::io::Error| HostError::ConnectionLost {
        addr,
        msg: format!("during connection initialization: {e}{hint}"),
    };
    let req = ICReq {
        pfv: 0,
        hpda: 0,
        dgst: want_dgst,
        maxr2t: 0,
    };
    stream.write_all(&req.encode()).await.map_err(lost)?;
    let mut b = [0u8; TERMREQ_HLEN + TERMREQ_MAX_DATA]; // >= ICRESP_LEN
    stream.read_exact(&mut b[..CH_LEN]).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            HostError::ConnectionLost {
                addr,
                msg: "the target closed the connection instead of answering the ICReq; \
                      is this an NVMe/TCP port?"
                    .into(),
            }
        } else {
            lost(e)
        }
    })?;
    let ch = CommonHeader::decode(&b).expect("8 bytes");
    let protocol = |msg: String| HostError::Protocol { addr, msg };
    match PduType::from_u8(ch.pdu_type) {
        Some(PduType::ICResp) => {
            if usize::from(ch.hlen) != ICRESP_LEN || ch.plen as usize != ICRESP_LEN {
                return Err(protocol(format!(
                    "ICResp with HLEN {} and PLEN {}, expected 128 and 128",
                    ch.hlen, ch.plen
                )));
            }
            stream
                .read_exact(&mut b[CH_LEN..ICRESP_LEN])
                .await
                .map_err(lost)?;
            let resp = ICResp::decode(&b[..ICRESP_LEN]).expect("128 bytes");
            check_icresp(&resp, want_dgst).map_err(protocol)
        }
        Some(PduType::C2HTermReq) => {
            let plen = ch.plen as usize;
            if !(TERMREQ_HLEN..=TERMREQ_HLEN + TERMREQ_MAX_DATA).contains(&plen) {
                return Err(protocol(format!("C2HTermReq with PLEN {plen}")));
            }
            stream
                .read_exact(&mut b[CH_LEN..plen])
                .await
                .map_err(lost)?;
            let t = TermReq::decode(&b[..plen]).expect("24 bytes");
            Err(HostError::TermReq {
                addr,
                fes: t.fes,
                fei: t.fei,
            })
        }
        _ => Err(protocol(format!(
            "expected an ICResp (type 0x01) to our ICReq, got PDU type {:#04x}; is this an NVMe/TCP port?",
            ch.pdu_type
        ))),
    }
}

/// Checks an ICResp the way the Linux host does.
pub(crate) fn check_icresp(r: &ICResp, want_dgst: u8) -> Result<Negotiated, String> {
    if r.pfv != 0 {
        return Err(format!("ICResp PFV is {}, only version 0 exists", r.pfv));
    }
    if !r.maxh2cdata.is_multiple_of(4) || r.maxh2cdata < 4096 {
        return Err(format!(
            "ICResp MAXH2CDATA is {}, it must be a multiple of 4 and at least 4096",
            r.maxh2cdata
        ));
    }
    if r.cpda > 31 {
        return Err(format!("ICResp CPDA is {}, the maximum is 31", r.cpda));
    }
    if r.dgst & !want_dgst != 0 {
        return Err(format!(
            "ICResp turns on digests we did not ask for (DGST {:#x}, asked {:#x})",
            r.dgst, want_dgst
        ));
    }
    Ok(Negotiated {
        hdgst: r.dgst & 1 != 0,
        ddgst: r.dgst & 2 != 0,
        maxh2cdata: r.maxh2cdata,
        cpda: r.cpda,
    })
}

/// A zeroed aligned buffer of `len` bytes in use (no allocation for 0).
pub fn zeroed_buf(len: usize) -> AlignedBuf {
    if len == 0 {
        return AlignedBuf::empty();
    }
    let mut b = AlignedBuf::new(len);
    b.set_len(len);
    b
}

/// An aligned copy of `bytes`.
pub fn buf_from(bytes: &[u8]) -> AlignedBuf {
    let mut b = zeroed_buf(bytes.len());
    b.copy_from_slice(bytes);
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_wire::pdu::pda_align;

    fn resp(maxh2cdata: u32, dgst: u8) -> ICResp {
        ICResp {
            pfv: 0,
            cpda: 0,
            dgst,
            maxh2cdata,
        }
    }

    #[test]
    fn icresp_checks() {
        let n = check_icresp(&resp(131072, 3), 3).unwrap();
        assert!(n.hdgst && n.ddgst);
        assert_eq!((n.maxh2cdata, pda_align(n.cpda)), (131072, 4));
        // The target may decline digests we asked for.
        let n = check_icresp(&resp(8192, 0), 3).unwrap();
        assert!(!n.hdgst && !n.ddgst);
        assert!(
            check_icresp(&resp(4094, 0), 0)
                .unwrap_err()
                .contains("MAXH2CDATA is 4094")
        );
        assert!(
            check_icresp(&resp(8190, 0), 0)
                .unwrap_err()
                .contains("multiple of 4")
        );
        assert!(
            check_icresp(&resp(8192, 2), 1)
                .unwrap_err()
                .contains("did not ask")
        );
        let mut r = resp(8192, 0);
        r.pfv = 1;
        assert!(check_icresp(&r, 0).unwrap_err().contains("PFV"));
        r.pfv = 0;
        r.cpda = 3;
        assert_eq!(pda_align(check_icresp(&r, 0).unwrap().cpda), 16);
    }
}
