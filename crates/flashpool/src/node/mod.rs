//! The node: its drives, the volumes built on them, and what it exports.
//!
//! Drives come from the TOML file. Volumes are found on the drives at start
//! (their superblocks say which volume and position each drive holds), made
//! from `[[volume]]` sections, or created through the management API. Every
//! change goes through [`Node`], one operation at a time, so two requests can
//! never claim the same drive.
//!
//! Where things are: `identity.rs` (who this node is to its peers),
//! `drive.rs` and `remote.rs` (drives, local and remote), `volumes.rs`
//! (make and delete volumes), `assemble.rs` and `recovery.rs` (find them on
//! their drives, force them up), `drive_ops.rs` and `spares.rs` (fail,
//! replace, re-add), `volume_export.rs` and `drive_export.rs` (what the
//! target serves), `qos.rs` (volumes' QoS limits), `jobs.rs`, `scrub.rs`,
//! `compact.rs` and `monitor.rs` (background work), `views.rs` (what the API shows),
//! `validate.rs` (request checks), `error.rs` (failures and their HTTP
//! status). The node never reads the TOML: `config/` turns it into the
//! specs above.

mod assemble;
mod compact;
#[cfg(test)]
mod compress_tests;
#[cfg(test)]
mod crypt_tests;
mod degraded;
#[cfg(test)]
mod degraded_tests;
mod drive;
mod drive_export;
mod drive_ops;
mod error;
mod expand;
#[cfg(test)]
mod expand_tests;
pub mod foreground;
mod grow;
#[cfg(test)]
mod grow_tests;
pub mod identity;
pub mod intents;
pub mod jobs;
pub mod keys;
pub mod monitor;
mod ops;
mod owned;
mod qos;
#[cfg(test)]
mod qos_tests;
mod recovery;
mod remote;
#[cfg(test)]
pub(crate) mod remote_tests;
mod scrub;
mod snapshots;
#[cfg(test)]
mod snapshots_tests;
mod spares;
mod standby;
#[cfg(test)]
mod standby_tests;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
mod validate;
mod views;
mod volume_export;
mod volumes;

use std::collections::BTreeMap;
use std::sync::Arc;

use blockdev::{BlockDevice, BlockError, BlockOp, Geometry, IoFuture, IoRequest};
use nvmf_target::Target;
use volume::Volume;
use volume::thin::{ThinPool, ThinVolume};

pub use crate::api_types::Export;
pub use assemble::AssembleVolume;
pub use degraded::{Degraded, Recorded};
pub use drive::{Drive, DriveIoStats, DriveSpec};
pub use drive_export::DriveExport;
pub use error::{NodeError, NodeResult, Object};
pub(crate) use expand::extent_name;
pub use ops::{CreateVolume, VolumeInfo};
pub(crate) use qos::{apply_request, describe as describe_qos, limits_info as qos_limits_info};
pub use recovery::ForcedInfo;
pub use scrub::ScrubSchedule;
pub use validate::{check_name, parse_layout};
pub(crate) use views::member_state_name;
pub use volume_export::{VolumeNamespace, volume_namespace};
// The node's tests name these API bodies by their old paths.
#[cfg(test)]
pub use crate::api_types::{ExportDriveRequest, ExportRequest, ScrubRequest};

/// What a volume is made of.
pub enum Backing {
    /// A protected (or striped) volume on drives; `pool` when it is
    /// formatted as a thin pool, whose thin volumes are entries of their own.
    Drives { vol: Volume, pool: Option<ThinPool> },
    /// A thin volume in the pool on volume `pool`.
    Thin { pool: String, tv: ThinVolume },
    /// Not assembled: the node knows of the volume (from its drives'
    /// superblocks or its TOML) but cannot run it. Listed with the reason,
    /// deletable, never exported.
    Offline(Offline),
}

/// What the node knows of a volume it could not assemble.
#[derive(Debug, Clone, Default)]
pub struct Offline {
    /// Why it is not assembled, as the log says it.
    pub reason: String,
    /// From the newest superblock on its drives (empty when none was found).
    pub uuid: String,
    pub layout: String,
    pub size_bytes: u64,
    pub block_size: u32,
    pub strip_bytes: u64,
    pub generation: u64,
    /// Per position, as the newest superblock records it: active, failed,
    /// rebuilding, resyncing, or missing (no drive holds it).
    pub member_states: Vec<String>,
}

