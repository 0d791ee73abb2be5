//! Wrong tokens counted by address: an address (an IPv6 one by its /64)
//! that presents [`MAX_FAILURES`] within [`FAILURE_WINDOW`] is refused until
//! the window ends, in bounded memory.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Wrong tokens an address may present within [`FAILURE_WINDOW`].
pub const MAX_FAILURES: u32 = 10;
/// How long failures are counted, and how long an address that had too
/// many is refused.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Addresses whose failures are remembered at most (bounded memory: when
/// full, expired entries go first, then the oldest).
const MAX_TRACKED: usize = 4096;

/// Failed authentications by address (an IPv6 address by its /64).
#[derive(Default)]
pub(super) struct FailureLimiter {
    by_addr: HashMap<IpAddr, (Instant, u32)>,
}

fn limiter_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

impl FailureLimiter {
    /// How long `ip` is still refused, if it is.
    pub(super) fn blocked(&mut self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let key = limiter_key(ip);
        let &(first, n) = self.by_addr.get(&key)?;
        let age = now.duration_since(first);
        if age >= FAILURE_WINDOW {
            self.by_addr.remove(&key);
            return None;
        }
        (n >= MAX_FAILURES).then(|| FAILURE_WINDOW - age)
    }

    pub(super) fn fail(&mut self, ip: IpAddr, now: Instant) {
        let key = limiter_key(ip);
        if !self.by_addr.contains_key(&key) && self.by_addr.len() >= MAX_TRACKED {
            self.by_addr
                .retain(|_, (first, _)| now.duration_since(*first) < FAILURE_WINDOW);
            if self.by_addr.len() >= MAX_TRACKED
                && let Some(oldest) = self
                    .by_addr
                    .iter()
                    .min_by_key(|(_, (first, _))| *first)
                    .map(|(k, _)| *k)
            {
                self.by_addr.remove(&oldest);
            }
        }
        let e = self.by_addr.entry(key).or_insert((now, 0));
        if now.duration_since(e.0) >= FAILURE_WINDOW {
            *e = (now, 0);
        }
        e.1 = e.1.saturating_add(1);
    }
}

pub(super) fn limiter_key_eq(a: IpAddr, b: IpAddr) -> bool {
    let canon = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    canon(a) == canon(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limiter_blocks_after_max_failures_and_forgets_after_the_window() {
        let mut l = FailureLimiter::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..MAX_FAILURES - 1 {
            l.fail(ip, t0);
        }
        assert!(l.blocked(ip, t0).is_none());
        l.fail(ip, t0);
        assert!(l.blocked(ip, t0 + Duration::from_secs(1)).is_some());
        assert!(l.blocked("10.0.0.2".parse().unwrap(), t0).is_none());
        assert!(l.blocked(ip, t0 + FAILURE_WINDOW).is_none());
    }

    #[test]
    fn the_limiter_memory_is_bounded() {
        let mut l = FailureLimiter::default();
        let t0 = Instant::now();
        for i in 0..(MAX_TRACKED as u32 + 100) {
            l.fail(IpAddr::V4(i.into()), t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(l.by_addr.len(), MAX_TRACKED);
        // IPv6 addresses count by their /64.
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::2".parse().unwrap();
        assert_eq!(limiter_key(a), limiter_key(b));
    }
}
