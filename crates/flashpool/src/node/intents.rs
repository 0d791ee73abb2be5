//! The intent-bitmap daemon, as md's: every [`PERIOD`] each volume on
//! drives makes the writes of its idle regions durable and clears the bits
//! of regions idle for a while (`volume::Volume::settle_intents`).
//!
//! Without it a bit was cleared only by a host's flush, so under a host
//! that never flushes (raw block I/O, a benchmark) every region ever
//! written stayed dirty, and each crash or takeover resynced all of them:
//! 48 whole mirrors at once after a failover in the scale bench.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use super::Node;

/// How often the volumes are visited.
pub const PERIOD: Duration = Duration::from_secs(1);

/// Volumes settled at once (each is a flush of its members).
const AT_ONCE: usize = 8;

/// Runs the daemon until the runtime stops. It skips a round while the
/// node takes volumes over (`foreground.rs`): that comes first.
pub fn spawn(node: &Arc<Node>) {
    let node = Arc::downgrade(node);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(node) = node.upgrade() else { return };
            if node.foreground.running() > 0 {
                continue;
            }
            let vols: Vec<(String, volume::Volume)> = {
                let st = node.state.lock().await;
                st.volumes
                    .iter()
                    .filter_map(|(n, e)| Some((n.clone(), e.on_drives()?.clone())))
                    .collect()
            };
            drop(node);
            futures_util::stream::iter(vols)
                .for_each_concurrent(AT_ONCE, |(n, v)| async move {
                    if let Err(e) = v.settle_intents().await {
                        tracing::debug!("volume {n}: settling its intent bits: {e}");
                    }
                })
                .await;
        }
    });
}