/// A volume the node runs.
pub struct VolumeEntry {
    pub name: String,
    pub backing: Backing,
    /// Drive names by member position (none for a thin volume).
    pub drives: Vec<String>,
    pub export: Option<Export>,
    /// Declared in the TOML file (deleting it there is the way to remove it).
    pub from_config: bool,
    /// Rebuild speed limit in bytes per second (None: as fast as possible).
    pub rebuild_rate: Option<u64>,
    pub last_rebuild_error: Option<String>,
    /// A rebuild task runs (or is about to) for this volume.
    pub rebuild_task: bool,
    /// Forced up by `assemble --force`: what was forced and may be stale.
    pub forced: Option<ForcedInfo>,
    /// Its QoS limits, shared with the namespace that serves it (so a
    /// change applies live, and survives unexport and export).
    pub qos: Arc<nvmf_target::qos::NsQos>,
    /// An extent of a thin pool (`pool expand`): the pool's UUID and its
    /// own, from its header. Not exported; deleted with its pool.
    pub extent: Option<volume::thin::ExtentLabel>,
    /// A thin pool whose extents are not all assembled yet: not opened
    /// until they are (`Node::open_waiting_pools`).
    pub pool_waiting: Option<String>,
}

impl VolumeEntry {
    pub fn new(
        name: &str,
        backing: Backing,
        drives: Vec<String>,
        rebuild_rate: Option<u64>,
    ) -> Self {
        VolumeEntry {
            name: name.to_string(),
            backing,
            drives,
            export: None,
            from_config: false,
            rebuild_rate,
            last_rebuild_error: None,
            rebuild_task: false,
            forced: None,
            qos: Arc::default(),
            extent: None,
            pool_waiting: None,
        }
    }

    /// Why this volume is not served itself, when it is part of a thin
    /// pool: the pool (serve its thin volumes), a pool waiting for its
    /// extents, or an extent.
    pub fn pool_part(&self) -> Option<String> {
        if self.thin_pool().is_some() {
            Some("a thin pool; export its thin volumes instead".into())
        } else if let Some(w) = &self.pool_waiting {
            Some(format!("a thin pool that waits for its extents ({w})"))
        } else {
            self.extent.as_ref().map(|x| match x.pool.is_empty() {
                true => "made as a thin pool's extent, but no pool took it (an expansion was \
                         cut short); delete it"
                    .to_string(),
                false => format!(
                    "extent {} of thin pool {} (it holds part of the pool's clusters)",
                    x.extent, x.pool
                ),
            })
        }
    }

    /// The volume on drives, unless this is a thin volume.
    pub fn on_drives(&self) -> Option<&Volume> {
        match &self.backing {
            Backing::Drives { vol, .. } => Some(vol),
            Backing::Thin { .. } | Backing::Offline(_) => None,
        }
    }

    /// Why the volume is not assembled, if it is not.
    pub fn offline(&self) -> Option<&Offline> {
        match &self.backing {
            Backing::Offline(o) => Some(o),
            _ => None,
        }
    }

    pub fn thin_pool(&self) -> Option<&ThinPool> {
        match &self.backing {
            Backing::Drives { pool, .. } => pool.as_ref(),
            Backing::Thin { .. } | Backing::Offline(_) => None,
        }
    }

    /// The device a namespace of this volume serves (an offline volume is
    /// never exported; its device fails every I/O).
    pub fn device(&self) -> Arc<dyn BlockDevice> {
        match &self.backing {
            Backing::Drives { vol, .. } => Arc::new(ServedVolume(vol.clone(), self.name.clone())),
            Backing::Thin { tv, .. } => Arc::new(tv.clone()),
            Backing::Offline(o) => Arc::new(OfflineDevice(self.name.clone(), o.clone())),
        }
    }

    pub fn uuid(&self) -> String {
        match &self.backing {
            Backing::Drives { vol, .. } => vol.uuid(),
            Backing::Thin { tv, .. } => tv.uuid(),
            Backing::Offline(o) => o.uuid.clone(),
        }
    }
}

#[derive(Default)]
pub struct NodeState {
    pub drives: BTreeMap<String, Drive>,
    pub volumes: BTreeMap<String, VolumeEntry>,
    /// Background work (sync, rebuild, scrub); read without the lock too.
    pub jobs: Arc<jobs::Jobs>,
    /// The compaction of compressed thin pools (`compact.rs`); its pass
    /// runs without the lock too.
    pub compactor: Arc<compact::Compactor>,
    /// Drives an assembly has set aside while it runs without the lock
    /// (`assemble::Reserved`); no other request takes them meanwhile.
    /// Its own lock, so that a cancelled assembly gives them back in `Drop`.
    pub assembling: Arc<parking_lot::Mutex<std::collections::BTreeSet<String>>>,
}

