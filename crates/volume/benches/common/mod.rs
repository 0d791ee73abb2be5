//! What the thin benches share: QD-32 runs of 4 KiB I/Os, a fill, and RAM
//! whose completions come 0 to 2 executor yields later (as a drive's do).

use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use blockdev::testutil::Rng;
use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest, MemDevice};
use futures_util::future::join_all;
use volume::FaultDevice;

pub const QD: usize = 32;
pub const BS: u64 = 4096;

pub fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Random LBAs below `blocks`, fixed per seed.
pub fn random_lbas(blocks: u64, ops: u64, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    (0..ops).map(|_| rng.below(blocks)).collect()
}

/// One 4 KiB I/O at each of `lbas`, `QD` at a time; I/Os per second.
pub async fn run(dev: &dyn BlockDevice, op: BlockOp, lbas: &[u64]) -> f64 {
    let issued = Cell::new(0usize);
    let start = Instant::now();
    join_all((0..QD).map(|q| {
        let issued = &issued;
        async move {
            let mut buf = AlignedBuf::new(BS as usize);
            buf.set_len(BS as usize);
            Rng::new(q as u64 + 1).fill(&mut buf);
            while issued.get() < lbas.len() {
                let i = issued.get();
                issued.set(i + 1);
                let done = dev
                    .submit(IoRequest {
                        op,
                        lba: lbas[i],
                        blocks: 1,
                        buf,
                    })
                    .await;
                done.result.expect("bench I/O");
                buf = done.buf;
            }
        }
    }))
    .await;
    lbas.len() as f64 / start.elapsed().as_secs_f64()
}

/// Writes every block of the range once, 1 MiB at a time.
pub async fn fill(dev: &dyn BlockDevice, blocks: u64) {
    let per = (1 << 20) / BS;
    let mut lba = 0;
    while lba < blocks {
        let n = per.min(blocks - lba);
        let mut buf = AlignedBuf::new((n * BS) as usize);
        buf.set_len((n * BS) as usize);
        buf.fill(0x5A);
        let done = dev
            .submit(IoRequest {
                op: BlockOp::Write { fua: false },
                lba,
                blocks: n as u32,
                buf,
            })
            .await;
        done.result.expect("fill");
        lba += n;
    }
}

/// A RAM device whose completions come 0 to 2 executor yields later.
pub fn async_mem(bytes: u64) -> Arc<dyn BlockDevice> {
    let f = FaultDevice::new(Arc::new(MemDevice::new(bytes, 4096).unwrap()));
    f.set_yields(2, 7);
    f
}
