//! Per-namespace QoS: IOPS and bandwidth limits (read, write and total)
//! with a burst, applied on the I/O path without a lock shared by queues.
//!
//! Each limit is a token bucket kept as GCRA (the generic cell rate
//! algorithm): one atomic per limit holds the bucket's theoretical arrival
//! time (TAT), the instant at which everything admitted so far has been
//! paid for at the limit's rate. A command conforms while TAT is at most
//! `burst` ahead of now; admitting it moves TAT on by its cost. A command
//! that does not conform is not failed: it reserves its place (TAT moves on
//! anyway) and is held until `TAT - burst`, so held commands run in the
//! order they came, at the rate, however many queues share the namespace.
//!
//! Queues take from the shared bucket in batches: a conforming queue takes
//! about a millisecond of the rate at once into its own [`QosCache`] and
//! spends it without touching the shared atomics, so a namespace busy on
//! many queues does not bounce one cache line per command. The batch is
//! paid for when taken, so it never lets more through than the rate (a
//! queue that goes quiet with tokens left only under-uses the limit).
//!
//! Unlimited namespaces pay one relaxed load of [`NsQos::enabled`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How much of each limit a full bucket holds when no burst is given.
pub const DEFAULT_BURST_MS: u32 = 100;
/// The largest burst: a minute of the limit.
pub const MAX_BURST_MS: u32 = 60_000;
/// A queue takes this much of the rate from the shared bucket at once.
const BATCH_NS: u64 = 1_000_000;

/// The limits of one namespace; 0 is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosLimits {
    /// Commands per second, reads and writes together.
    pub iops: u64,
    pub read_iops: u64,
    pub write_iops: u64,
    /// Bytes per second, reads and writes together.
    pub bandwidth: u64,
    pub read_bandwidth: u64,
    pub write_bandwidth: u64,
    /// How long a full bucket lasts at the limit: an idle namespace may
    /// run this much of each limit ahead before being held (0: default).
    pub burst_ms: u32,
}

/// The six limits as bucket indexes.
const IOPS: usize = 0;
const READ_IOPS: usize = 1;
const WRITE_IOPS: usize = 2;
const BW: usize = 3;
const READ_BW: usize = 4;
const WRITE_BW: usize = 5;
const N: usize = 6;

impl QosLimits {
    fn rates(&self) -> [u64; N] {
        [
            self.iops,
            self.read_iops,
            self.write_iops,
            self.bandwidth,
            self.read_bandwidth,
            self.write_bandwidth,
        ]
    }

    /// No limit set.
    pub fn is_unlimited(&self) -> bool {
        self.rates().iter().all(|&r| r == 0)
    }

    /// The burst in effect.
    pub fn burst(&self) -> Duration {
        let ms = if self.burst_ms == 0 {
            DEFAULT_BURST_MS
        } else {
            self.burst_ms.min(MAX_BURST_MS)
        };
        Duration::from_millis(u64::from(ms))
    }
}

/// What a command costs against each limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QosCost([u64; N]);

impl QosCost {
    /// A read of `bytes`: its side, the total, and their bandwidth.
    pub fn read(bytes: u64) -> QosCost {
        let mut c = [0u64; N];
        (c[IOPS], c[READ_IOPS], c[BW], c[READ_BW]) = (1, 1, bytes, bytes);
        QosCost(c)
    }

    /// A write of `bytes` (0 for Write Zeroes and Dataset Management, which
    /// count as write commands without bytes: no data moves).
    pub fn write(bytes: u64) -> QosCost {
        let mut c = [0u64; N];
        (c[IOPS], c[WRITE_IOPS], c[BW], c[WRITE_BW]) = (1, 1, bytes, bytes);
        QosCost(c)
    }
}

/// A namespace's limits and buckets, shared by every queue (and every
/// snapshot of the namespace list).
pub struct NsQos {
    on: AtomicBool,
    /// Bumped on every change: queues drop what they took under old limits.
    generation: AtomicU64,
    /// Per limit, units (commands or bytes) per second; 0: none.
    rate: [AtomicU64; N],
    burst_ns: AtomicU64,
    /// Per limit, the theoretical arrival time (ns on [`clock_ns`]).
    tat: [AtomicU64; N],
    /// The limits as set, for reading back (never on the I/O path).
    limits: Mutex<QosLimits>,
    /// Held commands' waits added up, and how many were held.
    throttled_ns: AtomicU64,
    throttled_cmds: AtomicU64,
}

impl Default for NsQos {
    fn default() -> Self {
        NsQos {
            on: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            rate: Default::default(),
            burst_ns: AtomicU64::new(u64::from(DEFAULT_BURST_MS) * 1_000_000),
            tat: Default::default(),
            limits: Mutex::new(QosLimits::default()),
            throttled_ns: AtomicU64::new(0),
            throttled_cmds: AtomicU64::new(0),
        }
    }
}

/// Nanoseconds since this process first asked: the buckets' clock.
pub fn clock_ns(at: Instant) -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(|| Instant::now() - Duration::from_secs(1));
    u64::try_from(at.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX)
}

