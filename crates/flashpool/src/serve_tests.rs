//! `serve`'s tests that need no process: the banner's attach lines, the
//! open-file limit.

use std::sync::Arc;

use nvmf_target::{ListenerKind, Subsystem};

use super::{attach_lines, open_file_goal, raise_open_file_limit};
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

/// The node TOMLs of docs/cluster.md (indented blocks from `[node]` on).
fn cluster_md_tomls() -> Vec<String> {
    let doc = include_str!("../../../docs/cluster.md");
    let mut blocks = Vec::new();
    let mut lines = doc.lines().peekable();
    while let Some(l) = lines.next() {
        if l != "    [node]" {
            continue;
        }
        let mut b = vec!["[node]".to_string()];
        while let Some(l) = lines.peek() {
            if !l.is_empty() && !l.starts_with("    ") {
                break;
            }
            b.push(l.strip_prefix("    ").unwrap_or("").to_string());
            lines.next();
        }
        blocks.push(b.join("\n"));
    }
    blocks
}

/// Every node TOML in docs/cluster.md passes `serve`'s checks: the cluster
/// node's (without its API, whose certificate files are the reader's), and
/// the enclosure's whole, as `serve --check` runs them.
#[test]
fn the_node_tomls_of_docs_cluster_md_pass_the_checks() {
    let blocks = cluster_md_tomls();
    let mut enclosures = 0;
    for text in &blocks {
        let mut cfg =
            crate::config::parse(text, "docs/cluster.md").unwrap_or_else(|e| panic!("{e}\n{text}"));
        if cfg.api.tls_cert.is_some() {
            cfg.api.enabled = false;
        }
        let c = super::check(&cfg).unwrap_or_else(|e| panic!("{e:#}\n{text}"));
        crate::config::build(&cfg, &|_, _, _| crate::node::VolumeNamespace::Unknown)
            .unwrap_or_else(|e| panic!("{e:#}\n{text}"));
        if cfg.cluster.is_none() {
            enclosures += 1;
            assert!(c.drive_specs.iter().all(|d| d.export), "{text}");
            assert!(c.cluster.peers.iter().all(|p| p.addr.is_none()), "{text}");
            assert!(cfg.api.enabled, "{text}");
        }
    }
    assert!(blocks.len() >= 2 && enclosures == 1, "{blocks:#?}");
}

#[test]
fn the_open_file_limit_goes_to_the_hard_limit() {
    let nr_open = || Some(1 << 20);
    assert_eq!(open_file_goal(1024, 524_288, nr_open), Some(524_288));
    assert_eq!(open_file_goal(524_288, 524_288, nr_open), None);
    // Unlimited: as far as the kernel lets a process go.
    assert_eq!(
        open_file_goal(1024, libc::RLIM_INFINITY, || Some(1_048_576)),
        Some(1_048_576)
    );
    assert_eq!(
        open_file_goal(1024, libc::RLIM_INFINITY, || None),
        Some(1 << 20)
    );
    // This process: raised in place (never lowered, so the tests running
    // beside this one keep their descriptors).
    let got = raise_open_file_limit();
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: fills the struct passed.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
    assert_eq!(l.rlim_cur, got);
    assert!(open_file_goal(l.rlim_cur, l.rlim_max, || Some(got)).is_none());
}
