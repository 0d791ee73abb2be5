//! `flashpool cluster status` and `flashpool node drain|undrain`: clients
//! of a cluster node's management API.

use anyhow::Result;
use serde_json::Value;

use crate::cli::{ApiArgs, Client};
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
}

pub fn cluster(api: ApiArgs, cmd: ClusterCmd) -> Result<()> {
    let c = Client::new(&api)?;
    let ClusterCmd::Status = cmd;
    let v = c.call("GET", "/cluster", None)?;
    if api.json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let s = |x: &Value| x.as_str().unwrap_or("-").to_string();
    outln!(
        "cluster {} (asked node {})",
        s(&v["cluster"]),
        s(&v["node"])
    );
    outln!(
        "{:<10} {:>4} {:<18} {:>6} {:<8} portals",
        "NODE",
        "SLOT",
        "LEASE",
        "TTL",
        "DRAIN"
    );
    for n in v["nodes"].as_array().into_iter().flatten() {
        let portals: Vec<String> = n["portals"]
            .as_array()
            .into_iter()
            .flatten()
            .map(&s)
            .collect();
        outln!(
            "{:<10} {:>4} {:<18} {:>6} {:<8} {}",
            s(&n["name"]),
            n["slot"],
            s(&n["lease"]),
            n["ttl_left_s"]
                .as_i64()
                .map(|t| format!("{t}s"))
                .unwrap_or("-".into()),
            if n["draining"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            portals.join(",")
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
    for x in v["volumes"].as_array().into_iter().flatten() {
        outln!(
            "{:<12} {:<10} {:>6} {:>5} {:<10} {:<10} {} nsid {} (ANA group {})",
            s(&x["name"]),
            s(&x["owner"]),
            x["epoch"]
                .as_u64()
                .map(|e| e.to_string())
                .unwrap_or("-".into()),
            x["generation"]
                .as_u64()
                .map(|e| e.to_string())
                .unwrap_or("-".into()),
            s(&x["state"]),
            s(&x["handoff"]),
            s(&x["nqn"]),
            x["nsid"],
            x["ana_group"]
        );
    }
    Ok(())
}

pub fn node(api: ApiArgs, cmd: NodeCmd) -> Result<()> {
    let c = Client::new(&api)?;
    let (node, verb) = match &cmd {
        NodeCmd::Drain { node } => (node, "drain"),
        NodeCmd::Undrain { node } => (node, "undrain"),
    };
    let v = c.call("POST", &format!("/nodes/{node}/{verb}"), None)?;
    if api.json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let owns: Vec<&str> = v["owns"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_str())
        .collect();
    match (verb, owns.is_empty()) {
        ("undrain", _) => outln!("node {node}: may own volumes again"),
        (_, true) => outln!("node {node}: drained, it owns no volume"),
        (_, false) => outln!(
            "node {node}: draining, still owns {} (see flashpool cluster status)",
            owns.join(", ")
        ),
    }
    Ok(())
}
