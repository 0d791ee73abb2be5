//! Drive export (JBOF mode): a node serves its own raw drives to the other
//! nodes, one subsystem per drive (`nqn.2026-01.io.flashpool:drive:<node>:<drive>`,
//! nsid 1), so that their volumes can use them as members. Only the allowed
//! host NQNs connect; reservations work on these namespaces as on any other,
//! which is how a volume's owner fences a deposed one.
//!
//! An exported drive belongs to its remote users: no local volume may claim
//! it, and a drive in a local volume cannot be exported.

use std::sync::Arc;

use nvmf_target::{Namespace, Subsystem};
use serde::{Deserialize, Serialize};

use super::identity::{Cluster, drive_nqn, stable_id};
use super::{Drive, Node, NodeError, NodeResult, NodeState};
pub use crate::api_types::{DriveExport, ExportDriveRequest};
use crate::echo::Echo;

/// One line of `drive-exports.json`.
#[derive(Debug, Serialize, Deserialize)]
struct SavedDriveExport {
    drive: String,
    hosts: Vec<String>,
}

impl Drive {
    /// The namespace's UUID and NGUID, stable while the drive is the same
    /// drive: from the node name, the drive name and, for a file, its inode
    /// (a different file at the same path is a different drive, and remote
    /// users see the change). A RAM drive is new at every start, and so is
    /// its identity.
    pub(crate) fn identity(&self, node: &str) -> ([u8; 16], [u8; 16]) {
        let what = match &self.path {
            Some(p) => match std::fs::metadata(p) {
                Ok(m) => {
                    use std::os::unix::fs::MetadataExt;
                    format!("file {} {}:{}", p.display(), m.dev(), m.ino())
                }
                Err(_) => format!("file {}", p.display()),
            },
            // A RAM drive's data dies with the process: so does its identity.
            None => format!(
                "{} {:p} pid {} started {}",
                self.backend,
                Arc::as_ptr(&self.dev),
                std::process::id(),
                process_start_nanos()
            ),
        };
        let seed = format!("{node}/{}/{what}", self.name);
        let uuid = stable_id(&seed);
        let mut nguid = stable_id(&format!("nguid/{seed}"));
        nguid[0] ^= 0x5A;
        (uuid, nguid)
    }
}

/// When this process started (first asked), in nanoseconds since the epoch.
fn process_start_nanos() -> u128 {
    static T: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    })
}

fn drive_subsystem(cluster: &Cluster, d: &Drive, x: &DriveExport) -> Subsystem {
    let node = cluster.node_name.as_str();
    let (uuid, nguid) = d.identity(node);
    let serial: String = format!("{node}-{}", d.name).chars().take(20).collect();
    let mut sub = Subsystem::new(
        x.nqn.clone(),
        serial,
        "flashpool drive".into(),
        false,
        x.hosts.clone(),
        vec![Namespace::new(1, d.dev.clone(), uuid, nguid)],
    );
    // A peer with a secret in the TOML must authenticate (DH-HMAC-CHAP).
    for h in &x.hosts {
        if let Some(a) = cluster.export_auth(h) {
            sub.set_host_auth(h.clone(), a);
        }
        // A peer with a TLS key must come over TLS with it.
        if let Some(k) = cluster.export_tls(h) {
            sub.set_host_tls(h.clone(), k);
        }
    }
    sub
}

impl NodeState {
    fn check_exportable(&self, name: &str) -> NodeResult<&Drive> {
        let d = self.drives.get(name).ok_or_else(|| {
            NodeError::NotFound(format!(
                "drive {} does not exist; list the drives with `flashpool drive list`",
                Echo(name)
            ))
        })?;
        if d.remote.is_some() {
            return Err(NodeError::BadRequest(format!(
                "drive {name} is remote; only a node's own drives can be exported"
            )));
        }
        if let Some((v, p)) = self.user_of(name) {
            return Err(NodeError::Conflict(format!(
                "drive {name} is a member of volume {v} (position {p}); a drive in a local volume cannot be exported"
            )));
        }
        self.check_not_assembling(name)?;
        if d.failed {
            return Err(NodeError::Conflict(format!(
                "drive {name} has failed; export a healthy drive"
            )));
        }
        Ok(d)
    }
}

