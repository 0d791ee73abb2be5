//! The cluster's part of `GET /metrics` (cluster mode only): per cluster
//! volume as this node sees it (owner, epoch, ANA state), this node's lease
//! time left, whether etcd answers, the fence count, and takeover and move
//! durations. The agent fills a [`ClusterPage`] at scrape time from what it
//! keeps (atomics and the last owner it read per volume); nothing here
//! reads etcd, so a scrape never waits on it. Labels are the volume and a
//! node name only.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use nvmf_target::AnaState;

use super::registry::{Exposition, Kind, SecondsSnapshot};

/// `le` bounds of the takeover and move histograms, in seconds: 10 ms (a
/// move between warm nodes) to 60 s (a takeover stuck on a slow member).
pub const DURATION_BOUNDS_S: [f64; 13] = [
    0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0,
];

/// ANA states, each a series of `flashpool_cluster_volume_ana_state`.
const ANA_STATES: [&str; 5] = [
    "optimized",
    "non_optimized",
    "inaccessible",
    "persistent_loss",
    "change",
];

fn ana_word(a: AnaState) -> &'static str {
    match a {
        AnaState::Optimized => "optimized",
        AnaState::NonOptimized => "non_optimized",
        AnaState::Inaccessible => "inaccessible",
        AnaState::PersistentLoss => "persistent_loss",
        AnaState::Change => "change",
    }
}

/// A duration histogram with [`DURATION_BOUNDS_S`]: one bucket add and one
/// sum add per observation.
#[derive(Default)]
pub struct DurationHistogram {
    /// Per bucket (not cumulative); the last is above every bound.
    buckets: [AtomicU64; DURATION_BOUNDS_S.len() + 1],
    sum_us: AtomicU64,
}

impl DurationHistogram {
    pub fn record(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = DURATION_BOUNDS_S
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(DURATION_BOUNDS_S.len());
        self.buckets[i].fetch_add(1, Relaxed);
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_us.fetch_add(us, Relaxed);
    }

    pub fn snapshot(&self) -> SecondsSnapshot {
        let mut acc = 0;
        let mut cumulative = Vec::with_capacity(DURATION_BOUNDS_S.len());
        for b in &self.buckets[..DURATION_BOUNDS_S.len()] {
            acc += b.load(Relaxed);
            cumulative.push(acc);
        }
        SecondsSnapshot {
            bounds: &DURATION_BOUNDS_S,
            cumulative,
            count: acc + self.buckets[DURATION_BOUNDS_S.len()].load(Relaxed),
            sum: self.sum_us.load(Relaxed) as f64 / 1e6,
        }
    }
}

/// One cluster volume as this node sees it.
#[derive(Debug, Clone)]
pub struct ClusterVolume {
    pub name: String,
    /// The owner etcd named when this node last read it.
    pub owner: Option<String>,
    pub epoch: Option<u64>,
    /// Its ANA group's state on this node.
    pub ana: AnaState,
}

/// What the agent shows at a scrape.
#[derive(Debug, Clone, Default)]
pub struct ClusterPage {
    /// This node's name.
    pub node: String,
    /// Until this node's lease runs out (0: lost or expired).
    pub lease_left: Duration,
    pub etcd_reachable: bool,
    pub volumes: Vec<ClusterVolume>,
    pub fences: u64,
    pub takeovers: SecondsSnapshot,
    pub moves: SecondsSnapshot,
    /// The namespaces of cluster volumes served here, as (subsystem NQN,
    /// nsid, volume): the `volume` label of the namespace families.
    pub namespaces: Vec<(String, u32, String)>,
}

