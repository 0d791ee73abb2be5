//! `pool expand`: a thin pool grows by a new volume on other drives, added
//! as an extent (`volume::thin` extent.rs). The new volume is an ordinary
//! volume (its own layout, rebuild and scrub), never served itself, and
//! deleted with its pool; the pool is assembled once all its extents are.

use std::sync::Arc;

use blockdev::BlockDevice;
use volume::StateHook;
use volume::thin::{ExtentLabel, ThinError, ThinPool};

use super::ops::{CreateVolume, ExpandPool, VolumeInfo};
use super::volumes::thin_err;
use super::{Node, NodeError, NodeResult};
use crate::events::{EventKind, NewEvent};

/// The name of pool `pool`'s new extent (`POOL-xN` by default, `n` the
/// extents it has), once the request names its drives.
pub(crate) fn extent_name(pool: &str, req: &ExpandPool, n: usize) -> NodeResult<String> {
    if req.drives.is_empty() {
        return Err(NodeError::BadRequest(format!(
            "pool {pool}: name the drives of the new extent (drives)"
        )));
    }
    Ok(req
        .name
        .clone()
        .unwrap_or_else(|| format!("{pool}-x{}", n + 1)))
}

impl Node {
    /// Grows thin pool `pool` by a volume made on `req.drives` (by default
    /// with the pool volume's layout and strip). A refusal changes nothing:
    /// the new volume is deleted again unless the pool's metadata write
    /// failed, when it is kept, since the pool may already name it.
    pub async fn expand_pool(
        self: &Arc<Self>,
        pool: &str,
        req: ExpandPool,
    ) -> NodeResult<VolumeInfo> {
        self.expand_pool_with(pool, req, None).await
    }

    /// [`Node::expand_pool`]; with `hook` (a cluster pool's owner records
    /// the extent's member states, `volume::StateHook`) installed on the new
    /// volume and its first record written before the pool can use it: a
    /// record that fails refuses the expansion.
    pub async fn expand_pool_with(
        self: &Arc<Self>,
        pool: &str,
        req: ExpandPool,
        hook: Option<StateHook>,
    ) -> NodeResult<VolumeInfo> {
        let (p, layout, strip, block_size, n, encrypt) = {
            let st = self.state.lock().await;
            let e = st
                .volumes
                .get(pool)
                .ok_or_else(|| NodeError::no_volume(pool))?;
            let (Some(p), Some(vol)) = (e.thin_pool(), e.on_drives()) else {
                return Err(NodeError::Conflict(format!(
                    "volume {pool} is not a thin pool (pools are volumes made with \
                     --thin-pool); only a pool grows by an extent"
                )));
            };
            let geo = vol.geometry();
            let strip = vol.layout().strip_blocks() * u64::from(geo.block_size);
            (
                p.clone(),
                vol.layout().kind().to_string(),
                format!("{strip}"),
                geo.block_size,
                p.extents().len(),
                vol.is_encrypted(),
            )
        };
        let name = extent_name(pool, &req, n)?;
        let create = CreateVolume {
            name: name.clone(),
            layout: Some(req.layout.clone().unwrap_or(layout)),
            drives: req.drives.clone(),
            thin_pool: false,
            cluster: None,
            compression: None,
            pool: None,
            size: None,
            strip: Some(req.strip.clone().unwrap_or(strip)),
            block_size: Some(block_size),
            rebuild_rate: None,
            export: None,
            // The pool's data on the extent is as protected as on its base.
            encrypt,
        };
        self.create_extent_volume(create).await?;
        let mut st = self.state.lock().await;
        let Some(vol) = st.volumes.get(&name).and_then(|e| e.on_drives()).cloned() else {
            return Err(NodeError::Internal(format!(
                "volume {name} vanished while it was being added to pool {pool}"
            )));
        };
        if let Some(h) = hook {
            vol.set_state_hook(Some(h));
            if let Err(e) = vol.record_states_now().await {
                vol.set_state_hook(None);
                drop(st);
                if let Err(d) = self.delete_volume(&name, true).await {
                    tracing::error!("pool {pool}: volume {name} not deleted after a refusal: {d}");
                }
                return Err(NodeError::Unavailable(format!(
                    "pool {pool}: recording the member states of its new extent {name}: {e}; \
                     nothing was changed"
                )));
            }
        }
        let dev: Arc<dyn BlockDevice> = Arc::new(vol);
        match p.add_extent(dev.clone()).await {
            Ok(x) => {
                if let Some(e) = st.volumes.get_mut(&name) {
                    e.extent = Some(ExtentLabel {
                        pool: p.uuid(),
                        extent: x.uuid.clone(),
                    });
                }
                tracing::info!(
                    "pool {pool}: grew by volume {name} ({} bytes, extent {})",
                    x.capacity_bytes,
                    x.uuid
                );
                self.events.emit(
                    NewEvent::new(
                        EventKind::PoolExpanded,
                        format!(
                            "thin pool {pool} grew by {} bytes on volume {name} (drives {})",
                            x.capacity_bytes,
                            req.drives.join(", ")
                        ),
                    )
                    .volume(pool),
                );
                st.volume_info(pool)
                    .ok_or_else(|| NodeError::Internal(format!("pool {pool} vanished")))
            }
            Err(err @ (ThinError::Io(_) | ThinError::Poisoned)) => {
                // The pool may name the extent already: keep its volume,
                // labelled with the extent header written before the
                // checkpoint (empty if even that write failed).
                let label = ThinPool::extent_of(&dev).await.unwrap_or(ExtentLabel {
                    pool: p.uuid(),
                    extent: String::new(),
                });
                if let Some(e) = st.volumes.get_mut(&name) {
                    e.extent = Some(label);
                }
                Err(NodeError::Internal(format!(
                    "pool {pool}: adding volume {name} failed in a metadata write ({err}); \
                     the pool refuses changes until the node restarts, and volume {name} is \
                     kept since the pool may already hold data on it"
                )))
            }
            Err(err) => {
                drop(st);
                if let Err(e) = self.delete_volume(&name, true).await {
                    tracing::error!("pool {pool}: volume {name} not deleted after a refusal: {e}");
                }
                Err(thin_err(err))
            }
        }
    }
}
