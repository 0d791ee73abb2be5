//! The node's key-encryption key (KEK) and the volume keys it wraps.
//!
//! The KEK lives in `[node] kek_file` (default `<state_dir>/kek`): 64 hex
//! digits, mode 0600, made at the first start when absent. Every volume key
//! is wrapped by it in the volume's superblocks, so any node holding the same
//! file can assemble the volume: in a cluster, every node needs the same
//! `kek_file`. Keys are never logged; only a KEK's id (a hash) is.
//!
//! Rotation (`flashpool node rotate-kek`) never rewrites data: a new KEK is
//! written to `<kek_file>.next` first, every encrypted volume's key is
//! rewrapped under it (superblocks only), then `.next` is renamed over the
//! KEK file. A rotation cut short leaves both files; the node reads both at
//! start (a volume opens with whichever wrapped it) and the next rotation
//! finishes with the same new KEK.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use volume::Volume;
use volume::crypt::{DataKey, KEK_BYTES, Kek, KeyEnvelope};

use super::{Backing, Node, NodeError, NodeResult};
use crate::events::{EventKind, NewEvent};

/// The KEKs a node holds: the current one (wraps new keys) and, after an
/// interrupted rotation, the next one.
#[derive(Default)]
pub struct Keyring {
    pub path: Option<PathBuf>,
    pub current: Option<Arc<Kek>>,
    pub next: Option<Arc<Kek>>,
}

/// What `POST /v1/node/rotate-kek` answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RotateReport {
    /// The id of the KEK that wraps every volume key now.
    pub kek_id: String,
    /// The encrypted volumes whose key was rewrapped.
    pub rewrapped: Vec<String>,
}

fn next_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".next");
    PathBuf::from(s)
}

/// Reads a KEK file (64 hex digits) that only its owner may read.
pub fn read_kek(path: &Path) -> Result<Kek> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).with_context(|| format!("kek_file {}", path.display()))?;
    if m.mode() & 0o077 != 0 {
        bail!(
            "kek_file {}: mode {:o} lets others read the key-encryption key; chmod 600 it \
             (and rotate it: flashpool node rotate-kek)",
            path.display(),
            m.mode() & 0o777
        );
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("kek_file {}", path.display()))?;
    let t = text.trim();
    let bytes: Option<Vec<u8>> = (t.len() == 2 * KEK_BYTES)
        .then(|| {
            (0..t.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(t.get(i..i + 2)?, 16).ok())
                .collect()
        })
        .flatten();
    let Some(mut bytes) = bytes else {
        bail!(
            "kek_file {}: not {} hex digits (a 256-bit key); remove it to have a new one made, \
             which loses every volume wrapped by the old one",
            path.display(),
            2 * KEK_BYTES
        );
    };
    let kek = Kek::from_bytes(&bytes).map_err(|e| anyhow::anyhow!("{e}"));
    volume::crypt::wipe(&mut bytes);
    kek
}

fn write_kek(path: &Path, kek: &Kek) -> Result<()> {
    let hex: String = kek.bytes().iter().map(|b| format!("{b:02x}")).collect();
    crate::api::token::write_secret_file(path, &hex)
        .with_context(|| format!("kek_file {}", path.display()))
}

/// Loads the KEK (and a `.next` one from a rotation cut short), making the
/// KEK file when there is none.
pub fn load_keyring(path: &Path) -> Result<Keyring> {
    let current = if path.exists() {
        read_kek(path)?
    } else {
        let k = Kek::generate().map_err(|e| anyhow::anyhow!("{e}"))?;
        write_kek(path, &k)?;
        tracing::info!(
            "kek_file {}: made a new key-encryption key (id {}); keep a copy: volumes made \
             encrypted cannot be read without it",
            path.display(),
            k.id()
        );
        k
    };
    let np = next_path(path);
    let next = if np.exists() {
        let k = read_kek(&np)?;
        tracing::warn!(
            "kek_file {}: a key rotation was cut short (found {}); run `flashpool node rotate-kek` \
             to finish it",
            path.display(),
            np.display()
        );
        Some(Arc::new(k))
    } else {
        None
    };
    Ok(Keyring {
        path: Some(path.to_path_buf()),
        current: Some(Arc::new(current)),
        next,
    })
}

impl Node {
    pub fn set_keyring(&self, k: Keyring) {
        if let Some(c) = &k.current {
            tracing::info!("key-encryption key {} loaded", c.id());
        }
        *self.keys.write() = k;
    }

    /// A new data key for a volume made with `encrypt`, wrapped by the KEK.
    pub(super) fn new_volume_key(&self, name: &str) -> NodeResult<(KeyEnvelope, DataKey)> {
        let kek = self.keys.read().current.clone().ok_or_else(|| {
            NodeError::BadRequest(format!(
                "volume {name}: encrypt needs a key-encryption key; set [node] kek_file or \
                 [node] state_dir (the KEK is made there at start)"
            ))
        })?;
        let key = DataKey::generate().map_err(|e| NodeError::Internal(e.to_string()))?;
        let env = kek
            .wrap(&key)
            .map_err(|e| NodeError::Internal(e.to_string()))?;
        Ok((env, key))
    }

