//! The discovery controller's log: every subsystem this host may reach, on
//! every I/O listener, plus the discovery service itself.

use std::net::IpAddr;

use nvme_wire::fabrics::DISCOVERY_NQN;
use nvme_wire::fabrics::discovery::{self, Entry};

use crate::Target;
use crate::config::{ListenerKind, TlsMode};

/// Admin queue size hosts should ask for (ASQSZ).
pub const ADMIN_SQ_SIZE: u16 = 32;

/// `local_ip` is the address the host reached us on: a listener bound to a
/// wildcard address reports it instead, as the host could not connect to 0.0.0.0.
pub fn discovery_log(target: &Target, hostnqn: &str, local_ip: Option<IpAddr>) -> Vec<u8> {
    let listeners = target.listeners.read();
    let mut entries = Vec::new();
    for (i, l) in listeners.iter().enumerate() {
        let adrfam = if l.addr.is_ipv4() {
            discovery::ADRFAM_IPV4
        } else {
            discovery::ADRFAM_IPV6
        };
        let (treq, sectype) = match l.tls {
            TlsMode::None => (0, discovery::SECTYPE_NONE),
            TlsMode::Optional => (discovery::TREQ_NOT_REQUIRED, discovery::SECTYPE_TLS13),
            TlsMode::Required => (discovery::TREQ_REQUIRED, discovery::SECTYPE_TLS13),
        };
        let entry = |subtype, subnqn: &str| Entry {
            adrfam,
            subtype,
            treq: discovery::TREQ_DISABLE_SQFLOW | treq,
            sectype,
            portid: (i + 1) as u16,
            cntlid: nvme_wire::fabrics::CNTLID_DYNAMIC,
            asqsz: ADMIN_SQ_SIZE,
            trsvcid: l.addr.port().to_string(),
            subnqn: subnqn.to_string(),
            traddr: match (l.addr.ip().is_unspecified(), local_ip) {
                (true, Some(ip)) => ip.to_string(),
                _ => l.addr.ip().to_string(),
            },
        };
        match l.kind {
            ListenerKind::Io => {
                for s in target
                    .subsystems()
                    .iter()
                    .filter(|s| s.host_allowed(hostnqn))
                {
                    entries.push(entry(discovery::SUBTYPE_NVME, &s.nqn));
                }
            }
            ListenerKind::Discovery => {
                entries.push(entry(discovery::SUBTYPE_CURRENT_DISCOVERY, DISCOVERY_NQN));
            }
        }
    }
    let nlisteners = listeners.len();
    drop(listeners);
    // Cluster-wide subsystems on the other nodes' portals: a host that
    // discovers through any node learns every path.
    let peers = target.peer_portals();
    let cluster: Vec<_> = target
        .subsystems()
        .iter()
        .filter(|s| s.cluster_wide() && s.host_allowed(hostnqn))
        .cloned()
        .collect();
    for (i, p) in peers.iter().enumerate() {
        let adrfam = match p.traddr.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => discovery::ADRFAM_IPV6,
            _ => discovery::ADRFAM_IPV4,
        };
        for s in &cluster {
            entries.push(Entry {
                adrfam,
                subtype: discovery::SUBTYPE_NVME,
                treq: discovery::TREQ_DISABLE_SQFLOW,
                sectype: discovery::SECTYPE_NONE,
                portid: (nlisteners + i + 1) as u16,
                cntlid: nvme_wire::fabrics::CNTLID_DYNAMIC,
                asqsz: ADMIN_SQ_SIZE,
                trsvcid: p.trsvcid.clone(),
                subnqn: s.nqn.clone(),
                traddr: p.traddr.clone(),
            });
        }
    }
    let mut b = vec![0u8; discovery::log_len(entries.len())];
    discovery::encode_log(target.discovery_genctr(), &entries, &mut b);
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ListenerConfig, TransportConfig};
    use crate::subsystem::{Namespace, Subsystem};
    use std::sync::Arc;

    fn subsystem(nqn: &str, hosts: &[&str]) -> Arc<Subsystem> {
        let dev = Arc::new(blockdev::NullDevice::new(1 << 20, 512).unwrap());
        Arc::new(Subsystem::new(
            nqn.into(),
            "S".into(),
            "M".into(),
            hosts.is_empty(),
            hosts.iter().map(|h| h.to_string()).collect(),
            vec![Namespace::new(1, dev, [0; 16], [0; 16])],
        ))
    }

    #[test]
    fn lists_allowed_subsystems_with_the_reached_address() {
        let t = Target::new(
            TransportConfig::default(),
            vec![
                subsystem("nqn.a:open", &[]),
                subsystem("nqn.a:closed", &["nqn.h:1"]),
            ],
        );
        *t.listeners.write() = vec![
            ListenerConfig {
                addr: "0.0.0.0:4420".parse().unwrap(),
                kind: ListenerKind::Io,
                tls: crate::config::TlsMode::None,
            },
            ListenerConfig {
                addr: "127.0.0.1:8009".parse().unwrap(),
                kind: ListenerKind::Discovery,
                tls: crate::config::TlsMode::None,
            },
        ];
        let log = discovery_log(&t, "nqn.h:2", Some("10.1.2.3".parse().unwrap()));
        assert_eq!(log.len(), discovery::log_len(2));
        let e0 = Entry::decode(&log[1024..]).unwrap();
        assert_eq!(
            (e0.subnqn.as_str(), e0.traddr.as_str(), e0.trsvcid.as_str()),
            ("nqn.a:open", "10.1.2.3", "4420")
        );
        let e1 = Entry::decode(&log[2048..]).unwrap();
        assert_eq!(
            (e1.subtype, e1.traddr.as_str()),
            (discovery::SUBTYPE_CURRENT_DISCOVERY, "127.0.0.1")
        );
        let log = discovery_log(&t, "nqn.h:1", None);
        assert_eq!(log.len(), discovery::log_len(3));
    }

    #[test]
    fn cluster_wide_subsystems_are_listed_on_peer_portals() {
        let t = Target::new(
            TransportConfig::default(),
            vec![
                subsystem("nqn.a:vol", &[]),
                subsystem("nqn.a:local", &[]),
                subsystem("nqn.a:closed", &["nqn.h:1"]),
            ],
        );
        t.subsystem("nqn.a:vol").unwrap().set_cluster_wide(true);
        t.subsystem("nqn.a:closed").unwrap().set_cluster_wide(true);
        *t.listeners.write() = vec![ListenerConfig {
            addr: "10.0.0.1:4420".parse().unwrap(),
            kind: ListenerKind::Io,
            tls: crate::config::TlsMode::None,
        }];
        t.set_peer_portals(vec![
            crate::PeerPortal {
                traddr: "10.0.0.2".into(),
                trsvcid: "4420".into(),
            },
            crate::PeerPortal {
                traddr: "fd00::3".into(),
                trsvcid: "4421".into(),
            },
        ]);
        let entries = |hostnqn: &str| {
            let log = discovery_log(&t, hostnqn, None);
            let n = u64::from_le_bytes(log[8..16].try_into().unwrap()) as usize;
            assert_eq!(log.len(), discovery::log_len(n));
            (0..n)
                .map(|i| Entry::decode(&log[1024 * (i + 1)..]).unwrap())
                .map(|e| (e.subnqn, e.traddr, e.trsvcid, e.adrfam, e.portid))
                .collect::<Vec<_>>()
        };
        let v4 = discovery::ADRFAM_IPV4;
        let v6 = discovery::ADRFAM_IPV6;
        let e = |n: &str, a: &str, s: &str, f: u8, p: u16| (n.into(), a.into(), s.into(), f, p);
        // Local listener: every allowed subsystem; peers: the cluster-wide ones.
        assert_eq!(
            entries("nqn.h:2"),
            [
                e("nqn.a:vol", "10.0.0.1", "4420", v4, 1),
                e("nqn.a:local", "10.0.0.1", "4420", v4, 1),
                e("nqn.a:vol", "10.0.0.2", "4420", v4, 2),
                e("nqn.a:vol", "fd00::3", "4421", v6, 3),
            ]
        );
        // Host access applies on peers too.
        assert_eq!(entries("nqn.h:1").len(), 7);
    }
}
