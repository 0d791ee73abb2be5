//! `GET /metrics`: the node's metrics in the Prometheus text format, read
//! at scrape time. I/O counters come from atomics the I/O path keeps (per
//! namespace in the target, per drive in the node's `MeteredDevice`, per
//! volume in the volume engine); states, progress and usage from the node's
//! state. `docs/metrics.md` lists the families.
//!
//! `registry.rs` renders a scrape (families, samples, the text encoding);
//! `node.rs` and `target.rs` say what is in it, `cluster.rs` what a node
//! in a cluster adds.

pub mod cluster;
mod node;
mod registry;
mod target;
#[cfg(test)]
mod tests;

pub use registry::CONTENT_TYPE;
#[cfg(test)]
pub use registry::check_exposition;

use registry::{Exposition, Kind};

use crate::node::Node;

/// Volume states, each a series of `flashpool_volume_state` (1 for the
/// volume's state, 0 for the others).
const VOLUME_STATES: [&str; 6] = [
    "optimal",
    "degraded",
    "rebuilding",
    "resyncing",
    "failed",
    "offline",
];
const DRIVE_STATES: [&str; 5] = ["free", "spare", "member", "exported", "failed"];

impl Node {
    /// The Prometheus text page.
    pub async fn metrics(&self) -> String {
        self.metrics_with(None).await
    }

    /// The page, with the cluster families when the node is in a cluster.
    pub async fn metrics_with(&self, c: Option<&cluster::ClusterPage>) -> String {
        let mut p = Exposition::default();
        p.family(
            "flashpool_build_info",
            Kind::Gauge,
            "The running flashpool's version (always 1).",
        )
        .int(&[("version", env!("CARGO_PKG_VERSION"))], 1);
        let st = self.state.lock().await;
        node::volumes(&mut p, &st);
        node::drives(&mut p, &st);
        if let Some(t) = self.running_target() {
            let cluster_ns = c.map_or(&[][..], |c| c.namespaces.as_slice());
            target::namespaces(&mut p, &st, t, cluster_ns);
            drop(st);
            target::controllers(&mut p, t);
        }
        if let Some(c) = c {
            cluster::cluster(&mut p, c);
        }
        p.finish()
    }
}
