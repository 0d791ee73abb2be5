//! Volume export: a volume served as a namespace of one of the target's
//! subsystems, made through the API or the TOML, and remembered in
//! `state_dir/exports.json` so API-made exports survive a restart.
//! (Drive export, JBOF mode, is `drive_export.rs`.)

use std::collections::BTreeMap;
use std::sync::Arc;

use blockdev::BlockDevice;
use nvmf_target::{Namespace, NamespaceError};

use crate::echo::Echo;

use super::ops::{ExportRequest, VolumeInfo};
use super::validate::find_volume;
use super::{Export, Node, NodeError, NodeResult, NodeState, VolumeEntry};

/// What a `backend = "volume"` namespace of the TOML serves.
pub enum VolumeNamespace {
    Device(Arc<dyn BlockDevice>),
    /// The volume exists but is not served (offline): the namespace is
    /// left out, with this reason in the log; the node starts.
    NotServed(String),
    /// No such volume: a configuration error.
    Unknown,
}

fn uuid_bytes(uuid: &str) -> [u8; 16] {
    let hex: Vec<u8> = uuid.bytes().filter(|c| c.is_ascii_hexdigit()).collect();
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).take(16).enumerate() {
        let s = std::str::from_utf8(pair).unwrap_or("0");
        out[i] = u8::from_str_radix(s, 16).unwrap_or(0);
    }
    out
}

impl VolumeEntry {
    fn namespace(&self, nsid: u32) -> Namespace {
        volume_namespace(nsid, self.device(), &self.uuid()).with_qos(self.qos.clone())
    }
}

/// A volume's namespace: its UUID and NGUID come from the volume's UUID, so
/// every node that serves it (cluster mode) reports the same identity.
pub fn volume_namespace(nsid: u32, dev: Arc<dyn BlockDevice>, uuid: &str) -> Namespace {
    let id = uuid_bytes(uuid);
    let mut nguid = id;
    nguid[0] ^= 0x5A;
    Namespace::new(nsid, dev, id, nguid)
}

impl Node {
    pub(super) fn check_export_free(&self, x: &ExportRequest) -> NodeResult<()> {
        if x.nsid == 0 {
            return Err(NodeError::BadRequest(format!(
                "give the namespace ID to serve it as in {}: --nsid N (API: \"nsid\")",
                Echo(&x.nqn)
            )));
        }
        let t = self.target()?;
        let sub = t.subsystem(&x.nqn).ok_or_else(|| {
            NodeError::BadRequest(format!(
                "no subsystem {}; declare it in the node's TOML ([[subsystem]])",
                Echo(&x.nqn)
            ))
        })?;
        if sub.namespace(x.nsid).is_some() {
            return Err(NodeError::Conflict(format!(
                "subsystem {} already has namespace {}; pick another nsid",
                x.nqn, x.nsid
            )));
        }
        Ok(())
    }

    pub(super) fn export_entry(&self, e: &mut VolumeEntry, x: ExportRequest) -> NodeResult<()> {
        if let Some(o) = e.offline() {
            return Err(NodeError::Conflict(format!(
                "volume {} is offline (not assembled: {}); an offline volume is not served",
                e.name, o.reason
            )));
        }
        if let Some(why) = e.pool_part() {
            return Err(NodeError::Conflict(format!("volume {} is {why}", e.name)));
        }
        if let Some(cur) = &e.export {
            return Err(NodeError::Conflict(format!(
                "volume {} is already exported as nsid {} of {}; unexport it first",
                e.name, cur.nsid, cur.nqn
            )));
        }
        self.target()?
            .add_namespace(&x.nqn, e.namespace(x.nsid))
            .map_err(|err| match err {
                NamespaceError::NsidInUse { .. } => NodeError::Conflict(err.to_string()),
                _ => NodeError::BadRequest(err.to_string()),
            })?;
        tracing::info!(
            "volume {}: exported as nsid {} of {}",
            e.name,
            x.nsid,
            x.nqn
        );
        e.export = Some(Export {
            nqn: x.nqn,
            nsid: x.nsid,
            from_config: false,
        });
        Ok(())
    }

    /// The device for a TOML `backend = "volume"` namespace; records the
    /// export. An offline volume's namespace is left out, with an error.
    pub async fn config_namespace(&self, volume: &str, nqn: &str, nsid: u32) -> VolumeNamespace {
        let mut st = self.state.lock().await;
        let Some(e) = st.volumes.get_mut(volume) else {
            return VolumeNamespace::Unknown;
        };
        if let Some(o) = e.offline() {
            return VolumeNamespace::NotServed(format!("volume {volume} is offline: {}", o.reason));
        }
        if let Some(why) = e.pool_part() {
            tracing::error!("volume {volume} is {why}");
            return VolumeNamespace::Unknown;
        }
        e.export = Some(Export {
            nqn: nqn.into(),
            nsid,
            from_config: true,
        });
        VolumeNamespace::Device(e.device())
    }

