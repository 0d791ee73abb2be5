//! The discovery service: connect to the discovery NQN, read the log, leave.

use std::net::SocketAddr;

use nvme_wire::fabrics::DISCOVERY_NQN;
use nvme_wire::fabrics::discovery::Entry;

use crate::controller::Controller;
use crate::error::Result;
use crate::options::HostOptions;

/// The discovery log of the target at `addr` (usually port 8009), as this host sees it.
pub async fn discover(addr: SocketAddr) -> Result<Vec<Entry>> {
    discover_with(addr, HostOptions::default()).await
}

/// [`discover`] with a given host identity, digests and timeout.
pub async fn discover_with(addr: SocketAddr, opts: HostOptions) -> Result<Vec<Entry>> {
    let opts = HostOptions {
        nr_io_queues: 0,
        // A one-shot discovery connection needs no keep-alive.
        kato_ms: 0,
        ..opts
    };
    let ctrl = Controller::connect(addr, DISCOVERY_NQN, opts).await?;
    let log = ctrl.discovery_log().await;
    let bye = ctrl.disconnect().await;
    let log = log?;
    if let Err(e) = bye {
        tracing::debug!("discovery controller at {addr}: disconnect: {e}");
    }
    Ok(log)
}
