//! Counters for metrics: plain atomics the I/O path bumps and a scraper
//! reads (the node renders them as Prometheus text). Nothing here knows of
//! an exporter, and nothing is looked up by name on the I/O path: each
//! namespace carries its own [`NsIoStats`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the latency buckets, in nanoseconds: 50 µs to 1 s, the
/// range of flash I/O from a cache hit to a stalled rebuild. Above the last
/// one is the `+Inf` bucket.
pub const LATENCY_BOUNDS_NS: [u64; 14] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
];

/// A latency histogram with fixed buckets: one bucket add and one sum add
/// per observation.
#[derive(Default)]
pub struct LatencyHistogram {
    /// Per bucket (not cumulative); the last is above every bound.
    buckets: [AtomicU64; LATENCY_BOUNDS_NS.len() + 1],
    sum_ns: AtomicU64,
}

/// What a [`LatencyHistogram`] held when read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Cumulative counts per bound of [`LATENCY_BOUNDS_NS`] (`le`).
    pub cumulative: Vec<u64>,
    /// Every observation (the `+Inf` bucket).
    pub count: u64,
    pub sum_ns: u64,
}

impl LatencyHistogram {
    #[inline]
    pub fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = LATENCY_BOUNDS_NS
            .iter()
            .position(|&b| ns <= b)
            .unwrap_or(LATENCY_BOUNDS_NS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// Read while observations go on: the buckets are read one by one, so
    /// the count is their sum (never less than a bucket below it).
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut acc = 0;
        let mut cumulative = Vec::with_capacity(LATENCY_BOUNDS_NS.len());
        for b in &self.buckets[..LATENCY_BOUNDS_NS.len()] {
            acc += b.load(Relaxed);
            cumulative.push(acc);
        }
        let count = acc + self.buckets[LATENCY_BOUNDS_NS.len()].load(Relaxed);
        HistogramSnapshot {
            cumulative,
            count,
            sum_ns: self.sum_ns.load(Relaxed),
        }
    }
}

/// Per namespace: host Read and Write commands as the target completed
/// them, and their latency from the command's arrival (write data included)
/// to the device's completion.
#[derive(Default)]
pub struct NsIoStats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    /// Read or Write commands the device failed.
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub read_latency: LatencyHistogram,
    pub write_latency: LatencyHistogram,
}

/// Target-wide transport counters.
#[derive(Default)]
pub struct TargetCounters {
    /// TCP connections accepted (each becomes one queue).
    pub connections_opened: AtomicU64,
    pub connections_closed: AtomicU64,
    /// Connections ended by a fatal transport error (C2HTermReq sent):
    /// malformed PDUs, header digest mismatches.
    pub protocol_errors: AtomicU64,
    pub header_digest_errors: AtomicU64,
    /// Command capsules or host data whose data digest did not match.
    pub data_digest_errors: AtomicU64,
    /// TLS handshakes that set up a secure channel, and those refused
    /// (unknown identity, wrong key, not TLS on a TLS-only listener, timeout).
    pub tls_handshakes: AtomicU64,
    pub tls_handshake_failures: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_lands_in_its_bucket_and_counts_add_up() {
        let h = LatencyHistogram::default();
        h.record(Duration::from_micros(10)); // <= 50 µs
        h.record(Duration::from_micros(50)); // on the bound: that bucket
        h.record(Duration::from_micros(51)); // <= 100 µs
        h.record(Duration::from_millis(3)); // <= 5 ms
        h.record(Duration::from_secs(5)); // +Inf only
        let s = h.snapshot();
        assert_eq!(s.cumulative.len(), LATENCY_BOUNDS_NS.len());
        assert_eq!(s.cumulative[0], 2);
        assert_eq!(s.cumulative[1], 3);
        assert_eq!(s.cumulative[5], 3); // 2.5 ms
        assert_eq!(s.cumulative[6], 4); // 5 ms
        assert_eq!(*s.cumulative.last().unwrap(), 4);
        assert_eq!(s.count, 5);
        assert_eq!(
            s.sum_ns,
            10_000 + 50_000 + 51_000 + 3_000_000 + 5_000_000_000
        );
        assert!(s.cumulative.windows(2).all(|w| w[0] <= w[1]));
    }
}
