//! QoS through the command core: a limited namespace's commands are held
//! (not failed) at its rate, while an unlimited namespace on the same queue
//! runs at once beside them.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use blockdev::MemDevice;
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
