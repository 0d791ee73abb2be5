//! The one place Rust tests build a node: drives (mem drives by default),
//! a state directory, this node's identity, and a target with one empty
//! subsystem (allowing any host) that volumes are exported into.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nvmf_target::{Subsystem, Target, TransportConfig};

use super::identity::Cluster;
use super::{CreateVolume, DriveSpec, Node, NodeState};

/// A mem drive of `size` bytes in 4 KiB blocks.
pub(crate) fn mem_drive(name: &str, size: u64) -> DriveSpec {
    DriveSpec {
        name: name.into(),
        backend: "mem".into(),
        size: Some(size),
        path: None,
        create: false,
        block_size: 4096,
        ..Default::default()
    }
}

/// `POST /v1/volumes` for a volume of `layout` on `drives`, with defaults.
pub(crate) fn volume(name: &str, layout: &str, drives: &[&str]) -> CreateVolume {
    CreateVolume {
        name: name.into(),
        layout: Some(layout.into()),
        drives: drives.iter().map(|d| d.to_string()).collect(),
        thin_pool: false,
        cluster: None,
        compression: None,
        pool: None,
        size: None,
        strip: None,
        block_size: None,
        rebuild_rate: None,
        export: None,
        encrypt: false,
    }
}

/// A node for a test, built in the order `serve` builds one.
#[derive(Default)]
pub(crate) struct TestNode {
    drives: Vec<DriveSpec>,
    state_dir: Option<PathBuf>,
    cluster: Option<Cluster>,
    subsystem: Option<String>,
}

impl TestNode {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Mem drives `d0`..`d{n-1}` of `size` bytes each.
    pub(crate) fn mem_drives(mut self, n: usize, size: u64) -> Self {
        self.drives
            .extend((0..n).map(|i| mem_drive(&format!("d{i}"), size)));
        self
    }

    pub(crate) fn drives(mut self, specs: &[DriveSpec]) -> Self {
        self.drives.extend_from_slice(specs);
        self
    }

    pub(crate) fn state_dir(mut self, dir: Option<&Path>) -> Self {
        self.state_dir = dir.map(Path::to_path_buf);
        self
    }

    pub(crate) fn cluster(mut self, c: Cluster) -> Self {
        self.cluster = Some(c);
        self
    }

    /// Attaches a target with subsystem `nqn` (any host, no namespaces).
    pub(crate) fn target(mut self, nqn: &str) -> Self {
        self.subsystem = Some(nqn.into());
        self
    }

    pub(crate) fn build(self) -> Arc<Node> {
        let mut st = NodeState::default();
        for s in &self.drives {
            st.drives.insert(s.name.clone(), s.open().unwrap());
        }
        let node = Node::with_state_dir(st, self.state_dir.as_deref());
        // As `serve` without `[node] kek_file`: the KEK in the state directory.
        if let Some(d) = &self.state_dir {
            node.set_keyring(super::keys::load_keyring(&d.join("kek")).unwrap());
        }
        if let Some(c) = self.cluster {
            node.set_cluster(c);
        }
        if let Some(nqn) = self.subsystem {
            let sub = Subsystem::new(nqn, "T".into(), "T".into(), true, Vec::new(), Vec::new());
            node.attach_target(Arc::new(Target::new(
                TransportConfig::default(),
                vec![Arc::new(sub)],
            )));
        }
        node
    }
}

/// Job `id` once it has ended (panics after a minute).
pub(crate) async fn wait_job(node: &Node, id: u64) -> super::jobs::JobInfo {
    for _ in 0..1200 {
        let j = node.job(id).await.unwrap();
        if j.state != super::jobs::JobState::Running {
            return j;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("job {id} still runs after a minute");
}

/// The newest job of `kind` on `volume`.
pub(crate) fn job_of(
    jobs: &[super::jobs::JobInfo],
    volume: &str,
    kind: super::jobs::JobKind,
) -> Option<super::jobs::JobInfo> {
    jobs.iter()
        .rev()
        .find(|j| j.volume == volume && j.kind == kind)
        .cloned()
}