impl NodeState {
    /// Refuses `drive` while an assembly holds it (the caller retries).
    pub fn check_not_assembling(&self, drive: &str) -> NodeResult<()> {
        if self.assembling.lock().contains(drive) {
            return Err(NodeError::Conflict(format!(
                "drive {drive} is being assembled into a volume by another request; retry"
            )));
        }
        Ok(())
    }

    /// The volume and position that hold `drive`, if any.
    pub fn user_of(&self, drive: &str) -> Option<(&str, usize)> {
        self.volumes.values().find_map(|v| {
            v.drives
                .iter()
                .position(|d| d == drive)
                .map(|p| (v.name.as_str(), p))
        })
    }
}

/// The node's management core, shared by `serve` and the API.
pub struct Node {
    pub state: tokio::sync::Mutex<NodeState>,
    target: std::sync::OnceLock<Arc<Target>>,
    /// `state_dir/exports.json`: the exports made through the API, so that
    /// they survive a restart as the TOML's do.
    exports_file: Option<std::path::PathBuf>,
    /// `state_dir/qos.json`: volumes' QoS limits, kept over a restart.
    qos_file: Option<std::path::PathBuf>,
    /// This node as other nodes know it, and its peers.
    cluster: std::sync::OnceLock<identity::Cluster>,
    /// Cluster mode: etcd says which volumes the node runs, so remote drives
    /// opened for them are not remembered in the state directory.
    etcd_managed: std::sync::atomic::AtomicBool,
    /// What the node reports to operators (`GET /v1/events`).
    pub events: Arc<crate::events::Events>,
    /// The key-encryption key(s) that wrap encrypted volumes' keys.
    keys: parking_lot::RwLock<keys::Keyring>,
    /// Takeovers under way, which resyncs and rebuilds wait for.
    pub foreground: Arc<foreground::Foreground>,
    /// Links kept open to the members of volumes this node would take
    /// over (`standby.rs`).
    standby: parking_lot::Mutex<standby::Standby>,
    /// The task following each open remote drive's link (`remote.rs`), so
    /// that a drive opened again has one, not two.
    link_watchers: parking_lot::Mutex<std::collections::HashMap<String, tokio::task::AbortHandle>>,
}

impl Node {
    pub fn with_state_dir(mut state: NodeState, dir: Option<&std::path::Path>) -> Arc<Node> {
        recovery::load_failed_drives(&mut state, dir);
        Arc::new(Node {
            state: tokio::sync::Mutex::new(state),
            target: std::sync::OnceLock::new(),
            exports_file: dir.map(|d| d.join("exports.json")),
            qos_file: dir.map(|d| d.join("qos.json")),
            cluster: std::sync::OnceLock::new(),
            etcd_managed: std::sync::atomic::AtomicBool::new(false),
            events: Arc::default(),
            keys: parking_lot::RwLock::new(keys::Keyring::default()),
            foreground: Arc::default(),
            standby: Default::default(),
            link_watchers: Default::default(),
        })
    }

