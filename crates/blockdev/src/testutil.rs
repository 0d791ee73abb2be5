//! Test helpers shared by the backends' tests: a tiny executor, a seeded RNG and
//! checks every `BlockDevice` must pass.

use std::sync::Arc;

use crate::{AlignedBuf, BlockDevice, BlockError, BlockOp, IoDone, IoRequest};

pub use crate::block_on;
use std::thread;

/// xorshift64*: deterministic, good enough for test data and LBAs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

pub fn io(dev: &dyn BlockDevice, op: BlockOp, lba: u64, blocks: u32, buf: AlignedBuf) -> IoDone {
    block_on(dev.submit(IoRequest {
        op,
        lba,
        blocks,
        buf,
    }))
}

pub fn buf_of(len: usize) -> AlignedBuf {
    let mut b = AlignedBuf::new(len);
    b.set_len(len);
    b
}

pub fn write(dev: &dyn BlockDevice, lba: u64, data: &[u8]) {
    let bs = dev.geometry().block_size as usize;
    assert_eq!(data.len() % bs, 0);
    let mut buf = buf_of(data.len());
    buf.copy_from_slice(data);
    let done = io(
        dev,
        BlockOp::Write { fua: false },
        lba,
        (data.len() / bs) as u32,
        buf,
    );
    done.result.expect("write");
}

pub fn read(dev: &dyn BlockDevice, lba: u64, blocks: u32) -> Vec<u8> {
    let bs = dev.geometry().block_size as usize;
    let mut buf = buf_of(blocks as usize * bs);
    buf.fill(0xA5); // so a read that moves nothing is caught
    let done = io(dev, BlockOp::Read, lba, blocks, buf);
    done.result.expect("read");
    done.buf.to_vec()
}

/// Random writes at random LBAs, checked against a shadow copy, then read back whole.
pub fn check_random_roundtrip(dev: &dyn BlockDevice, seed: u64, ops: usize) {
    let geo = dev.geometry();
    let bs = geo.block_size as usize;
    let mut shadow = vec![0u8; geo.size_bytes() as usize];
    // Start from a known state: everything zero.
    let zero = io(
        dev,
        BlockOp::WriteZeroes,
        0,
        geo.num_blocks as u32,
        AlignedBuf::new(0),
    );
    zero.result.expect("write zeroes");
    let mut rng = Rng::new(seed);
    for _ in 0..ops {
        let blocks = 1 + rng.below(16.min(geo.num_blocks)) as u32;
        let lba = rng.below(geo.num_blocks - u64::from(blocks) + 1);
        let start = lba as usize * bs;
        let len = blocks as usize * bs;
        if rng.below(3) == 0 {
            let got = read(dev, lba, blocks);
            assert_eq!(
                got,
                shadow[start..start + len],
                "read at lba {lba} x{blocks}"
            );
        } else {
            let mut data = vec![0u8; len];
            rng.fill(&mut data);
            write(dev, lba, &data);
            shadow[start..start + len].copy_from_slice(&data);
        }
    }
    let all = read(dev, 0, geo.num_blocks as u32);
    assert!(
        all == shadow,
        "whole-device read differs from what was written"
    );
}

/// Bad requests complete with errors, never panic.
pub fn check_bad_requests(dev: &dyn BlockDevice) {
    let geo = dev.geometry();
    let bs = geo.block_size as usize;
    let n = geo.num_blocks;
    for (op, lba, blocks) in [
        (BlockOp::Read, n, 1),
        (BlockOp::Read, n - 1, 2),
        (BlockOp::Write { fua: false }, u64::MAX, 1),
        (BlockOp::Write { fua: true }, u64::MAX - 1, u32::MAX),
        (BlockOp::WriteZeroes, n, 1),
        (BlockOp::Deallocate, 0, (n + 1) as u32),
    ] {
        let done = io(dev, op, lba, blocks, buf_of(2 * bs));
        assert!(
            matches!(done.result, Err(BlockError::OutOfRange { .. })),
            "{op:?} {lba}+{blocks}: {:?}",
            done.result
        );
        assert_eq!(done.buf.len(), 2 * bs, "buffer comes back");
    }
    for op in [BlockOp::Read, BlockOp::Write { fua: false }] {
        let done = io(dev, op, 0, 2, buf_of(bs));
        assert!(
            matches!(done.result, Err(BlockError::BufferTooSmall { have, need }) if have == bs && need == 2 * bs),
            "{op:?}: {:?}",
            done.result
        );
    }
    // A zero-block read or write is legal and moves nothing.
    io(dev, BlockOp::Read, n, 0, buf_of(0))
        .result
        .expect("empty read at end");
    io(dev, BlockOp::Flush, u64::MAX, u32::MAX, AlignedBuf::new(0))
        .result
        .expect("flush ignores lba");
}

