//! `[transport]` and `[[listener]]`: the NVMe/TCP target's limits and the
//! addresses it listens on, checked and turned into the target's config.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use anyhow::{Result, bail};
use nvmf_target::{ListenerConfig, ListenerKind, TransportConfig};
use serde::Deserialize;

use super::daemon::NodeSection;
use super::tls;
use super::values::{Size, range};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportSection {
    pub max_queue_depth: Option<u32>,
    pub max_io_queues: Option<u32>,
    pub in_capsule_data: Option<Size>,
    pub max_transfer: Option<Size>,
    pub max_h2c_data: Option<Size>,
    pub header_digest: Option<bool>,
    pub data_digest: Option<bool>,
    pub kato_max_ms: Option<u32>,
    /// A host that must authenticate and has not within this long after a
    /// queue's Connect loses that queue.
    pub auth_timeout_ms: Option<u32>,
}

impl Default for TransportSection {
    fn default() -> Self {
        toml::from_str("").expect("empty transport section")
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSection {
    pub address: String,
    pub port: u16,
    #[serde(default = "io_kind")]
    pub kind: String,
    /// TLS 1.3 (TP 8011): "none" (default), "optional" or "required".
    pub tls: Option<String>,
}

fn io_kind() -> String {
    "io".into()
}

/// The target's limits, from `[transport]` and the reactors of `[node]`.
pub fn transport(n: &NodeSection, t: &TransportSection) -> Result<TransportConfig> {
    let d = TransportConfig::default();
    // All configured CPUs, not just those in this process's affinity mask
    // (`taskset -c 0 flashpool serve` may still pin reactors elsewhere).
    // SAFETY: sysconf has no memory effects.
    let ncpu = match unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) } {
        n if n > 0 => n as usize,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    for (i, &c) in n.cpus.iter().enumerate() {
        if c >= ncpu {
            bail!(
                "config: node.cpus[{i}] = {c} does not exist on this machine ({ncpu} CPUs: 0..{})",
                ncpu - 1
            );
        }
    }
    let max_transfer = t
        .max_transfer
        .map_or(u64::from(d.max_transfer), Size::bytes);
    if !max_transfer.is_power_of_two() || !(4096..=8 << 20).contains(&max_transfer) {
        bail!(
            "config: transport.max_transfer = {max_transfer} must be a power of two from 4KiB to 8MiB"
        );
    }
    let icd = t
        .in_capsule_data
        .map_or(u64::from(d.in_capsule_data), Size::bytes);
    if icd > 128 * 1024 || !icd.is_multiple_of(16) {
        bail!(
            "config: transport.in_capsule_data = {icd} must be a multiple of 16 up to 131072 (128KiB)"
        );
    }
    let h2c = t
        .max_h2c_data
        .map_or(u64::from(d.max_h2c_data), Size::bytes);
    if h2c < 4096 || !h2c.is_multiple_of(4) || h2c > 16 << 20 {
        bail!("config: transport.max_h2c_data = {h2c} must be a multiple of 4 from 4096 to 16MiB");
    }
    Ok(TransportConfig {
        max_queue_depth: range(
            "transport.max_queue_depth",
            t.max_queue_depth.unwrap_or(128),
            2,
            1024,
        )? as u16,
        max_io_queues: range(
            "transport.max_io_queues",
            t.max_io_queues.unwrap_or(8),
            1,
            64,
        )? as u16,
        in_capsule_data: icd as u32,
        max_transfer: max_transfer as u32,
        max_h2c_data: h2c as u32,
        header_digest: t.header_digest.unwrap_or(true),
        data_digest: t.data_digest.unwrap_or(true),
        kato_max_ms: range(
            "transport.kato_max_ms",
            t.kato_max_ms.unwrap_or(120_000),
            1000,
            3_600_000,
        )?,
        reactors: if n.reactors == 0 {
            ncpu.min(64)
        } else {
            range("node.reactors", n.reactors, 1, 64)?
        },
        cpus: n.cpus.clone(),
        poll_us: range("node.poll_us", n.poll_us, 0, 10_000)?,
        auth_timeout_ms: range(
            "transport.auth_timeout_ms",
            t.auth_timeout_ms.unwrap_or(30_000),
            1000,
            600_000,
        )?,
    })
}

/// The listeners; none given: I/O on 127.0.0.1:4420, discovery on 8009.
pub fn listeners(sections: &[ListenerSection]) -> Result<Vec<ListenerConfig>> {
    if sections.is_empty() {
        return Ok(vec![
            ListenerConfig {
                addr: "127.0.0.1:4420".parse().expect("addr"),
                kind: ListenerKind::Io,
                tls: nvmf_target::TlsMode::None,
            },
            ListenerConfig {
                addr: "127.0.0.1:8009".parse().expect("addr"),
                kind: ListenerKind::Discovery,
                tls: nvmf_target::TlsMode::None,
            },
        ]);
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for (i, l) in sections.iter().enumerate() {
        let ip: IpAddr = l.address.parse().map_err(|_| {
            anyhow::anyhow!(
                "config: listener[{i}].address = {:?} is not an IP address; use e.g. \"127.0.0.1\" or \"0.0.0.0\"",
                l.address
            )
        })?;
        let kind = match l.kind.as_str() {
            "io" => ListenerKind::Io,
            "discovery" => ListenerKind::Discovery,
            k => {
                bail!("config: listener[{i}].kind = {k:?} is unknown; use \"io\" or \"discovery\"")
            }
        };
        let addr = SocketAddr::new(ip, l.port);
        if !seen.insert(addr) {
            bail!("config: listener[{i}] {addr} is listed twice; remove one");
        }
        let tls = tls::listener_mode(&format!("listener[{i}].tls"), l.tls.as_deref())?;
        out.push(ListenerConfig { addr, kind, tls });
    }
    Ok(out)
}
