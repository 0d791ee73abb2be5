//! One NVMe/TCP connection's byte stream: plain TCP or a TLS channel over
//! it. Async reads and writes for the target's connection task, and
//! non-blocking `try_*` calls with readiness polling for the host's.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

use crate::coalesce::Coalesce;

/// Most bytes one TLS write gathers from a vectored write: one full record.
/// With partial writes on, SSL_write returns after each record, so a larger
/// gather would copy bytes again on every call (measured: 64 KiB made a
/// 128 KiB read copy ~400 KiB).
const TLS_GATHER: usize = 16 * 1024;

pub struct TlsStream {
    ssl: SslStream<Coalesce>,
    /// A vectored write's slices, copied into one buffer so that one
    /// SSL_write fills whole records instead of one record per slice.
    gather: Vec<u8>,
    /// The last `try_read` found no whole record: what OpenSSL holds (a
    /// partial record) needs more bytes from the socket first.
    starved: AtomicBool,
}

pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
}

impl Stream {
    pub(crate) fn tls(ssl: SslStream<Coalesce>) -> Stream {
        Stream::Tls(Box::new(TlsStream {
            ssl,
            gather: Vec::new(),
            starved: AtomicBool::new(false),
        }))
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => &t.ssl.get_ref().tcp,
        }
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().peer_addr()
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().local_addr()
    }

    /// The negotiated TLS cipher suite, if any.
    pub fn cipher(&self) -> Option<&'static str> {
        match self {
            Stream::Plain(_) => None,
            Stream::Tls(t) => t.ssl.ssl().current_cipher().map(|c| c.name()),
        }
    }

    /// Ready when a read may make progress: socket data, or TLS bytes
    /// OpenSSL already read from the socket (read-ahead) or decrypted.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Plain(s) => s.poll_read_ready(cx),
            Stream::Tls(t) if !t.starved.load(Relaxed) && crate::ffi::has_pending(t.ssl.ssl()) => {
                Poll::Ready(Ok(()))
            }
            Stream::Tls(t) => t.ssl.get_ref().tcp.poll_read_ready(cx),
        }
    }

    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tcp().poll_write_ready(cx)
    }

    pub async fn writable(&self) -> io::Result<()> {
        self.tcp().writable().await
    }

    /// Reads what is there without waiting; `WouldBlock` when nothing is.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.try_read(buf),
            Stream::Tls(t) => {
                let mut cx = Context::from_waker(Waker::noop());
                let mut rb = ReadBuf::new(buf);
                let r = Pin::new(&mut t.ssl).poll_read(&mut cx, &mut rb);
                t.starved.store(r.is_pending(), Relaxed);
                match r {
                    Poll::Ready(Ok(())) => Ok(rb.filled().len()),
                    Poll::Ready(Err(e)) => Err(e),
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }

    /// Writes what the socket takes without waiting; `WouldBlock` when it
    /// takes nothing. After `WouldBlock` on TLS the caller must offer the
    /// same bytes again (OpenSSL may hold an encrypted record of them).
    pub fn try_write_vectored(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.try_write_vectored(iov),
            Stream::Tls(_) => {
                let mut cx = Context::from_waker(Waker::noop());
                match Pin::new(self).poll_write_vectored(&mut cx, iov) {
                    Poll::Ready(r) => r,
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(t) => Pin::new(&mut t.ssl).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(t) => Pin::new(&mut t.ssl).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        iov: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, iov),
            Stream::Tls(t) => {
                // The same queued bytes come back after a Pending, so the
                // gathered prefix is what OpenSSL saw before.
                t.gather.clear();
                for s in iov {
                    let room = TLS_GATHER - t.gather.len();
                    if room == 0 {
                        break;
                    }
                    t.gather.extend_from_slice(&s[..s.len().min(room)]);
                }
                let TlsStream { ssl, gather, .. } = &mut **t;
                Pin::new(ssl).poll_write(cx, gather)
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(t) => Pin::new(&mut t.ssl).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(t) => Pin::new(&mut t.ssl).poll_shutdown(cx),
        }
    }
}