    pub async fn export(&self, name: &str, x: ExportRequest) -> NodeResult<VolumeInfo> {
        if x.nsid == 0 {
            // Only a cluster picks a free NSID (one record for every node).
            return Err(NodeError::BadRequest(format!(
                "give the namespace ID to serve the volume as in {}: --nsid N (API: \"nsid\")",
                Echo(&x.nqn)
            )));
        }
        let mut st = self.state.lock().await;
        let e = find_volume(&mut st, name)?;
        self.export_entry(e, x)?;
        self.save_exports(&st)?;
        Ok(st.volume_info(name).expect("exists"))
    }

    /// Writes the API-made exports to the state file (atomically: a crash
    /// leaves the old file or the new one, never half of one).
    pub(super) fn save_exports(&self, st: &NodeState) -> NodeResult<()> {
        let Some(path) = &self.exports_file else {
            return Ok(());
        };
        let list: BTreeMap<&str, &Export> = st
            .volumes
            .values()
            .filter_map(|v| {
                v.export
                    .as_ref()
                    .filter(|x| !x.from_config)
                    .map(|x| (v.name.as_str(), x))
            })
            .collect();
        let text = serde_json::to_string_pretty(&list).expect("exports serialize");
        super::write_atomic(path, text.as_bytes()).map_err(|e| {
            NodeError::Internal(format!(
                "the export is made, but saving {} failed: {e}; it will not survive a restart",
                path.display()
            ))
        })
    }

    /// At start, after the TOML's exports: the API-made exports of the last run.
    pub async fn restore_exports(&self) -> anyhow::Result<()> {
        let Some(path) = &self.exports_file else {
            return Ok(());
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
        };
        let list: BTreeMap<String, Export> = serde_json::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "{} is not an exports file ({e}); fix or remove it",
                path.display()
            )
        })?;
        let mut st = self.state.lock().await;
        for (name, x) in list {
            let Some(e) = st.volumes.get_mut(&name) else {
                tracing::warn!(
                    "{}: volume {name} is gone; not exporting it",
                    path.display()
                );
                continue;
            };
            let req = ExportRequest {
                nqn: x.nqn.clone(),
                nsid: x.nsid,
            };
            match self.export_entry(e, req) {
                Ok(()) => {}
                Err(err) => tracing::warn!("volume {name}: not exported again: {err}"),
            }
        }
        Ok(())
    }

    /// Stops serving a volume. Hosts connected to its subsystem lose the
    /// namespace (their I/O to it fails): without `force` that is refused,
    /// naming them, and nothing changes.
    pub async fn unexport(&self, name: &str, force: bool) -> NodeResult<VolumeInfo> {
        let mut st = self.state.lock().await;
        let e = find_volume(&mut st, name)?;
        let Some(x) = e.export.clone() else {
            return Err(NodeError::Conflict(format!(
                "volume {name} is not exported"
            )));
        };
        let hosts = self.target()?.hosts_connected(&x.nqn);
        if !hosts.is_empty() {
            if !force {
                return Err(NodeError::Conflict(format!(
                    "volume {name} is nsid {} of {}, to which {} connected ({}): unexporting \
                     it takes the namespace away under them, and their I/O to it fails (writes \
                     they have not flushed are lost to them). Nothing was changed; disconnect \
                     them first (nvme disconnect), or use --force (API: {{\"force\": true}})",
                    x.nsid,
                    x.nqn,
                    if hosts.len() == 1 {
                        "1 host is".to_string()
                    } else {
                        format!("{} hosts are", hosts.len())
                    },
                    hosts.join(", ")
                )));
            }
            tracing::warn!(
                "volume {name}: unexported with force while hosts {hosts:?} are connected to {}",
                x.nqn
            );
        }
        self.target()?
            .remove_namespace(&x.nqn, x.nsid)
            .map_err(|err| NodeError::Internal(err.to_string()))?;
        e.export = None;
        self.save_exports(&st)?;
        let dev = find_volume(&mut st, name)?.device();
        // Commands that were in flight on the old snapshot finish before the
        // volume is used again for anything but I/O; a flush makes them durable.
        super::flush(&*dev)
            .await
            .map_err(|err| NodeError::Internal(format!("volume {name}: flush: {err}")))?;
        tracing::info!(
            "volume {name}: no longer exported (was nsid {} of {})",
            x.nsid,
            x.nqn
        );
        Ok(st.volume_info(name).expect("exists"))
    }
}
