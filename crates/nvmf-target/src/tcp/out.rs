//! Outgoing bytes of one connection: small PDU headers and responses are
//! appended to one byte vector, data buffers are queued by ownership, and a
//! flush sends everything with vectored writes (no copy of the data).

use std::collections::VecDeque;
use std::io::IoSlice;

use blockdev::AlignedBuf;
use nvme_tls::Stream;
use tokio::io::AsyncWriteExt;

use crate::bufpool::BufPool;

enum Seg {
    Bytes {
        start: usize,
        end: usize,
    },
    Buf {
        buf: AlignedBuf,
        start: usize,
        end: usize,
    },
}

pub struct OutQueue {
    bytes: Vec<u8>,
    segs: VecDeque<Seg>,
}

const MAX_IOVECS: usize = 64;

impl OutQueue {
    pub fn new() -> Self {
        OutQueue {
            bytes: Vec::with_capacity(64 * 1024),
            segs: VecDeque::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    pub fn push_bytes(&mut self, b: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(b);
        let end = self.bytes.len();
        if let Some(Seg::Bytes { end: e, .. }) = self.segs.back_mut()
            && *e == start
        {
            *e = end;
            return;
        }
        self.segs.push_back(Seg::Bytes { start, end });
    }

    /// Queues `buf[..len]`; the buffer goes back to `pool` once sent.
    pub fn push_buf(&mut self, buf: AlignedBuf, len: usize) {
        self.segs.push_back(Seg::Buf {
            buf,
            start: 0,
            end: len,
        });
    }

    /// Sends everything queued. On error the queue is left as is; the
    /// connection is closing anyway.
    pub async fn flush(&mut self, stream: &mut Stream, pool: &mut BufPool) -> std::io::Result<()> {
        while !self.segs.is_empty() {
            let n = {
                let mut iov: [IoSlice<'_>; MAX_IOVECS] = [IoSlice::new(&[]); MAX_IOVECS];
                let mut cnt = 0;
                for s in self.segs.iter().take(MAX_IOVECS) {
                    iov[cnt] = match s {
                        Seg::Bytes { start, end } => IoSlice::new(&self.bytes[*start..*end]),
                        Seg::Buf { buf, start, end } => IoSlice::new(&buf[*start..*end]),
                    };
                    cnt += 1;
                }
                stream.write_vectored(&iov[..cnt]).await?
            };
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            self.consume(n, pool);
        }
        self.bytes.clear();
        // A TLS stream gathers records until flushed; plain TCP: nothing.
        stream.flush().await
    }

    fn consume(&mut self, mut n: usize, pool: &mut BufPool) {
        while n > 0 {
            let Some(front) = self.segs.front_mut() else {
                return;
            };
            let (start, end) = match front {
                Seg::Bytes { start, end } | Seg::Buf { start, end, .. } => (start, *end),
            };
            let left = end - *start;
            if n < left {
                *start += n;
                return;
            }
            n -= left;
            if let Some(Seg::Buf { buf, .. }) = self.segs.pop_front() {
                pool.put(buf);
            }
        }
    }

    /// Returns queued buffers to the pool without sending (connection closing).
    pub fn discard(&mut self, pool: &mut BufPool) {
        for s in self.segs.drain(..) {
            if let Seg::Buf { buf, .. } = s {
                pool.put(buf);
            }
        }
        self.bytes.clear();
    }
}
