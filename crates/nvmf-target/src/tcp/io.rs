//! What the command core asks of an NVMe/TCP connection, carried out:
//! completions, read data and R2Ts become PDUs in the outgoing queue, device
//! I/O joins the connection's in-flight set.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use blockdev::{AlignedBuf, IoDone, IoFuture};
use futures_util::stream::FuturesUnordered;
use nvme_wire::cqe::Cqe;
use nvme_wire::digest::data_digest_trailer;
use nvme_wire::pdu::{C2HDataHdr, DigestMode, PDU_HDR_MAX, R2THdr, encode_capsule_resp};

use super::out::OutQueue;
use super::pdu_check::Negotiated;
use super::r2t::R2tTable;
use crate::queue::Transport;

/// A backend I/O in flight, tagged with its slot.
pub(super) struct Tagged {
    tag: u16,
    fut: IoFuture,
}

impl Future for Tagged {
    type Output = (u16, IoDone);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let tag = this.tag;
        Pin::new(&mut this.fut).poll(cx).map(|d| (tag, d))
    }
}

/// The byte-moving half of a connection: what the core asks for lands here.
pub(super) struct TcpIo {
    pub neg: Negotiated,
    /// Host PDU data alignment (HPDA, 0-based dwords).
    pub hpda: u8,
    pub out: OutQueue,
    pub r2t: R2tTable,
    pub inflight: FuturesUnordered<Tagged>,
    /// The host sent a Fabrics Disconnect (answered; close after flushing).
    pub disconnected: bool,
}

impl TcpIo {
    fn digests(&self) -> DigestMode {
        DigestMode {
            header: self.neg.hdgst,
            data: self.neg.ddgst,
        }
    }
}

impl Transport for TcpIo {
    fn respond(&mut self, cqe: Cqe) {
        let mut b = [0u8; PDU_HDR_MAX];
        let n = encode_capsule_resp(&cqe.encode(), self.digests(), &mut b);
        self.out.push_bytes(&b[..n]);
    }

    fn send_data(&mut self, cid: u16, buf: AlignedBuf, len: usize, success: bool) {
        let dm = self.digests();
        let mut b = [0u8; PDU_HDR_MAX];
        let hdr = C2HDataHdr {
            cccid: cid,
            datao: 0,
            datal: len as u32,
        };
        let n = hdr.encode_pdu(true, success, dm, self.hpda, &mut b);
        self.out.push_bytes(&b[..n]);
        let digest = dm.data.then(|| data_digest_trailer(&buf[..len]));
        self.out.push_buf(buf, len);
        if let Some(d) = digest {
            self.out.push_bytes(&d);
        }
    }

    fn request_data(&mut self, tag: u16, cid: u16, buf: AlignedBuf) {
        let mut b = [0u8; PDU_HDR_MAX];
        let hdr = R2THdr {
            cccid: cid,
            ttag: tag,
            r2to: 0,
            r2tl: buf.len() as u32,
        };
        let n = hdr.encode_pdu(self.digests(), &mut b);
        self.out.push_bytes(&b[..n]);
        self.r2t.insert(tag, cid, buf);
    }

    fn wait_io(&mut self, tag: u16, fut: IoFuture) {
        self.inflight.push(Tagged { tag, fut });
    }

    fn disconnect(&mut self) {
        self.disconnected = true;
    }
}
