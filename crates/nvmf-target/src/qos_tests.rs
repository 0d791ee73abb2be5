//! The buckets driven with a synthetic clock: rate, burst, refill, live
//! change, several queues on one namespace, unlimited.

use super::*;

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

fn read(bytes: u32) -> QosCost {
    QosCost::read(u64::from(bytes))
}

fn write(bytes: u32) -> QosCost {
    QosCost::write(u64::from(bytes))
}

/// Offers `n` commands at `at` on `caches` in turn; how many may start
/// by `by`, and the latest start.
fn offer(q: &NsQos, caches: &mut [QosCache], cost: QosCost, at: u64, n: usize, by: u64) -> usize {
    let k = caches.len();
    (0..n)
        .filter(|i| q.admit(&mut caches[i % k], &cost, at) <= by)
        .count()
}

#[test]
fn unlimited_admits_at_once_and_is_off() {
    let q = NsQos::default();
    assert!(!q.enabled());
    let mut c = QosCache::default();
    for _ in 0..10_000 {
        assert_eq!(q.admit(&mut c, &read(4096), 5 * S), 5 * S);
    }
    assert_eq!(q.throttled(), (Duration::ZERO, 0));
    // a bandwidth-only limit leaves IOPS alone, and the reverse
    q.set(QosLimits {
        write_iops: 10,
        ..Default::default()
    });
    assert!(q.enabled());
    assert_eq!(
        offer(&q, &mut [QosCache::default()], read(4096), S, 1000, S),
        1000
    );
}

#[test]
fn the_rate_holds_over_a_second_with_a_full_queue() {
    for iops in [500u64, 2000, 100_000] {
        let q = NsQos::new(QosLimits {
            iops,
            burst_ms: 10,
            ..Default::default()
        });
        // far more offered than the limit, all at t = 1 s
        let n = offer(
            &q,
            &mut [QosCache::default()],
            read(4096),
            S,
            3 * iops as usize,
            2 * S,
        );
        let burst = iops / 100;
        let batch = iops / 1000;
        assert!(
            n as u64 >= iops && n as u64 <= iops + burst + batch + 1,
            "{iops} IOPS: {n} started in 1 s"
        );
    }
}

#[test]
fn held_commands_start_in_order_at_the_rate() {
    let q = NsQos::new(QosLimits {
        iops: 1000,
        burst_ms: 1,
        ..Default::default()
    });
    let mut c = QosCache::default();
    let starts: Vec<u64> = (0..50).map(|_| q.admit(&mut c, &read(512), S)).collect();
    assert!(starts.windows(2).all(|w| w[0] <= w[1]));
    // one millisecond apart once the burst is spent
    let gaps: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps[5..].iter().all(|&g| g == MS), "{gaps:?}");
    let (waited, held) = q.throttled();
    assert!(held >= 45, "{held}");
    assert!(waited >= Duration::from_millis(45 * 44 / 2), "{waited:?}");
}

#[test]
fn an_idle_namespace_gets_its_burst_then_refills() {
    let q = NsQos::new(QosLimits {
        iops: 1000,
        burst_ms: 100,
        ..Default::default()
    });
    let mut c = [QosCache::default()];
    // 100 ms of the limit at once (+1: GCRA admits one more at the edge, + a batch)
    let n = offer(&q, &mut c, read(512), S, 300, S);
    assert!((100..=102).contains(&n), "{n}");
    // drained: nothing more now
    assert_eq!(offer(&q, &mut c, read(512), S, 1, S), 0);
    // 200 ms later the bucket is full again (the 200 held ones above
    // started meanwhile), then 50 ms idle gives about 50
    let q = NsQos::new(QosLimits {
        iops: 1000,
        burst_ms: 100,
        ..Default::default()
    });
    let mut c = [QosCache::default()];
    offer(&q, &mut c, read(512), S, 101, S);
    let n = offer(&q, &mut c, read(512), S + 50 * MS, 200, S + 50 * MS);
    assert!((49..=52).contains(&n), "{n}");
}

#[test]
fn bandwidth_limits_bytes() {
    let q = NsQos::new(QosLimits {
        bandwidth: 20_000_000,
        burst_ms: 10,
        ..Default::default()
    });
    let n = offer(
        &q,
        &mut [QosCache::default()],
        read(128 << 10),
        S,
        1000,
        2 * S,
    );
    let bytes = n as u64 * (128 << 10);
    assert!(
        (20_000_000..=20_000_000 + 200_000 + 20_000 + (128 << 10)).contains(&bytes),
        "{bytes}"
    );
}

#[test]
fn read_and_write_limits_hold_their_side_only() {
    let q = NsQos::new(QosLimits {
        read_iops: 100,
        write_bandwidth: 1_000_000,
        burst_ms: 10,
        ..Default::default()
    });
    let mut c = [QosCache::default()];
    let reads = offer(&q, &mut c, read(4096), S, 1000, 2 * S);
    assert!((100..=102).contains(&reads), "{reads}");
    // writes pay bytes only: 1 MB/s of 4 KiB is 244 a second
    let writes = offer(&q, &mut c, write(4096), S, 1000, 2 * S);
    assert!((244..=250).contains(&writes), "{writes}");
}

#[test]
fn queues_share_the_namespace_rate() {
    let q = NsQos::new(QosLimits {
        iops: 10_000,
        burst_ms: 10,
        ..Default::default()
    });
    let mut caches = vec![QosCache::default(); 8];
    let n = offer(&q, &mut caches, read(4096), S, 50_000, 2 * S);
    // each queue may hold one batch (10) beyond the rate and the burst (100)
    assert!((10_000..=10_000 + 100 + 8 * 10 + 1).contains(&n), "{n}");
}

#[test]
fn a_live_change_applies_to_the_next_command() {
    let q = NsQos::new(QosLimits {
        iops: 100_000,
        burst_ms: 10,
        ..Default::default()
    });
    let mut c = [QosCache::default()];
    offer(&q, &mut c, read(4096), S, 10, S);
    q.set(QosLimits {
        iops: 100,
        burst_ms: 10,
        ..Default::default()
    });
    assert_eq!(q.limits().iops, 100);
    // tokens the queue took under the old limit are dropped
    let n = offer(&q, &mut c, read(4096), 2 * S, 1000, 3 * S);
    assert!((100..=102).contains(&n), "{n}");
    // cleared: unlimited again
    q.set(QosLimits::default());
    assert!(!q.enabled());
    assert_eq!(offer(&q, &mut c, read(4096), 4 * S, 1000, 4 * S), 1000);
}

#[test]
fn burst_is_bounded_and_defaulted() {
    assert_eq!(QosLimits::default().burst(), Duration::from_millis(100));
    let l = QosLimits {
        burst_ms: u32::MAX,
        ..Default::default()
    };
    assert_eq!(l.burst(), Duration::from_secs(60));
    // a huge rate never overflows the clock arithmetic
    let q = NsQos::new(QosLimits {
        bandwidth: u64::MAX,
        ..Default::default()
    });
    let mut c = QosCache::default();
    assert_eq!(q.admit(&mut c, &read(4096), S), S);
}
