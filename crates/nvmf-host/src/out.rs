//! Outgoing bytes of one connection, sent with vectored non-blocking writes.
//!
//! PDU headers and digests are small and are copied into inline segments
//! (consecutive ones share a segment); command data is referenced by command
//! id and offset into the buffer the command owns, so write data is never
//! copied in user space.

use std::collections::VecDeque;
use std::io::IoSlice;

/// Bytes of headers one inline segment holds (a capsule header with digest
/// and padding is at most `PDU_HDR_MAX`, 144).
const SMALL: usize = 240;
/// Most iovecs handed to one writev.
pub(crate) const MAX_IOVECS: usize = 64;

// Headers live inline in their segment: that is the point, so the size difference is wanted.
#[allow(clippy::large_enum_variant)]
enum Seg {
    Small {
        b: [u8; SMALL],
        start: u16,
        end: u16,
    },
    Data {
        cid: u16,
        start: usize,
        end: usize,
    },
}

/// Where a `Data` segment's bytes live: the buffer of command `cid`.
pub(crate) trait DataSource {
    fn data(&self, cid: u16) -> &[u8];
    /// A data segment of command `cid` went out completely.
    fn sent(&mut self, cid: u16);
}

#[derive(Default)]
pub(crate) struct Out {
    segs: VecDeque<Seg>,
    /// Some: the bytes left of each queued PDU, so that one write ends at
    /// the end of a PDU (a client that does not batch, for benchmarks).
    pdus: Option<VecDeque<usize>>,
}