impl Node {
    /// Exports `name` to other nodes. With no hosts given, the `[[peer]]`s'
    /// host NQNs may connect.
    pub async fn export_drive(
        &self,
        name: &str,
        req: ExportDriveRequest,
        from_config: bool,
    ) -> NodeResult<super::ops::DriveInfo> {
        let target = self.target()?.clone();
        let mut st = self.state.lock().await;
        let d = st.check_exportable(name)?;
        if let Some(x) = &d.export {
            return Err(NodeError::Conflict(format!(
                "drive {name} is exported already as {}; unexport it first to change the hosts",
                x.nqn
            )));
        }
        let hosts = if req.hosts.is_empty() {
            self.cluster().peer_hosts()
        } else {
            req.hosts
        };
        if hosts.is_empty() {
            return Err(NodeError::BadRequest(format!(
                "no host may connect to drive {name}: give hosts (the owner nodes' host NQNs) or declare [[peer]]s in the TOML"
            )));
        }
        for h in &hosts {
            if !h.starts_with("nqn.") || h.len() > 223 {
                return Err(NodeError::BadRequest(format!(
                    "host {} is not a valid host NQN (nqn...., at most 223 bytes)",
                    Echo(h)
                )));
            }
        }
        let node_name = self.cluster().node_name.clone();
        let x = DriveExport {
            nqn: drive_nqn(&node_name, name),
            hosts,
            from_config,
        };
        let sub = drive_subsystem(self.cluster(), d, &x);
        target
            .add_subsystem(Arc::new(sub))
            .map_err(|e| NodeError::Conflict(format!("drive {name}: {e}")))?;
        tracing::info!(
            "drive {name}: exported as {} to {}",
            x.nqn,
            x.hosts.join(", ")
        );
        st.drives.get_mut(name).expect("checked").export = Some(x);
        self.save_drive_exports(&st)?;
        Ok(st.drive_info(name).expect("exists"))
    }

    /// Stops serving `name`: connected hosts lose their controllers.
    pub async fn unexport_drive(&self, name: &str) -> NodeResult<super::ops::DriveInfo> {
        let target = self.target()?.clone();
        let mut st = self.state.lock().await;
        let d = st
            .drives
            .get_mut(name)
            .ok_or_else(|| NodeError::NotFound(format!("drive {} does not exist", Echo(name))))?;
        let Some(x) = d.export.clone() else {
            return Err(NodeError::Conflict(format!("drive {name} is not exported")));
        };
        if x.from_config {
            return Err(NodeError::Conflict(format!(
                "drive {name} is exported by the node's TOML (export = true); remove it there"
            )));
        }
        d.export = None;
        if let Err(e) = target.remove_subsystem(&x.nqn) {
            tracing::warn!("drive {name}: {e}");
        }
        tracing::info!("drive {name}: no longer exported ({})", x.nqn);
        self.save_drive_exports(&st)?;
        Ok(st.drive_info(name).expect("exists"))
    }

    fn drive_exports_file(&self) -> Option<std::path::PathBuf> {
        self.exports_file
            .as_ref()
            .map(|f| f.with_file_name("drive-exports.json"))
    }

    fn save_drive_exports(&self, st: &NodeState) -> NodeResult<()> {
        let Some(path) = self.drive_exports_file() else {
            return Ok(());
        };
        let list: Vec<SavedDriveExport> = st
            .drives
            .values()
            .filter_map(|d| {
                let x = d.export.as_ref().filter(|x| !x.from_config)?;
                Some(SavedDriveExport {
                    drive: d.name.clone(),
                    hosts: x.hosts.clone(),
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&list).expect("plain data");
        super::write_atomic(&path, text.as_bytes())
            .map_err(|e| NodeError::Internal(format!("{}: {e}", path.display())))
    }

    /// At start: the drives the TOML exports, then those exported through
    /// the API before the restart.
    pub async fn restore_drive_exports(
        &self,
        configured: &[(String, Vec<String>)],
    ) -> anyhow::Result<()> {
        for (name, hosts) in configured {
            let req = ExportDriveRequest {
                hosts: hosts.clone(),
            };
            self.export_drive(name, req, true)
                .await
                .map_err(|e| anyhow::anyhow!("config: drive {name}: export: {e}"))?;
        }
        let Some(path) = self.drive_exports_file() else {
            return Ok(());
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => anyhow::bail!("{}: {e}", path.display()),
        };
        let list: Vec<SavedDriveExport> = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}; fix or remove the file", path.display()))?;
        for x in list {
            let req = ExportDriveRequest { hosts: x.hosts };
            if let Err(e) = self.export_drive(&x.drive, req, false).await {
                tracing::warn!("drive {}: export kept in {}: {e}", x.drive, path.display());
            }
        }
        Ok(())
    }
}
