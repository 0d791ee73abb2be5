//! Zero extra copies below the target: members write views of
//! the host's buffer, healthy reads land in views of it, and the host gets
//! its own buffer back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use blockdev::{
    AlignedBuf, BlockDevice, BlockError, BlockOp, Geometry, IoDone, IoFuture, IoRequest,
};
use parking_lot::Mutex;

use super::{BS, META, Rig, STRIP, buf_with, cfg, vread};
use crate::layout::LayoutKind;
use crate::testutil::{Rng, block_on};
use crate::volume::Volume;

#[derive(Debug, Clone, Copy)]
struct Seen {
    member: usize,
    write: bool,
    lba: u64,
    view: bool,
    writable: bool,
    ptr: usize,
    len: usize,
}

/// Records the buffer of every data-area read and write its member gets;
/// with `keep`, holds on to write buffers past completion (a misbehaving
/// backend) and completes with a copy instead.
struct Spy {
    inner: Arc<dyn BlockDevice>,
    member: usize,
    on: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    keep: bool,
    kept: Mutex<Vec<AlignedBuf>>,
}

impl BlockDevice for Spy {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn submit(&self, req: IoRequest) -> IoFuture {
        let data = req.lba * u64::from(self.geometry().block_size) >= META;
        let write = matches!(req.op, BlockOp::Write { .. });
        if data && self.on.load(Ordering::Relaxed) && (write || req.op == BlockOp::Read) {
            self.seen.lock().push(Seen {
                member: self.member,
                write,
                lba: req.lba,
                view: req.buf.is_view(),
                writable: req.buf.is_writable(),
                ptr: req.buf.as_ptr() as usize,
                len: req.buf.len(),
            });
        }
        if self.keep && write && req.buf.is_view() {
            let copy = buf_with(&req.buf);
            self.kept.lock().push(req.buf);
            let done = block_on(self.inner.submit(IoRequest { buf: copy, ..req }));
            return IoFuture::ready(done.buf, done.result);
        }
        if self.keep && req.op == BlockOp::Read && req.buf.is_view() {
            let mut copy = AlignedBuf::new(req.buf.len());
            copy.set_len(req.buf.len());
            self.kept.lock().push(req.buf);
            let done = block_on(self.inner.submit(IoRequest { buf: copy, ..req }));
            return IoFuture::ready(done.buf, done.result);
        }
        self.inner.submit(req)
    }
    fn deallocate_reads_zeroes(&self) -> bool {
        self.inner.deallocate_reads_zeroes()
    }
    fn describe(&self) -> String {
        "spy".into()
    }
}

struct Spied {
    vol: Volume,
    on: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Spied {
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock())
    }
}

fn spied(kind: LayoutKind, n: usize, keep: bool) -> Spied {
    let rig = Rig::new(n, 32);
    let on = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let members: Vec<Arc<dyn BlockDevice>> = rig
        .members()
        .into_iter()
        .enumerate()
        .map(|(member, inner)| {
            Arc::new(Spy {
                inner,
                member,
                on: on.clone(),
                seen: seen.clone(),
                keep,
                kept: Mutex::new(Vec::new()),
            }) as Arc<dyn BlockDevice>
        })
        .collect();
    let vol = block_on(Volume::create(members, cfg(kind))).unwrap();
    on.store(true, Ordering::Relaxed);
    Spied { vol, on, seen }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0; len];
    Rng::new(seed).fill(&mut v);
    v
}

/// Submits a write of `data` at `lba`; returns the request buffer's address
/// and the buffer that came back.
fn write_at(vol: &Volume, lba: u64, data: &[u8]) -> (usize, AlignedBuf) {
    let buf = buf_with(data);
    let ptr = buf.as_ptr() as usize;
    let done = block_on(vol.submit(IoRequest {
        op: BlockOp::Write { fua: false },
        lba,
        blocks: (data.len() as u64 / BS) as u32,
        buf,
    }));
    done.result.expect("volume write");
    (ptr, done.buf)
}

fn read_at(vol: &Volume, lba: u64, blocks: u64) -> (usize, IoDone) {
    let mut b = AlignedBuf::new((blocks * BS) as usize);
    b.set_len((blocks * BS) as usize);
    let ptr = b.as_ptr() as usize;
    (
        ptr,
        block_on(vol.submit(IoRequest {
            op: BlockOp::Read,
            lba,
            blocks: blocks as u32,
            buf: b,
        })),
    )
}

fn within(s: &Seen, ptr: usize, len: usize) -> bool {
    s.ptr >= ptr && s.ptr + s.len <= ptr + len
}

#[test]
fn mirror_copies_write_views_of_the_same_bytes() {
    let s = spied(LayoutKind::Raid1, 3, false);
    let data = pattern(3 * STRIP as usize, 1);
    let (ptr, back) = write_at(&s.vol, 2, &data);
    assert_eq!(
        back.as_ptr() as usize,
        ptr,
        "the host gets its own buffer back"
    );
    assert!(!back.is_view());
    assert_eq!(&back[..], &data[..]);
    let seen = s.take();
    let writes: Vec<&Seen> = seen.iter().filter(|x| x.write).collect();
    assert!(writes.len() >= 3, "{seen:?}");
    for w in &writes {
        assert!(w.view && !w.writable, "{w:?}");
        assert!(within(w, ptr, data.len()), "{w:?}");
    }
    // Every member wrote bytes at the same addresses of the host's buffer.
    for m in 0..3 {
        let mine: Vec<usize> = writes
            .iter()
            .filter(|w| w.member == m)
            .map(|w| w.ptr)
            .collect();
        let first: Vec<usize> = writes
            .iter()
            .filter(|w| w.member == 0)
            .map(|w| w.ptr)
            .collect();
        assert_eq!(mine, first);
    }
    assert_eq!(block_on(vread(&s.vol, 2, data.len() as u64 / BS)), data);
}