impl Out {
    /// A queue whose writes carry one PDU each.
    pub fn one_pdu_per_write() -> Self {
        Out {
            segs: VecDeque::new(),
            pdus: Some(VecDeque::new()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// What is pushed from here on belongs to a new PDU.
    pub fn begin_pdu(&mut self) {
        if let Some(p) = self.pdus.as_mut() {
            p.push_back(0);
        }
    }

    fn count(&mut self, n: usize) {
        if let Some(last) = self.pdus.as_mut().and_then(|p| p.back_mut()) {
            *last += n;
        }
    }

    pub fn push_small(&mut self, bytes: &[u8]) {
        debug_assert!(bytes.len() <= SMALL);
        self.count(bytes.len());
        if let Some(Seg::Small { b, end, .. }) = self.segs.back_mut() {
            let e = usize::from(*end);
            if SMALL - e >= bytes.len() {
                b[e..e + bytes.len()].copy_from_slice(bytes);
                *end += bytes.len() as u16;
                return;
            }
        }
        let mut b = [0u8; SMALL];
        b[..bytes.len()].copy_from_slice(bytes);
        self.segs.push_back(Seg::Small {
            b,
            start: 0,
            end: bytes.len() as u16,
        });
    }

    /// Queues bytes `start..end` of command `cid`'s buffer.
    pub fn push_data(&mut self, cid: u16, start: usize, end: usize) {
        if end > start {
            self.count(end - start);
            self.segs.push_back(Seg::Data { cid, start, end });
        }
    }

    /// Fills `iov` with the next segments to send; returns how many.
    pub fn fill_iov<'a>(
        &'a self,
        src: &'a impl DataSource,
        iov: &mut [IoSlice<'a>; MAX_IOVECS],
    ) -> usize {
        let mut n = 0;
        let mut cap = self
            .pdus
            .as_ref()
            .and_then(|p| p.iter().copied().find(|&l| l > 0))
            .unwrap_or(usize::MAX);
        for s in self.segs.iter().take(MAX_IOVECS) {
            let b: &[u8] = match s {
                Seg::Small { b, start, end } => &b[usize::from(*start)..usize::from(*end)],
                Seg::Data { cid, start, end } => src.data(*cid).get(*start..*end).unwrap_or(&[]),
            };
            let b = &b[..b.len().min(cap)];
            iov[n] = IoSlice::new(b);
            n += 1;
            cap -= b.len();
            if cap == 0 {
                break;
            }
        }
        n
    }

    /// Drops `n` written bytes from the front.
    pub fn consume(&mut self, mut n: usize, src: &mut impl DataSource) {
        if let Some(p) = self.pdus.as_mut() {
            let mut left = n;
            while let Some(front) = p.front_mut() {
                let k = left.min(*front);
                *front -= k;
                left -= k;
                if *front > 0 {
                    break;
                }
                p.pop_front();
            }
        }
        while n > 0 {
            let Some(front) = self.segs.front_mut() else {
                return;
            };
            let left = match front {
                Seg::Small { start, end, .. } => {
                    let left = usize::from(*end - *start);
                    if n < left {
                        *start += n as u16;
                        return;
                    }
                    left
                }
                Seg::Data { start, end, .. } => {
                    let left = *end - *start;
                    if n < left {
                        *start += n;
                        return;
                    }
                    left
                }
            };
            n -= left;
            if let Some(Seg::Data { cid, .. }) = self.segs.pop_front() {
                src.sent(cid);
            }
        }
    }

    /// Forgets everything queued (the connection is closing).
    pub fn clear(&mut self) {
        self.segs.clear();
        if let Some(p) = self.pdus.as_mut() {
            p.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Bufs(Vec<Vec<u8>>, Vec<u16>);
    impl DataSource for Bufs {
        fn data(&self, cid: u16) -> &[u8] {
            &self.0[usize::from(cid)]
        }
        fn sent(&mut self, cid: u16) {
            self.1.push(cid);
        }
    }

    fn drain(out: &mut Out, src: &mut Bufs, chunk: usize) -> Vec<u8> {
        let mut all = Vec::new();
        while !out.is_empty() {
            let mut flat = Vec::new();
            {
                let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
                let n = out.fill_iov(src, &mut iov);
                for s in &iov[..n] {
                    flat.extend_from_slice(s);
                }
            }
            let take = flat.len().min(chunk);
            all.extend_from_slice(&flat[..take]);
            out.consume(take, src);
        }
        all
    }

    #[test]
    fn merges_small_and_keeps_order_across_partial_writes() {
        let mut src = Bufs(vec![vec![7u8; 1000], vec![9u8; 10]], Vec::new());
        let mut out = Out::default();
        out.push_small(&[1; 76]);
        out.push_small(&[2; 76]);
        out.push_small(&[4; 144]);
        out.push_data(0, 10, 1000);
        out.push_small(&[3; 4]);
        out.push_data(1, 0, 10);
        assert_eq!(
            out.segs.len(),
            5,
            "two headers share a segment, a third does not fit"
        );
        let mut want = vec![1u8; 76];
        want.extend([2u8; 76]);
        want.extend([4u8; 144]);
        want.extend([7u8; 990]);
        want.extend([3u8; 4]);
        want.extend([9u8; 10]);
        for chunk in [1, 7, 100, 5000] {
            let mut o = Out::default();
            o.push_small(&[1; 76]);
            o.push_small(&[2; 76]);
            o.push_small(&[4; 144]);
            o.push_data(0, 10, 1000);
            o.push_small(&[3; 4]);
            o.push_data(1, 0, 10);
            src.1.clear();
            assert_eq!(drain(&mut o, &mut src, chunk), want, "chunk {chunk}");
            assert_eq!(src.1, vec![0, 1]);
        }
    }

    #[test]
    fn one_pdu_per_write_stops_each_write_at_a_pdu_end() {
        let mut src = Bufs(vec![vec![7u8; 1000], vec![9u8; 10]], Vec::new());
        let mut o = Out::one_pdu_per_write();
        o.begin_pdu();
        o.push_small(&[1; 72]);
        o.begin_pdu();
        o.push_small(&[2; 24]);
        o.push_data(0, 0, 1000);
        o.begin_pdu();
        o.push_small(&[3; 72]);
        o.push_data(1, 0, 10);
        let mut writes = Vec::new();
        // a short write in the middle of the second PDU: the next one ends it
        for short in [usize::MAX, 500, usize::MAX, usize::MAX] {
            let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
            let n = o.fill_iov(&src, &mut iov);
            let len: usize = iov[..n].iter().map(|s| s.len()).sum::<usize>().min(short);
            writes.push(len);
            o.consume(len, &mut src);
        }
        assert_eq!(writes, vec![72, 500, 524, 82]);
        assert!(o.is_empty());
        assert_eq!(src.1, vec![0, 1]);
    }
}