    /// Cluster mode: etcd, not the state directory, says what the node runs.
    pub fn set_etcd_managed(&self) {
        self.etcd_managed
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn etcd_managed(&self) -> bool {
        self.etcd_managed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets the node's identity and peers (from the TOML); before any use.
    pub fn set_cluster(&self, c: identity::Cluster) {
        let _ = self.cluster.set(c);
    }

    /// The node's identity and peers; without a TOML, those of a node named
    /// after the host with no peers.
    pub fn cluster(&self) -> &identity::Cluster {
        self.cluster.get_or_init(identity::Cluster::standalone)
    }

    /// Connects the node to the running target (exports need it).
    pub fn attach_target(&self, target: Arc<Target>) {
        let _ = self.target.set(target);
    }

    /// The target, once `serve` attached it (metrics read it when it is there).
    pub(crate) fn running_target(&self) -> Option<&Arc<Target>> {
        self.target.get()
    }

    fn target(&self) -> NodeResult<&Arc<Target>> {
        self.target
            .get()
            .ok_or_else(|| NodeError::Internal("the target is not running yet".into()))
    }

    /// Leaves every volume clean (superblocks marked clean, bitmaps empty)
    /// and releases the drives. Call after the target stopped serving.
    pub async fn shutdown(&self) {
        let st = self.state.lock().await;
        // A stopped initial sync leaves its regions dirty on disk: the next
        // start resyncs them.
        st.jobs.stop(None).await;
        st.compactor.finish(None).await;
        // Pools first: their metadata lands on the volumes below them.
        for v in st.volumes.values() {
            if let Some(p) = v.thin_pool()
                && let Err(e) = p.close().await
            {
                tracing::error!("thin pool on volume {}: close: {e}", v.name);
            }
        }
        for v in st.volumes.values() {
            if let Some(vol) = v.on_drives()
                && let Err(e) = vol.close().await
            {
                tracing::error!("volume {}: close: {e}", v.name);
            }
        }
        for d in st.drives.values() {
            if let Err(e) = d.dev.shutdown() {
                tracing::error!("drive {}: {e}", d.name);
            }
        }
        self.close_standby();
    }
}

/// A remote drive's link state, for `drive list`.
fn remote_link(d: &Drive) -> Option<String> {
    d.remote
        .as_ref()
        .map(|r| remote::link_text(&r.link_state()))
}

/// Replaces `path` with `data` atomically: a crash leaves the old file or
/// the new one, never half of one.
pub(crate) fn write_atomic(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A volume as the target sees it: every call goes to the volume, but
/// shutting the namespace down leaves the members to the node, which closes
/// the volume cleanly first.
pub struct ServedVolume(pub Volume, pub String);

impl BlockDevice for ServedVolume {
    // shutdown: the trait's default (Ok): the volume below is the node's,
    // which closes it itself.
    blockdev::forward_block_device!(self => self.0, except [describe, shutdown]);

    fn describe(&self) -> String {
        format!("volume {}: {}", self.1, self.0.describe())
    }
}

/// An offline volume as a device: its size as its superblocks say, and
/// every I/O failing (as Unrecovered Read Error or Write Fault to a host).
pub struct OfflineDevice(pub String, pub Offline);

impl BlockDevice for OfflineDevice {
    fn geometry(&self) -> Geometry {
        let bs = if self.1.block_size == 0 {
            4096
        } else {
            self.1.block_size
        };
        Geometry {
            block_size: bs,
            num_blocks: self.1.size_bytes / u64::from(bs),
        }
    }
    fn submit(&self, req: IoRequest) -> IoFuture {
        let e = std::io::Error::other(format!("volume {} is offline: {}", self.0, self.1.reason));
        IoFuture::ready(req.buf, Err(BlockError::Io(e)))
    }
    fn deallocate_reads_zeroes(&self) -> bool {
        false
    }
    fn describe(&self) -> String {
        format!("volume {}: offline ({})", self.0, self.1.reason)
    }
}

/// Reads the first 4 KiB of a device.
pub(crate) async fn read_head(dev: &Arc<dyn BlockDevice>) -> Result<Vec<u8>, BlockError> {
    let bs = dev.geometry().block_size;
    let blocks = (4096 / bs).max(1);
    let mut buf = blockdev::AlignedBuf::new(4096);
    buf.set_len(4096);
    let done = dev
        .submit(IoRequest {
            op: BlockOp::Read,
            lba: 0,
            blocks,
            buf,
        })
        .await;
    done.result?;
    Ok(done.buf[..4096].to_vec())
}

/// Makes every completed write to `dev` durable.
pub(crate) async fn flush(dev: &dyn BlockDevice) -> Result<(), BlockError> {
    dev.submit(IoRequest {
        op: BlockOp::Flush,
        lba: 0,
        blocks: 0,
        buf: blockdev::AlignedBuf::new(0),
    })
    .await
    .result
}

/// Overwrites the first 4 KiB with zeroes, so the device no longer
/// assembles into the volume it held.
pub(crate) async fn wipe_head(dev: &Arc<dyn BlockDevice>) -> Result<(), BlockError> {
    let bs = dev.geometry().block_size;
    let blocks = (4096 / bs).max(1);
    let mut buf = blockdev::AlignedBuf::new(4096);
    buf.set_len(4096);
    let done = dev
        .submit(IoRequest {
            op: BlockOp::Write { fua: true },
            lba: 0,
            blocks,
            buf,
        })
        .await;
    done.result
}