    /// Unwraps an encrypted volume's key with the KEK that wrapped it and
    /// unlocks the volume; the error says why not (no KEK, another KEK).
    pub(super) fn unlock_volume(&self, vol: &Volume) -> Result<(), String> {
        let Some(env) = vol.key_envelope() else {
            return Ok(());
        };
        let ring = self.keys.read();
        let kek = [&ring.current, &ring.next]
            .into_iter()
            .flatten()
            .find(|k| k.id() == env.kek)
            .or(ring.current.as_ref());
        let Some(kek) = kek else {
            return Err(format!(
                "it is encrypted (key wrapped by key-encryption key {}) and this node has no \
                 KEK; set [node] kek_file to the file that holds it",
                env.kek
            ));
        };
        let key = kek.unwrap(&env).map_err(|e| e.to_string())?;
        vol.unlock(&key).map_err(|e| e.to_string())
    }

    /// Rewraps every encrypted volume's key under a new KEK (data is not
    /// rewritten), then makes it the node's KEK.
    pub async fn rotate_kek(&self) -> NodeResult<RotateReport> {
        if self.etcd_managed() {
            return Err(NodeError::Conflict(
                "rotate-kek is for single nodes: in a cluster every node reads the same kek_file, \
                 and a rotation on one node would leave the others unable to open the volumes it \
                 rewrapped; nothing was changed"
                    .into(),
            ));
        }
        let path = self.keys.read().path.clone().ok_or_else(|| {
            NodeError::BadRequest(
                "this node has no kek_file (set [node] kek_file or state_dir); nothing to rotate"
                    .into(),
            )
        })?;
        let st = self.state.lock().await;
        let mut vols: Vec<(String, Volume)> = Vec::new();
        for (name, e) in &st.volumes {
            match &e.backing {
                Backing::Drives { vol, .. } if vol.is_encrypted() => {
                    if vol.is_locked() {
                        return Err(NodeError::Conflict(format!(
                            "volume {name} is encrypted but locked; a rotation would leave it \
                             wrapped by a KEK that no longer exists. Nothing was changed"
                        )));
                    }
                    vols.push((name.clone(), vol.clone()));
                }
                Backing::Offline(_) if !e.drives.is_empty() => {
                    return Err(NodeError::Conflict(format!(
                        "volume {name} is offline; if it is encrypted, a rotation would leave it \
                         wrapped by a KEK that no longer exists. Bring it online or delete it \
                         first; nothing was changed"
                    )));
                }
                _ => {}
            }
        }
        // The new KEK is durable before any volume uses it; one left by a
        // rotation cut short is reused (volumes may hold keys wrapped by it).
        let np = next_path(&path);
        let next = match self.keys.read().next.clone() {
            Some(k) => k,
            None => Arc::new(Kek::generate().map_err(|e| NodeError::Internal(e.to_string()))?),
        };
        write_kek(&np, &next).map_err(|e| NodeError::Internal(format!("{e:#}")))?;
        self.keys.write().next = Some(next.clone());
        let mut rewrapped = Vec::new();
        for (name, vol) in &vols {
            let env = vol
                .wrap_key(&next)
                .map_err(|e| NodeError::Internal(e.to_string()))?
                .ok_or_else(|| NodeError::Internal(format!("volume {name} has no key")))?;
            vol.rewrap(env).await.map_err(|e| {
                NodeError::Internal(format!(
                    "volume {name}: {e}; the rotation stopped (run it again to finish)"
                ))
            })?;
            rewrapped.push(name.clone());
        }
        drop(st);
        std::fs::rename(&np, &path)
            .map_err(|e| NodeError::Internal(format!("kek_file {}: {e}", path.display())))?;
        if let Some(dir) = path.parent()
            && let Ok(d) = std::fs::File::open(dir)
        {
            let _ = d.sync_all();
        }
        {
            let mut ring = self.keys.write();
            ring.current = Some(next.clone());
            ring.next = None;
        }
        tracing::info!(
            "key-encryption key rotated to {}; rewrapped {} volume keys",
            next.id(),
            rewrapped.len()
        );
        self.events.emit(NewEvent::new(
            EventKind::KekRotated,
            format!(
                "key-encryption key rotated to {}; the keys of {} encrypted volumes are wrapped \
                 by it ({}); no data was rewritten",
                next.id(),
                rewrapped.len(),
                rewrapped.join(", ")
            ),
        ));
        Ok(RotateReport {
            kek_id: next.id().to_string(),
            rewrapped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kek_file_is_made_0600_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::node::tests::tempdir();
        let p = dir.join("kek");
        let a = load_keyring(&p).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = load_keyring(&p).unwrap();
        assert_eq!(a.current.unwrap().id(), b.current.unwrap().id());
        // Readable by others: refused.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_keyring(&p).err().unwrap();
        assert!(format!("{e:#}").contains("chmod 600"), "{e:#}");
        // Not a key: refused, saying what it must be.
        std::fs::write(&p, "short\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = load_keyring(&p).err().unwrap();
        assert!(format!("{e:#}").contains("64 hex digits"), "{e:#}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
