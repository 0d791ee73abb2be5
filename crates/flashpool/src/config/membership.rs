//! `[cluster]`: membership in a cluster whose state lives in etcd. Without
//! it the node runs alone from its TOML and its state directory.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Result, bail};
use serde::Deserialize;

use nvmf_target::ListenerConfig;
use nvmf_target::ListenerKind;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// The cluster's name: its keys live under `/flashpool/<name>/`.
    pub name: String,
    /// etcd client URLs (`http://ADDR:PORT`), every member of the etcd cluster.
    pub etcd: Vec<String>,
    /// The ownership lease. An owner that cannot refresh it steps down
    /// before it expires; a silent owner's volumes move after it expires.
    #[serde(default = "d_ttl")]
    pub lease_ttl_ms: u64,
    /// The address hosts and other nodes use for this node's portals
    /// (default: the I/O listener's address).
    pub advertise: Option<String>,
    /// `ADDR:PORT` of the liveness listener, through which other nodes see
    /// this process die at once (default `<advertise>:4431`).
    pub liveness: Option<String>,
}

fn d_ttl() -> u64 {
    2000
}

/// `[cluster]`, checked.
#[derive(Debug, Clone)]
pub struct Membership {
    pub name: String,
    pub etcd: Vec<String>,
    pub lease_ttl: Duration,
    /// The I/O and discovery portals as others reach them.
    pub io: Vec<SocketAddr>,
    pub discovery: Vec<SocketAddr>,
    pub liveness: SocketAddr,
}

/// Checks `[cluster]` against the listeners.
pub fn membership(c: &ClusterSection, listeners: &[ListenerConfig]) -> Result<Membership> {
    crate::node::check_name("config: cluster.name:", &c.name)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if c.etcd.is_empty() {
        bail!(
            "config: cluster.etcd is empty; list the etcd client URLs, e.g. [\"http://10.0.0.1:2379\"]"
        );
    }
    for (i, e) in c.etcd.iter().enumerate() {
        let rest = e.strip_prefix("http://").unwrap_or(e);
        if rest.parse::<SocketAddr>().is_err() && !rest.contains(':') {
            bail!("config: cluster.etcd[{i}] = {e:?} is not http://ADDR:PORT");
        }
        if e.starts_with("https://") {
            bail!(
                "config: cluster.etcd[{i}] = {e:?}: TLS to etcd is not supported yet; use http://"
            );
        }
    }
    super::values::range("cluster.lease_ttl_ms", c.lease_ttl_ms, 1000, 60_000)?;
    let advertise: Option<IpAddr> = match &c.advertise {
        Some(a) => Some(a.parse().map_err(|_| {
            anyhow::anyhow!("config: cluster.advertise = {a:?} is not an IP address")
        })?),
        None => None,
    };
    let portals = |kind: ListenerKind| -> Result<Vec<SocketAddr>> {
        let mut v = Vec::new();
        for l in listeners.iter().filter(|l| l.kind == kind) {
            let ip = match advertise {
                Some(ip) => ip,
                None if l.addr.ip().is_unspecified() => bail!(
                    "config: a listener is on {} but [cluster] has no advertise address; \
                     set cluster.advertise to the address hosts and nodes reach this node on",
                    l.addr
                ),
                None => l.addr.ip(),
            };
            v.push(SocketAddr::new(ip, l.addr.port()));
        }
        Ok(v)
    };
    let io = portals(ListenerKind::Io)?;
    let discovery = portals(ListenerKind::Discovery)?;
    let Some(first) = io.first() else {
        bail!("config: [cluster] needs an I/O [[listener]]: the volumes are served on it");
    };
    let liveness = match &c.liveness {
        Some(l) => l.parse().map_err(|_| {
            anyhow::anyhow!(
                "config: cluster.liveness = {l:?} is not ADDR:PORT, e.g. \"10.0.0.11:4431\""
            )
        })?,
        None => SocketAddr::new(first.ip(), 4431),
    };
    Ok(Membership {
        name: c.name.clone(),
        etcd: c.etcd.clone(),
        lease_ttl: Duration::from_millis(c.lease_ttl_ms),
        io,
        discovery,
        liveness,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(a: &str, kind: ListenerKind) -> ListenerConfig {
        ListenerConfig {
            addr: a.parse().unwrap(),
            kind,
            tls: nvmf_target::TlsMode::None,
        }
    }

    fn sec(t: &str) -> ClusterSection {
        toml::from_str(t).unwrap()
    }

    #[test]
    fn portals_come_from_listeners_or_advertise() {
        let ls = [
            l("10.0.0.5:4420", ListenerKind::Io),
            l("10.0.0.5:8009", ListenerKind::Discovery),
        ];
        let m = membership(
            &sec("name = \"c\"\netcd = [\"http://10.0.0.1:2379\"]\n"),
            &ls,
        )
        .unwrap();
        assert_eq!(m.io, ["10.0.0.5:4420".parse().unwrap()]);
        assert_eq!(m.discovery, ["10.0.0.5:8009".parse().unwrap()]);
        assert_eq!(m.liveness, "10.0.0.5:4431".parse().unwrap());
        assert_eq!(m.lease_ttl, Duration::from_secs(2));
        let any = [l("0.0.0.0:4420", ListenerKind::Io)];
        let e = membership(&sec("name = \"c\"\netcd = [\"http://e:2379\"]\n"), &any)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cluster.advertise"), "{e}");
        let m = membership(
            &sec("name = \"c\"\netcd = [\"http://e:2379\"]\nadvertise = \"10.1.1.1\"\n"),
            &any,
        )
        .unwrap();
        assert_eq!(m.io, ["10.1.1.1:4420".parse().unwrap()]);
    }

    #[test]
    fn bad_keys_are_named() {
        let ls = [l("10.0.0.5:4420", ListenerKind::Io)];
        let err = |t: &str| membership(&sec(t), &ls).unwrap_err().to_string();
        assert!(err("name = \"c\"\netcd = []\n").contains("cluster.etcd"));
        assert!(
            err("name = \"c\"\netcd = [\"x:1\"]\nlease_ttl_ms = 10\n").contains("lease_ttl_ms")
        );
        assert!(
            err("name = \"c\"\netcd = [\"x:1\"]\nliveness = \"nope\"\n")
                .contains("cluster.liveness")
        );
        assert!(err("name = \"c/d\"\netcd = [\"x:1\"]\n").contains("cluster.name"));
    }
}
