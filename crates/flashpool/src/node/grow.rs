//! Online growth of a thin volume: its pool records the new size (instant,
//! durable), then its namespace takes it, and the hosts get the Namespace
//! Attribute Changed event (Linux re-reads the size by itself; a mounted
//! ext4 then grows with `resize2fs`).

use super::volumes::thin_err;
use super::{Node, NodeError, NodeResult, VolumeInfo};
use crate::echo::Echo;

impl Node {
    /// Grows volume `name` to `size` (e.g. "2GiB"). Only a thin volume
    /// grows (a volume on drives takes its drives whole); a smaller size is
    /// refused and the same size changes nothing.
    pub async fn grow_volume(&self, name: &str, size: &str) -> NodeResult<VolumeInfo> {
        self.resize_volume(name, size, false).await
    }

    /// As `grow_volume`; with `force` a smaller size shrinks the volume
    /// when the end it cuts holds no data (else refused, changing nothing).
    /// Hosts see the new size by the same event.
    pub async fn resize_volume(
        &self,
        name: &str,
        size: &str,
        force: bool,
    ) -> NodeResult<VolumeInfo> {
        let bytes = crate::units::parse_size(size).map_err(|e| {
            NodeError::BadRequest(format!("size {}: {e}; e.g. \"2GiB\"", Echo(size)))
        })?;
        let (pool, export) = {
            let st = self.state.lock().await;
            let (_, pool, e) = st.thin_of(name).map_err(|e| match e {
                NodeError::BadRequest(_) => NodeError::BadRequest(format!(
                    "volume {name} is not a thin volume: a volume on drives takes its drives \
                     whole; make thin volumes in a pool (--pool) to grow them"
                )),
                e => e,
            })?;
            (pool, e.export.clone())
        };
        let now = self.volume(name).await?.size_bytes;
        if bytes < now && force {
            pool.shrink_volume(name, bytes).await.map_err(thin_err)?;
        } else {
            pool.grow_volume(name, bytes).await.map_err(thin_err)?;
        }
        if let Some(x) = export
            && let Some(t) = self.running_target()
        {
            match t.namespace_resized(&x.nqn, x.nsid) {
                Ok((old, new)) if old != new => tracing::info!(
                    "volume {name}: nsid {} of {} went from {old} to {new} blocks",
                    x.nsid,
                    x.nqn
                ),
                Ok(_) => {}
                Err(e) => tracing::error!("volume {name}: its namespace: {e}"),
            }
        }
        self.volume(name).await
    }
}
