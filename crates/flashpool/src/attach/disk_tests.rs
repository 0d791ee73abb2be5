//! The offset -> block mapping against a RAM device and a byte model of it.

use std::sync::Arc;
use std::time::Duration;

use blockdev::{BlockDevice, Geometry, IoFuture, IoRequest, MemDevice};

use super::*;

const BS: u64 = 512;
const SIZE: u64 = 64 * BS;

fn rng(seed: &mut u64) -> u64 {
    // xorshift64*: reproducible, no dependency.
    *seed ^= *seed >> 12;
    *seed ^= *seed << 25;
    *seed ^= *seed >> 27;
    seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt) | 1)
        .collect()
}

/// A RAM disk filled with a known pattern, and the model of its bytes.
async fn filled() -> (Arc<Disk>, Vec<u8>) {
    let d = Disk::new(Arc::new(MemDevice::new(SIZE, BS as u32).unwrap()));
    let model = pattern(SIZE as usize, 7);
    assert_eq!(
        d.write(0, &model).unwrap().run().await.unwrap(),
        SIZE as u32
    );
    (d, model)
}

async fn whole(d: &Disk) -> Vec<u8> {
    d.read(0, SIZE as u32).await.unwrap().to_vec()
}

#[tokio::test]
async fn unaligned_writes_keep_the_bytes_around_them() {
    // (offset, length): both edges partial over several blocks, head only,
    // tail only, both edges inside one block, one byte, across one boundary.
    for (off, len) in [
        (100, 1000),
        (3 * BS + 7, 2 * BS - 7),
        (5 * BS, BS + 13),
        (9 * BS + 10, 20),
        (SIZE - 1, 1),
        (12 * BS - 3, 6),
        (0, 1),
    ] {
        let (d, mut model) = filled().await;
        let data = pattern(len as usize, 200);
        let n = d.write(off, &data).unwrap().run().await.unwrap();
        assert_eq!(n as u64, len);
        model[off as usize..(off + len) as usize].copy_from_slice(&data);
        assert!(
            whole(&d).await == model,
            "write {off}+{len} changed other bytes"
        );
    }
}

#[tokio::test]
async fn unaligned_reads_return_exactly_the_range() {
    let (d, model) = filled().await;
    for (off, len) in [
        (1u64, 1u32),
        (511, 2),
        (100, 3000),
        (BS, BS as u32),
        (0, 17),
    ] {
        let got = d.read(off, len).await.unwrap();
        assert_eq!(
            &*got,
            &model[off as usize..off as usize + len as usize],
            "{off}+{len}"
        );
    }
}

#[tokio::test]
async fn reads_stop_at_the_end_and_writes_past_it_are_refused_whole() {
    let (d, model) = filled().await;
    assert_eq!(
        &*d.read(SIZE - 10, 100).await.unwrap(),
        &model[SIZE as usize - 10..]
    );
    assert!(d.read(SIZE, 10).await.unwrap().is_empty());
    assert!(d.read(u64::MAX - 1, 10).await.unwrap().is_empty());
    for (off, len) in [(SIZE - 10, 20usize), (SIZE, 1), (u64::MAX - 2, 8)] {
        let e = d.write(off, &vec![0xee; len]).err().expect("refused");
        assert!(matches!(e, DiskError::PastEnd { .. }), "{e}");
        assert_eq!(e.errno(), libc::EFBIG);
    }
    assert!(whole(&d).await == model, "a refused write changed the disk");
    // Up to the last byte is fine.
    assert_eq!(
        d.write(SIZE - 3, &[1, 2, 3]).unwrap().run().await.unwrap(),
        3
    );
    assert_eq!(&*d.read(SIZE - 3, 3).await.unwrap(), &[1, 2, 3]);
    assert_eq!(d.write(5, &[]).unwrap().run().await.unwrap(), 0);
}

#[tokio::test]
async fn zeroing_a_range_keeps_its_edges() {
    for dealloc in [true, false] {
        for (off, len) in [
            (100u64, 3000u64),
            (2 * BS, 4 * BS),
            (10, 20),
            (BS - 5, 10),
            (SIZE - 100, 1000),
        ] {
            let (d, mut model) = filled().await;
            d.zero(off, len, dealloc).await.unwrap();
            let end = (off + len).min(SIZE) as usize;
            model[off as usize..end].fill(0);
            assert!(
                whole(&d).await == model,
                "zero {off}+{len} (dealloc {dealloc})"
            );
        }
    }
    let (d, model) = filled().await;
    d.zero(SIZE, 10, true).await.unwrap();
    assert!(whole(&d).await == model);
    d.flush().await.unwrap();
}

/// A device that runs each request after a short random pause, so that
/// concurrent requests interleave as they do on a remote namespace.
struct Slow {
    inner: Arc<MemDevice>,
    seed: parking_lot::Mutex<u64>,
}

impl BlockDevice for Slow {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn submit(&self, req: IoRequest) -> IoFuture {
        let pause = Duration::from_micros(rng(&mut self.seed.lock()) % 300);
        let inner = self.inner.clone();
        IoFuture::Pending(Box::pin(async move {
            tokio::time::sleep(pause).await;
            inner.submit(req).await
        }))
    }
    fn deallocate_reads_zeroes(&self) -> bool {
        self.inner.deallocate_reads_zeroes()
    }
    fn describe(&self) -> String {
        "slow RAM".into()
    }
}

/// Many writes at once to disjoint bytes of the same few blocks (every one
/// a read-modify-write, some beside whole-block writes): none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_read_modify_writes_lose_nothing() {
    let dev = Arc::new(Slow {
        inner: Arc::new(MemDevice::new(SIZE, BS as u32).unwrap()),
        seed: parking_lot::Mutex::new(0x9e37_79b9_7f4a_7c15),
    });
    let d = Disk::new(dev);
    let mut model = vec![0u8; SIZE as usize];
    let mut tasks = Vec::new();
    // Blocks 0..4 cut into 64-byte pieces, each written by its own task;
    // blocks 4..8 written whole by other tasks at the same time.
    for piece in 0..(4 * BS / 64) {
        let off = piece * 64;
        let data = pattern(64, piece as u8);
        model[off as usize..off as usize + 64].copy_from_slice(&data);
        let job = d.write(off, &data).unwrap();
        tasks.push(tokio::spawn(job.run()));
    }
    for b in 4..8u64 {
        let data = pattern(BS as usize, 100 + b as u8);
        model[(b * BS) as usize..((b + 1) * BS) as usize].copy_from_slice(&data);
        tasks.push(tokio::spawn(d.write(b * BS, &data).unwrap().run()));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert!(whole(&d).await == model, "a concurrent write was lost");
}

/// Random unaligned reads and writes against the byte model.
#[tokio::test]
async fn random_ranges_match_the_model() {
    let (d, mut model) = filled().await;
    let mut seed = 42u64;
    for i in 0..400 {
        let off = rng(&mut seed) % SIZE;
        let len = (rng(&mut seed) % (3 * BS)).min(SIZE - off) as usize;
        if i % 2 == 0 {
            let data = pattern(len, i as u8);
            d.write(off, &data).unwrap().run().await.unwrap();
            model[off as usize..off as usize + len].copy_from_slice(&data);
        } else {
            let got = d.read(off, len as u32).await.unwrap();
            assert!(
                *got == model[off as usize..off as usize + len],
                "read {off}+{len}"
            );
        }
    }
    assert!(whole(&d).await == model);
}