/// The clock instant of [`clock_ns`] value `ns`.
pub fn instant_of(ns: u64, now: Instant) -> Instant {
    let cur = clock_ns(now);
    if ns >= cur {
        now + Duration::from_nanos(ns - cur)
    } else {
        now - Duration::from_nanos(cur - ns)
    }
}

/// Time `units` take at `rate` units per second, rounded up.
fn cost_ns(units: u64, rate: u64) -> u64 {
    let ns = (u128::from(units) * 1_000_000_000).div_ceil(u128::from(rate.max(1)));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

impl NsQos {
    pub fn new(limits: QosLimits) -> Self {
        let q = NsQos::default();
        q.set(limits);
        q
    }

    /// Whether any limit is set: the one check an unlimited namespace pays.
    #[inline]
    pub fn enabled(&self) -> bool {
        self.on.load(Relaxed)
    }

    /// The limits as set.
    pub fn limits(&self) -> QosLimits {
        *self.limits.lock()
    }

    /// Changes the limits live. A limit whose rate changes starts again
    /// with a full bucket; commands already held keep their place.
    pub fn set(&self, limits: QosLimits) {
        let mut cur = self.limits.lock();
        let old = cur.rates();
        let new = limits.rates();
        self.burst_ns
            .store(limits.burst().as_nanos() as u64, Relaxed);
        for i in 0..N {
            if old[i] != new[i] {
                self.tat[i].store(0, Relaxed);
            }
            self.rate[i].store(new[i], Relaxed);
        }
        self.on.store(!limits.is_unlimited(), Relaxed);
        self.generation.fetch_add(1, Relaxed);
        *cur = limits;
    }

    /// Time held commands waited in all, and how many were held.
    pub fn throttled(&self) -> (Duration, u64) {
        (
            Duration::from_nanos(self.throttled_ns.load(Relaxed)),
            self.throttled_cmds.load(Relaxed),
        )
    }

    /// Admits a command costing `cost` at `now` (ns on [`clock_ns`]),
    /// spending the queue's `cache` first. Returns when it may start: now
    /// or later (it is then counted as throttled).
    pub fn admit(&self, cache: &mut QosCache, cost: &QosCost, now: u64) -> u64 {
        let generation = self.generation.load(Relaxed);
        if cache.generation != generation {
            cache.generation = generation;
            cache.tokens = [0; N];
        }
        let burst = self.burst_ns.load(Relaxed);
        let mut go = now;
        for i in 0..N {
            let need = cost.0[i];
            if need == 0 {
                continue;
            }
            let rate = self.rate[i].load(Relaxed);
            if rate == 0 {
                continue;
            }
            if cache.tokens[i] >= need {
                cache.tokens[i] -= need;
                continue;
            }
            let deficit = need - cache.tokens[i];
            cache.tokens[i] = 0;
            let batch = u64::try_from(u128::from(rate) * u128::from(BATCH_NS) / 1_000_000_000)
                .unwrap_or(u64::MAX);
            let mut tat = self.tat[i].load(Relaxed);
            loop {
                let allowed = tat.saturating_sub(burst);
                let (next, extra, at) = if allowed <= now {
                    let take = deficit.saturating_add(batch);
                    (tat.max(now).saturating_add(cost_ns(take, rate)), batch, now)
                } else {
                    (tat.saturating_add(cost_ns(deficit, rate)), 0, allowed)
                };
                match self.tat[i].compare_exchange_weak(tat, next, Relaxed, Relaxed) {
                    Ok(_) => {
                        cache.tokens[i] = extra;
                        go = go.max(at);
                        break;
                    }
                    Err(t) => tat = t,
                }
            }
        }
        if go > now {
            self.throttled_ns.fetch_add(go - now, Relaxed);
            self.throttled_cmds.fetch_add(1, Relaxed);
        }
        go
    }
}

/// A queue's tokens taken from one namespace's buckets.
#[derive(Debug, Clone, Default)]
pub struct QosCache {
    generation: u64,
    tokens: [u64; N],
}

/// A queue's caches, one per limited namespace it has served (few: a
/// linear search). Keyed by the namespace's `NsQos` address.
#[derive(Default)]
pub struct QosCaches(Vec<(usize, QosCache)>);

impl QosCaches {
    pub fn get(&mut self, qos: &NsQos) -> &mut QosCache {
        let key = qos as *const NsQos as usize;
        let i = match self.0.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                self.0.push((key, QosCache::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[i].1
    }

    /// Keeps only the caches of namespaces in `live` (after a reload of
    /// the namespace list), so that a new namespace at a freed address
    /// starts empty.
    pub fn retain<'a>(&mut self, live: impl Iterator<Item = &'a Arc<NsQos>> + Clone) {
        self.0
            .retain(|(k, _)| live.clone().any(|q| Arc::as_ptr(q) as usize == *k));
    }
}

#[cfg(test)]
#[path = "qos_tests.rs"]
mod tests;
