//! `flashpool cluster status` and `flashpool node drain|undrain`: clients
//! of a cluster node's management API.

use anyhow::Result;

use super::ApiArgs;
use crate::api_types::{ClusterStatus, DrainResult};
use crate::output::outln;

#[derive(clap::Subcommand, Debug)]
pub enum ClusterCmd {
    /// Nodes (leases, slots, drains) and volumes (owners, epochs, states).
    Status,
}

#[derive(clap::Subcommand, Debug)]
pub enum NodeCmd {
    /// Move every volume off NODE and keep new ones away; waits until done.
    Drain { node: String },
    /// Let NODE own volumes again.
    Undrain { node: String },
    /// Rewrap every encrypted volume's key under a new key-encryption key
    /// (the node asked; its kek_file is replaced). No data is rewritten.
    RotateKek,
}

/// `flashpool cluster ...`.
pub fn cluster(api: ApiArgs, cmd: ClusterCmd) -> Result<()> {
    let c = api.client()?;
    let ClusterCmd::Status = cmd;
    let a = c.get("/cluster")?;
    if api.json {
        return api.print_json(a.json());
    }
    let v: ClusterStatus = a.parse()?;
    let s = |x: &Option<String>| x.clone().unwrap_or_else(|| "-".to_string());
    outln!("cluster {} (asked node {})", v.cluster, v.node);
    outln!(
        "{:<10} {:>4} {:<18} {:>6} {:<8} portals",
        "NODE",
        "SLOT",
        "LEASE",
        "TTL",
        "DRAIN"
    );
    for n in &v.nodes {
        outln!(
            "{:<10} {:>4} {:<18} {:>6} {:<8} {}",
            n.name,
            n.slot,
            n.lease,
            n.ttl_left_s.map(|t| format!("{t}s")).unwrap_or("-".into()),
            if n.draining { "yes" } else { "no" },
            n.portals.join(",")
        );
    }
    outln!();
    outln!(
        "{:<12} {:<10} {:>6} {:>5} {:<10} {:<10} namespace",
        "VOLUME",
        "OWNER",
        "EPOCH",
        "GEN",
        "STATE",
        "HANDOFF"
    );
    for x in &v.volumes {
        outln!(
            "{:<12} {:<10} {:>6} {:>5} {:<10} {:<10} {} nsid {} (ANA group {})",
            x.name,
            s(&x.owner),
            x.epoch.map(|e| e.to_string()).unwrap_or("-".into()),
            x.generation.map(|e| e.to_string()).unwrap_or("-".into()),
            x.state,
            s(&x.handoff),
            x.nqn,
            x.nsid,
            x.ana_group
        );
        for j in &x.joining {
            outln!("{:<12} joining (a replace under way): {j}", "");
        }
        for e in &x.extents {
            outln!(
                "{:<12} extent {} ({}, {} drives)",
                "",
                e.name,
                e.layout,
                e.drives.len()
            );
            for j in &e.joining {
                outln!("{:<12}   joining (a replace under way): {j}", "");
            }
        }
        // why nobody runs it, when a node said so
        if x.owner.is_none()
            && let Some(n) = &x.note
        {
            outln!("{:<12} {n}", "");
        }
    }
    Ok(())
}

/// `flashpool node drain|undrain`.
pub fn node(api: ApiArgs, cmd: NodeCmd) -> Result<()> {
    let c = api.client()?;
    let (node, verb) = match &cmd {
        NodeCmd::Drain { node } => (node, "drain"),
        NodeCmd::Undrain { node } => (node, "undrain"),
        NodeCmd::RotateKek => {
            let a = c.post::<()>("/node/rotate-kek", None)?;
            if api.json {
                return api.print_json(a.json());
            }
            let r: crate::node::keys::RotateReport = a.parse()?;
            outln!(
                "key-encryption key is now {}; rewrapped the keys of {} volume(s){}{}",
                r.kek_id,
                r.rewrapped.len(),
                if r.rewrapped.is_empty() { "" } else { ": " },
                r.rewrapped.join(", ")
            );
            return Ok(());
        }
    };
    let a = c.post::<()>(
        &format!("/nodes/{}/{verb}", crate::client::segment(node)),
        None,
    )?;
    if api.json {
        return api.print_json(a.json());
    }
    let d: DrainResult = a.parse()?;
    match (verb, d.owns.is_empty()) {
        ("undrain", _) => outln!("node {node}: may own volumes again"),
        (_, true) => outln!("node {node}: drained, it owns no volume"),
        (_, false) => outln!(
            "node {node}: draining, still owns {} (see flashpool cluster status)",
            d.owns.join(", ")
        ),
    }
    Ok(())
}