/// WriteZeroes and Deallocate read back zeroes, partial blocks ranges included,
/// and leave their neighbours alone.
pub fn check_zeroing(dev: &dyn BlockDevice, seed: u64) {
    let geo = dev.geometry();
    let bs = geo.block_size as usize;
    let n = geo.num_blocks as u32;
    let mut rng = Rng::new(seed);
    for op in [BlockOp::WriteZeroes, BlockOp::Deallocate] {
        let mut data = vec![0u8; n as usize * bs];
        rng.fill(&mut data);
        write(dev, 0, &data);
        let ranges = [(1u32, 1u32), (3, 5), (n / 2 - 1, n / 2 - 2), (n - 1, 1)];
        for (lba, blocks) in ranges {
            let done = io(dev, op, u64::from(lba), blocks, AlignedBuf::new(0));
            done.result
                .unwrap_or_else(|e| panic!("{op:?} {lba}+{blocks}: {e}"));
            data[lba as usize * bs..(lba + blocks) as usize * bs].fill(0);
        }
        if !dev.deallocate_reads_zeroes() && op == BlockOp::Deallocate {
            continue;
        }
        let got = read(dev, 0, n);
        for (i, (g, w)) in got.chunks(bs).zip(data.chunks(bs)).enumerate() {
            assert!(g == w, "{op:?}: block {i} differs");
        }
    }
}

/// Several threads, each with several requests in flight, on disjoint ranges.
pub fn check_concurrent(dev: Arc<dyn BlockDevice>, threads: usize, rounds: usize) {
    let geo = dev.geometry();
    let bs = geo.block_size as usize;
    let per_thread = geo.num_blocks / threads as u64;
    assert!(
        per_thread >= 8,
        "device too small for the concurrency check"
    );
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let dev = Arc::clone(&dev);
            thread::spawn(move || {
                let mut rng = Rng::new(1000 + t as u64);
                let base = t as u64 * per_thread;
                let mut shadow = vec![0u8; per_thread as usize * bs];
                // The region may hold another check's data: start from zeroes.
                let z = io(
                    &*dev,
                    BlockOp::WriteZeroes,
                    base,
                    per_thread as u32,
                    AlignedBuf::new(0),
                );
                z.result.expect("zero region");
                for _ in 0..rounds {
                    // Up to 8 writes in flight at once, to distinct blocks.
                    let mut futs = Vec::new();
                    let mut picked = Vec::new();
                    for _ in 0..8 {
                        let off = rng.below(per_thread);
                        if picked.contains(&off) {
                            continue;
                        }
                        picked.push(off);
                        let mut buf = buf_of(bs);
                        rng.fill(&mut buf);
                        let s = off as usize * bs;
                        shadow[s..s + bs].copy_from_slice(&buf);
                        futs.push(dev.submit(IoRequest {
                            op: BlockOp::Write { fua: false },
                            lba: base + off,
                            blocks: 1,
                            buf,
                        }));
                    }
                    for f in futs {
                        let done = block_on(f);
                        done.result.expect("write");
                    }
                    let off = rng.below(per_thread);
                    let got = read(&*dev, base + off, 1);
                    let s = off as usize * bs;
                    assert!(got == shadow[s..s + bs], "thread {t}: block {off} differs");
                }
                let got = read(&*dev, base, per_thread as u32);
                assert!(got == shadow, "thread {t}: region differs at the end");
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread");
    }
}
