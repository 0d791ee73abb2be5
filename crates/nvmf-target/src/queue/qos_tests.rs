//! QoS through the command core: a limited namespace's commands are held
//! (not failed) at its rate, while an unlimited namespace on the same queue
//! runs at once beside them.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use blockdev::{BlockDevice, MemDevice};
use nvme_wire::sqe::{Sqe, io_opc};

use super::tests::{NQN, admin_queue, io_queue, target_with, xfer};
use crate::qos::QosLimits;
use crate::subsystem::{Namespace, Subsystem};

fn read(nsid: u32, cid: u16) -> Sqe {
    let mut s = Sqe::new(io_opc::READ, cid);
    s.nsid = nsid;
    s.cdw12 = 7;
    xfer(s, 8 * 512)
}

#[test]
fn a_limited_namespace_is_held_at_its_rate_and_its_neighbour_is_not() {
    let mem = || Arc::new(MemDevice::new(1 << 20, 512).unwrap());
    let limited = Namespace::new(1, mem(), [1; 16], [1; 16]);
    limited.qos.set(QosLimits {
        iops: 200,
        burst_ms: 10,
        ..Default::default()
    });
    let free = Namespace::new(2, mem(), [2; 16], [2; 16]);
    let (q1, q2) = (limited.qos.clone(), free.qos.clone());
    let sub = Subsystem::new(
        NQN.into(),
        "QOS00001".into(),
        "qos".into(),
        true,
        Vec::new(),
        vec![limited, free],
    );
    let t = target_with(sub);
    let (_a, _, cntlid) = admin_queue(&t, [1; 16]);
    let (mut q, mut rec) = io_queue(&t, cntlid, [1; 16]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    // 8 commands outstanding per namespace for half a second; cids below
    // 100 are namespace 1's, the others namespace 2's.
    let (mut done1, mut done2) = (0u32, 0u32);
    let (mut out1, mut out2) = (0u16, 0u16);
    let mut next = 0u16;
    rt.block_on(async {
        let end = Instant::now() + Duration::from_millis(500);
        let mut cx = Context::from_waker(Waker::noop());
        while Instant::now() < end {
            while out1 < 8 {
                q.on_command(&read(1, next % 100), &[], true, &mut rec);
                (out1, next) = (out1 + 1, next.wrapping_add(1));
            }
            while out2 < 8 {
                q.on_command(&read(2, 100 + next % 100), &[], true, &mut rec);
                (out2, next) = (out2 + 1, next.wrapping_add(1));
            }
            let mut still = Vec::new();
            for (tag, mut fut) in std::mem::take(&mut rec.waiting) {
                match std::pin::Pin::new(&mut fut).poll(&mut cx) {
                    Poll::Ready(done) => q.on_io_done(tag, done, &mut rec),
                    Poll::Pending => still.push((tag, fut)),
                }
            }
            rec.waiting.extend(still);
            for c in rec.take_resps() {
                assert!(c.status.is_success(), "{c:?}");
                if c.cid < 100 {
                    (done1, out1) = (done1 + 1, out1 - 1);
                } else {
                    (done2, out2) = (done2 + 1, out2 - 1);
                }
            }
            // Lets the runtime's timer run: held commands wake on it.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    // 200 IOPS for 0.5 s, plus the 10 ms burst: about 102
    assert!((85..=110).contains(&done1), "limited: {done1} in 0.5 s");
    // namespace 2 completes at once every time round (one round a timer
    // tick or more, so its count says little of its own speed)
    assert!(done2 > 4 * done1, "unlimited: {done2} against {done1}");
    let (waited, held) = q1.throttled();
    assert!(held > 0 && waited > Duration::ZERO);
    assert_eq!(q2.throttled().1, 0);
    // cleared live: namespace 1 runs unheld from the next command
    q1.set(QosLimits::default());
    let before = q1.throttled().1;
    for i in 0..50 {
        q.on_command(&read(1, 300 + i), &[], true, &mut rec);
    }
    rt.block_on(async {
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..2000 {
            let mut still = Vec::new();
            for (tag, mut fut) in std::mem::take(&mut rec.waiting) {
                match std::pin::Pin::new(&mut fut).poll(&mut cx) {
                    Poll::Ready(done) => q.on_io_done(tag, done, &mut rec),
                    Poll::Pending => still.push((tag, fut)),
                }
            }
            rec.waiting.extend(still);
            if rec.waiting.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    let late: Vec<_> = rec
        .take_resps()
        .into_iter()
        .filter(|c| c.cid >= 300)
        .collect();
    assert_eq!(late.len(), 50);
    assert_eq!(q1.throttled().1, before);
}

#[test]
fn a_held_write_never_runs_once_its_queue_closes() {
    let dev = Arc::new(MemDevice::new(1 << 20, 512).unwrap());
    let ns = Namespace::new(1, dev.clone(), [1; 16], [1; 16]);
    // one command a second, a burst of one: the second write waits ~1 s
    ns.qos.set(QosLimits {
        iops: 1,
        burst_ms: 1,
        ..Default::default()
    });
    let sub = Subsystem::new(
        NQN.into(),
        "QOS00002".into(),
        "qos".into(),
        true,
        Vec::new(),
        vec![ns],
    );
    let t = target_with(sub);
    let (_a, _, cntlid) = admin_queue(&t, [1; 16]);
    let (mut q, mut rec) = io_queue(&t, cntlid, [1; 16]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let write = |cid: u16, lba: u32| {
        let mut s = Sqe::new(io_opc::WRITE, cid);
        s.nsid = 1;
        s.cdw10 = lba;
        super::tests::in_capsule(s, 512)
    };
    rt.block_on(async {
        let mut cx = Context::from_waker(Waker::noop());
        let started = Instant::now();
        q.on_command(&write(1, 0), &[0xAA; 512], true, &mut rec);
        q.on_command(&write(2, 1), &[0xBB; 512], true, &mut rec);
        // the first runs, the second is held
        let mut still = Vec::new();
        for (tag, mut fut) in std::mem::take(&mut rec.waiting) {
            match std::pin::Pin::new(&mut fut).poll(&mut cx) {
                Poll::Ready(done) => q.on_io_done(tag, done, &mut rec),
                Poll::Pending => still.push((tag, fut)),
            }
        }
        assert_eq!(still.len(), 1);
        assert_eq!(rec.take_resps().len(), 1);
        q.abandon_held();
        let (tag, mut fut) = still.pop().unwrap();
        let Poll::Ready(done) = std::pin::Pin::new(&mut fut).poll(&mut cx) else {
            panic!("an abandoned command still waits");
        };
        assert!(started.elapsed() < Duration::from_millis(500));
        q.on_io_done(tag, done, &mut rec);
        let c = rec.one();
        assert_eq!(c.cid, 2);
        assert_eq!(c.status.sc, nvme_wire::status::SC_NS_NOT_READY);
        assert!(!c.status.dnr, "retryable: {c:?}");
    });
    // the device never saw the held write
    let mut buf = blockdev::AlignedBuf::new(512);
    buf.set_len(512);
    let done = futures_util::FutureExt::now_or_never(dev.submit(blockdev::IoRequest {
        op: blockdev::BlockOp::Read,
        lba: 1,
        blocks: 1,
        buf,
    }))
    .unwrap();
    done.result.unwrap();
    assert!(done.buf[..512].iter().all(|&b| b == 0));
}
