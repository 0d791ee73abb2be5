//! The socket under a TLS channel. OpenSSL hands its BIO one record (at
//! most 16 KiB) per write; sent one by one with TCP_NODELAY, a 128 KiB
//! C2HData costs eight sendto calls, each pushing segments and running the
//! loopback receive path on the sender's core. On the target the records of
//! one flush are gathered here and sent together when the connection
//! flushes or 64 KiB have gathered (measured: 256 KiB starves the host of
//! the first records while the rest are encrypted, 32 KiB saves too few
//! syscalls); the host writes through (`limit` 0).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

pub struct Coalesce {
    pub(crate) tcp: TcpStream,
    out: Vec<u8>,
    sent: usize,
    /// Bytes gathered before a write waits for the socket; 0: write through.
    limit: usize,
}

impl Coalesce {
    pub fn new(tcp: TcpStream, limit: usize) -> Coalesce {
        Coalesce {
            tcp,
            out: Vec::new(),
            sent: 0,
            limit,
        }
    }

    /// Sends what is gathered; Pending while the socket takes no more.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.out[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.out.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Coalesce {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Coalesce {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.out.len() - this.sent >= this.limit {
            ready!(this.poll_drain(cx))?;
        }
        if this.limit == 0 {
            return Pin::new(&mut this.tcp).poll_write(cx, buf);
        }
        this.out.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}
