//! `serve`'s tests that need no process: the banner's attach lines.

use std::sync::Arc;

use nvmf_target::{ListenerKind, Subsystem};

use super::attach_lines;
use crate::node::identity::{Cluster, Peer, drive_nqn, node_host_nqn};

fn sub(nqn: &str, any: bool, hosts: &[&str]) -> Arc<Subsystem> {
    Arc::new(Subsystem::new(
        nqn.into(),
        "S".into(),
        "M".into(),
        any,
        hosts.iter().map(|h| h.to_string()).collect(),
        Vec::new(),
    ))
}

fn enclosure() -> Cluster {
    let mut c = Cluster::standalone();
    c.node_name = "e1".into();
    c.peers.push(Peer {
        name: "c1".into(),
        addr: None,
        host_nqn: node_host_nqn("c1"),
        auth: None,
        tls: None,
    });
    c
}

/// An enclosure's drive exports take only its peers: the banner suggests
/// no `nvme connect` a Linux host would be refused, and says who may use them.
#[test]
fn an_enclosure_banner_suggests_no_connect_its_allow_list_refuses() {
    let c = enclosure();
    let addrs = [
        ("127.0.0.1:4420".parse().unwrap(), ListenerKind::Io),
        ("127.0.0.1:8009".parse().unwrap(), ListenerKind::Discovery),
    ];
    let d0 = drive_nqn("e1", "d0");
    let lines = attach_lines(
        &[sub(&d0, false, &[&node_host_nqn("c1"), "nqn.x:other"])],
        &addrs,
        &c,
    )
    .join("\n");
    assert!(!lines.contains("nvme connect"), "{lines}");
    assert!(!lines.contains("nvme discover"), "{lines}");
    assert!(
        lines.contains(&format!("drive d0: {d0} for node c1, nqn.x:other")),
        "{lines}"
    );
    // A subsystem for hosts beside the exports keeps its connect line, and
    // only it.
    let lines = attach_lines(
        &[
            sub(&d0, false, &[&node_host_nqn("c1")]),
            sub("nqn.2026-01.io.flashpool:v", true, &[]),
        ],
        &addrs,
        &c,
    );
    let connects: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("nvme connect"))
        .collect();
    assert_eq!(
        connects,
        ["  nvme connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.2026-01.io.flashpool:v"]
    );
    assert!(lines.iter().any(|l| l.contains("nvme discover")));
}