#[test]
fn striped_writes_hand_data_columns_as_views_and_parity_as_buffers() {
    for (kind, n) in [
        (LayoutKind::Raid0, 4),
        (LayoutKind::Raid5, 4),
        (LayoutKind::Raid6, 5),
        (LayoutKind::Erasure { k: 3, m: 2 }, 5),
    ] {
        let s = spied(kind, n, false);
        let k = s.vol.layout().data_columns() as u64;
        let strip = u64::from(STRIP) / BS;
        // Two full stripes, then a partial write (one block into a strip,
        // three strips long: rmw or rcw), then one block (rmw).
        for (lba, blocks, seed) in [
            (0, 2 * k * strip, 2),
            (1, 3 * strip, 3),
            (k * strip + 5, 1, 4),
        ] {
            let data = pattern((blocks * BS) as usize, seed);
            let (ptr, back) = write_at(&s.vol, lba, &data);
            assert_eq!(back.as_ptr() as usize, ptr, "{kind:?}");
            let seen = s.take();
            let (views, bufs): (Vec<&Seen>, Vec<&Seen>) =
                seen.iter().filter(|x| x.write).partition(|x| x.view);
            let view_bytes: usize = views.iter().map(|v| v.len).sum();
            assert_eq!(view_bytes, data.len(), "{kind:?} {lba}+{blocks}: {seen:?}");
            for v in &views {
                assert!(!v.writable && within(v, ptr, data.len()), "{kind:?}: {v:?}");
            }
            let parity_cols = n as u64 - k;
            let stripes = seen
                .iter()
                .filter(|x| x.write)
                .map(|x| x.lba / strip)
                .collect::<std::collections::BTreeSet<_>>()
                .len() as u64;
            assert_eq!(
                bufs.len() as u64,
                parity_cols * stripes,
                "{kind:?}: {seen:?}"
            );
            assert_eq!(block_on(vread(&s.vol, lba, blocks)), data, "{kind:?}");
        }
        let _ = &s.on;
    }
}

#[test]
fn healthy_reads_land_in_views_of_the_callers_buffer() {
    for (kind, n) in [
        (LayoutKind::Raid0, 4),
        (LayoutKind::Raid1, 2),
        (LayoutKind::Raid5, 4),
        (LayoutKind::Raid6, 6),
    ] {
        let s = spied(kind, n, false);
        let strip = u64::from(STRIP) / BS;
        let blocks = 7 * strip + 3; // several strips and stripes, ragged ends
        let data = pattern((blocks * BS) as usize, 5);
        write_at(&s.vol, 1, &data);
        s.take();
        let (ptr, done) = read_at(&s.vol, 1, blocks);
        done.result.expect("read");
        assert_eq!(done.buf.as_ptr() as usize, ptr, "{kind:?}");
        assert!(!done.buf.is_view());
        assert_eq!(&done.buf[..], &data[..], "{kind:?}");
        let seen = s.take();
        let reads: Vec<&Seen> = seen.iter().filter(|x| !x.write).collect();
        assert!(reads.len() > 1, "{kind:?}: {seen:?}");
        for r in &reads {
            assert!(
                r.view && r.writable && within(r, ptr, data.len()),
                "{kind:?}: {r:?}"
            );
        }
        assert_eq!(reads.iter().map(|r| r.len).sum::<usize>(), data.len());
    }
}

#[test]
fn degraded_reads_and_writes_still_right() {
    // Degraded paths reconstruct into buffers of their own and copy.
    let s = spied(LayoutKind::Raid6, 6, false);
    let strip = u64::from(STRIP) / BS;
    let data = pattern((9 * strip * BS) as usize, 6);
    write_at(&s.vol, 0, &data);
    block_on(s.vol.fail_member(1)).unwrap();
    block_on(s.vol.fail_member(4)).unwrap();
    let upd = pattern((2 * strip * BS) as usize, 7);
    write_at(&s.vol, strip + 1, &upd);
    let mut want = data.clone();
    let at = ((strip + 1) * BS) as usize;
    want[at..at + upd.len()].copy_from_slice(&upd);
    let (_, done) = read_at(&s.vol, 0, 9 * strip);
    done.result.expect("degraded read");
    assert_eq!(&done.buf[..], &want[..]);
}

#[test]
fn a_member_that_keeps_views_costs_a_copy_not_a_wrong_answer() {
    let s = spied(LayoutKind::Raid1, 2, true);
    let data = pattern(2 * STRIP as usize, 8);
    let (_, back) = write_at(&s.vol, 0, &data);
    assert!(!back.is_view());
    assert_eq!(&back[..], &data[..], "the host's bytes come back");
    // A read whose views are kept cannot trust its buffer: an error.
    let s = spied(LayoutKind::Raid0, 2, true);
    let (_, done) = read_at(&s.vol, 0, 2 * u64::from(STRIP) / BS);
    assert!(
        matches!(done.result, Err(BlockError::Io(_))),
        "{:?}",
        done.result
    );
    assert_eq!(done.buf.len(), 2 * STRIP as usize);
}
