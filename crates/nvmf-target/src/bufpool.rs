//! Per-connection pool of aligned data buffers in power-of-two size classes,
//! so steady-state I/O allocates nothing.

use blockdev::AlignedBuf;

const MIN_SHIFT: u32 = 12;
/// Buffers kept per size class; beyond this they are freed.
const KEEP_PER_CLASS: usize = 64;

pub struct BufPool {
    classes: Vec<Vec<AlignedBuf>>,
}

impl BufPool {
    pub fn new(max_len: u32) -> Self {
        let n = class_of(max_len as usize) + 1;
        BufPool {
            classes: (0..n).map(|_| Vec::new()).collect(),
        }
    }

    /// A buffer with `len` bytes in use (contents unspecified).
    pub fn get(&mut self, len: usize) -> AlignedBuf {
        let c = class_of(len);
        let mut b = self
            .classes
            .get_mut(c)
            .and_then(Vec::pop)
            .unwrap_or_else(|| AlignedBuf::new(1 << (c as u32 + MIN_SHIFT)));
        b.set_len(len);
        b
    }

    /// Keeps `buf` for reuse. A view of a shared buffer is dropped instead:
    /// its memory belongs to its parent, which another I/O may still use.
    pub fn put(&mut self, buf: AlignedBuf) {
        let cap = buf.capacity();
        if buf.is_view() || !cap.is_power_of_two() {
            return;
        }
        let c = class_of(cap);
        if let Some(list) = self.classes.get_mut(c)
            && list.len() < KEEP_PER_CLASS
        {
            list.push(buf);
        }
    }
}

fn class_of(len: usize) -> usize {
    let n = len.max(1).next_power_of_two().trailing_zeros();
    n.saturating_sub(MIN_SHIFT) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_by_class() {
        let mut p = BufPool::new(1 << 20);
        let b = p.get(5000);
        assert_eq!((b.len(), b.capacity()), (5000, 8192));
        let ptr = b.as_ptr();
        p.put(b);
        let b2 = p.get(8000);
        assert_eq!(b2.as_ptr(), ptr);
        assert_eq!(p.get(100).capacity(), 4096);
        // Larger than the pool's classes: still served, just not kept.
        let big = p.get(4 << 20);
        assert_eq!(big.len(), 4 << 20);
        p.put(big);
    }

    #[test]
    fn refuses_views() {
        let mut p = BufPool::new(1 << 20);
        let mut b = AlignedBuf::new(16384);
        b.set_len(16384);
        let s = b.share();
        // A 4 KiB (power-of-two) view would fit class 0 if it were kept.
        p.put(s.view(4096..8192));
        let (h, views) = AlignedBuf::new(8192).split_mut(&[0..4096, 4096..8192]);
        views.into_iter().for_each(|v| p.put(v));
        assert!(p.classes.iter().all(Vec::is_empty));
        assert!(s.try_unwrap().is_ok() && h.try_unwrap().is_ok());
        assert!(!p.get(4096).is_view());
    }
}
