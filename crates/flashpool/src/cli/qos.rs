//! `flashpool volume qos VOLUME [--iops N] [--bandwidth B] ...`: show or
//! change a volume's QoS limits live; the same flags on `volume create`.

use anyhow::{Result, bail};

use crate::api_types::{QosInfo, QosRequest, Rate};
use crate::client::Client;
use crate::units::human_bytes;

/// The limits a command sets (0: unlimited; absent: unchanged).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct QosArgs {
    /// Commands per second, reads and writes together (0: unlimited).
    #[arg(long)]
    pub iops: Option<u64>,
    /// Read commands per second.
    #[arg(long)]
    pub read_iops: Option<u64>,
    /// Write commands per second (Write Zeroes and Deallocate count too).
    #[arg(long)]
    pub write_iops: Option<u64>,
    /// Bytes per second, reads and writes together, e.g. 20MiB or 20000000 (0: unlimited).
    #[arg(long)]
    pub bandwidth: Option<String>,
    /// Bytes read per second.
    #[arg(long)]
    pub read_bandwidth: Option<String>,
    /// Bytes written per second.
    #[arg(long)]
    pub write_bandwidth: Option<String>,
    /// How far an idle volume may run ahead of each limit, e.g. 100ms (the default) or 1s.
    #[arg(long)]
    pub burst: Option<String>,
}

impl QosArgs {
    /// The request these flags make; None when no flag was given.
    pub fn request(&self, clear: bool) -> Result<Option<QosRequest>> {
        let rate = |s: &Option<String>| {
            s.as_ref().map(|t| match t.trim().parse::<u64>() {
                Ok(n) => Rate::Number(n),
                Err(_) => Rate::Text(t.clone()),
            })
        };
        let burst_ms = match &self.burst {
            None => None,
            Some(b) => {
                let d = crate::units::parse_duration(b)?;
                let ms = d.as_millis();
                if d.as_nanos() % 1_000_000 != 0 || ms == 0 || ms > u128::from(u32::MAX) {
                    bail!("--burst {b}: give whole milliseconds from 1ms to 60s, e.g. 100ms");
                }
                Some(ms as u32)
            }
        };
        let r = QosRequest {
            iops: self.iops,
            read_iops: self.read_iops,
            write_iops: self.write_iops,
            bandwidth: rate(&self.bandwidth),
            read_bandwidth: rate(&self.read_bandwidth),
            write_bandwidth: rate(&self.write_bandwidth),
            burst_ms,
            clear,
        };
        let any = clear
            || r.iops.is_some()
            || r.read_iops.is_some()
            || r.write_iops.is_some()
            || r.bandwidth.is_some()
            || r.read_bandwidth.is_some()
            || r.write_bandwidth.is_some()
            || r.burst_ms.is_some();
        Ok(any.then_some(r))
    }
}

/// Shows (no flags) or changes a volume's limits.
pub fn qos(c: &Client, name: &str, args: &QosArgs, clear: bool) -> Result<crate::client::Answer> {
    let path = format!("/volumes/{}/qos", crate::client::segment(name));
    match args.request(clear)? {
        None => c.get(&path),
        Some(r) => c.post(&path, Some(&r)),
    }
}

/// `volume v: iops 500, bandwidth 19.1 MiB/s, burst 100 ms; held 1.2 s (340 commands)`.
pub fn qos_text(q: &QosInfo) -> String {
    let l = &q.limits;
    let mut parts = Vec::new();
    for (n, v) in [
        ("iops", l.iops),
        ("read iops", l.read_iops),
        ("write iops", l.write_iops),
    ] {
        if v > 0 {
            parts.push(format!("{n} {v}"));
        }
    }
    for (n, v) in [
        ("bandwidth", l.bandwidth),
        ("read bandwidth", l.read_bandwidth),
        ("write bandwidth", l.write_bandwidth),
    ] {
        if v > 0 {
            parts.push(format!("{n} {}/s", human_bytes(v)));
        }
    }
    let limits = if q.unlimited {
        "unlimited".to_string()
    } else {
        parts.push(format!("burst {} ms", l.burst_ms));
        parts.join(", ")
    };
    format!(
        "volume {}: QoS {limits}; held {:.3} s in all ({} commands)",
        q.volume, q.throttled_seconds, q.throttled_commands
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_make_a_request_only_when_given() {
        assert!(QosArgs::default().request(false).unwrap().is_none());
        let r = QosArgs::default().request(true).unwrap().unwrap();
        assert!(r.clear && r.iops.is_none());
        let a = QosArgs {
            iops: Some(500),
            bandwidth: Some("20MiB".into()),
            write_bandwidth: Some("20000000".into()),
            burst: Some("250ms".into()),
            ..Default::default()
        };
        let r = a.request(false).unwrap().unwrap();
        assert_eq!(r.iops, Some(500));
        assert_eq!(r.bandwidth, Some(Rate::Text("20MiB".into())));
        assert_eq!(r.write_bandwidth, Some(Rate::Number(20_000_000)));
        assert_eq!(r.burst_ms, Some(250));
        let bad = QosArgs {
            burst: Some("0.5ms".into()),
            ..Default::default()
        };
        assert!(bad.request(false).is_err());
    }
}