/// Appends the cluster families to `p`.
pub fn cluster(p: &mut Exposition, c: &ClusterPage) {
    p.family(
        "flashpool_cluster_lease_remaining_seconds",
        Kind::Gauge,
        "Time until this node's etcd lease runs out unless renewed; at 0 every volume owned here stops serving I/O.",
    )
    .float(&[], c.lease_left.as_secs_f64());
    p.family(
        "flashpool_cluster_etcd_reachable",
        Kind::Gauge,
        "1 when this node's last etcd read succeeded, 0 when etcd could not be reached.",
    )
    .int(&[], u64::from(c.etcd_reachable));
    p.family(
        "flashpool_cluster_fences_total",
        Kind::Counter,
        "Volumes this node fenced (stopped taking I/O without writing): lease lost, deposed, or a member's reservation conflict.",
    )
    .int(&[], c.fences);
    p.family(
        "flashpool_cluster_takeover_duration_seconds",
        Kind::Histogram,
        "Takeovers by this node, from the first pass that saw the volume unowned to its group Optimized.",
    )
    .seconds(&[], &c.takeovers);
    p.family(
        "flashpool_cluster_move_duration_seconds",
        Kind::Histogram,
        "Planned moves to this node, from the handoff seen to its group Optimized.",
    )
    .seconds(&[], &c.moves);

    let mut f = p.family(
        "flashpool_cluster_volume_owner",
        Kind::Gauge,
        "1 for the node etcd names as the volume's owner (as this node last read it).",
    );
    for v in &c.volumes {
        if let Some(o) = &v.owner {
            f.int(&[("volume", &v.name), ("node", o)], 1);
        }
    }
    let mut f = p.family(
        "flashpool_cluster_volume_is_owner",
        Kind::Gauge,
        "1 when this node owns the cluster volume, 0 when it serves it on standby.",
    );
    for v in &c.volumes {
        let mine = v.owner.as_deref() == Some(c.node.as_str());
        f.int(&[("volume", &v.name)], u64::from(mine));
    }
    let mut f = p.family(
        "flashpool_cluster_volume_epoch",
        Kind::Gauge,
        "The volume's ownership epoch (grows by one per owner change); absent while unowned.",
    );
    for v in &c.volumes {
        if let Some(e) = v.epoch {
            f.int(&[("volume", &v.name)], e);
        }
    }
    let mut f = p.family(
        "flashpool_cluster_volume_ana_state",
        Kind::Gauge,
        "The volume's ANA group state on this node: 1 for the current state, 0 for the others.",
    );
    for v in &c.volumes {
        let now = ana_word(v.ana);
        for s in ANA_STATES {
            f.int(&[("volume", &v.name), ("state", s)], u64::from(s == now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::check_exposition;

    #[test]
    fn the_cluster_page_has_owner_epoch_ana_lease_and_durations() {
        let h = DurationHistogram::default();
        h.record(Duration::from_millis(40));
        h.record(Duration::from_millis(90));
        h.record(Duration::from_secs(90));
        let page = ClusterPage {
            node: "a".into(),
            lease_left: Duration::from_millis(1500),
            etcd_reachable: true,
            volumes: vec![
                ClusterVolume {
                    name: "v1".into(),
                    owner: Some("a".into()),
                    epoch: Some(3),
                    ana: AnaState::Optimized,
                },
                ClusterVolume {
                    name: "v2".into(),
                    owner: None,
                    epoch: None,
                    ana: AnaState::Inaccessible,
                },
            ],
            fences: 2,
            takeovers: h.snapshot(),
            moves: DurationHistogram::default().snapshot(),
            namespaces: Vec::new(),
        };
        let mut p = Exposition::default();
        cluster(&mut p, &page);
        let t = p.finish();
        for line in [
            "flashpool_cluster_lease_remaining_seconds 1.5\n",
            "flashpool_cluster_etcd_reachable 1\n",
            "flashpool_cluster_fences_total 2\n",
            "flashpool_cluster_volume_owner{volume=\"v1\",node=\"a\"} 1\n",
            "flashpool_cluster_volume_is_owner{volume=\"v1\"} 1\n",
            "flashpool_cluster_volume_is_owner{volume=\"v2\"} 0\n",
            "flashpool_cluster_volume_epoch{volume=\"v1\"} 3\n",
            "flashpool_cluster_volume_ana_state{volume=\"v1\",state=\"optimized\"} 1\n",
            "flashpool_cluster_volume_ana_state{volume=\"v2\",state=\"optimized\"} 0\n",
            "flashpool_cluster_volume_ana_state{volume=\"v2\",state=\"inaccessible\"} 1\n",
            "flashpool_cluster_takeover_duration_seconds_bucket{le=\"0.05\"} 1\n",
            "flashpool_cluster_takeover_duration_seconds_bucket{le=\"0.1\"} 2\n",
            "flashpool_cluster_takeover_duration_seconds_bucket{le=\"60\"} 2\n",
            "flashpool_cluster_takeover_duration_seconds_bucket{le=\"+Inf\"} 3\n",
            "flashpool_cluster_takeover_duration_seconds_count 3\n",
            "flashpool_cluster_takeover_duration_seconds_sum 90.13\n",
            "flashpool_cluster_move_duration_seconds_count 0\n",
        ] {
            assert!(t.contains(line), "{line} not in\n{t}");
        }
        assert!(!t.contains("volume_epoch{volume=\"v2\"}"), "{t}");
        assert!(!t.contains("volume_owner{volume=\"v2\""), "{t}");
        check_exposition(&t);
    }
}
