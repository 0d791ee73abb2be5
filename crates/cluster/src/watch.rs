//! The session's watch on the cluster prefix: decodes changes into
//! [`ClusterEvent`]s, and resumes where it left off when the watch breaks.

use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions};
use tokio::sync::broadcast;

use crate::etcd::decode;
use crate::keys::{Key, Keys, VolumeKey};
use crate::{ClusterError, ClusterEvent, NodeRecord};

fn decode_event(keys: &Keys, ev: &etcd_client::Event) -> Option<ClusterEvent> {
    let kv = ev.kv()?;
    let put = ev.event_type() == EventType::Put;
    let warn = |e: ClusterError| tracing::warn!("ignoring undecodable cluster event: {e}");
    match keys.parse(kv.key_str().ok()?)? {
        Key::Node(_) if put => match decode::<NodeRecord>(kv) {
            Ok(mut r) => {
                r.lease = kv.lease();
                Some(ClusterEvent::NodeUp(r))
            }
            Err(e) => {
                warn(e);
                None
            }
        },
        Key::Node(n) => Some(ClusterEvent::NodeDown(n.to_string())),
        Key::Drain(n) => Some(ClusterEvent::Drain(n.to_string(), put)),
        Key::Thin(p, _) => Some(ClusterEvent::ThinChanged(p.to_string())),
        Key::Volume(v, leaf) => {
            let v = v.to_string();
            let r = match (leaf, put) {
                (VolumeKey::Spec, true) => decode(kv).map(ClusterEvent::SpecPut),
                (VolumeKey::Spec, false) => Ok(ClusterEvent::SpecDeleted(v)),
                (VolumeKey::Owner, true) => decode(kv).map(|o| ClusterEvent::OwnerSet(v, o)),
                (VolumeKey::Owner, false) => Ok(ClusterEvent::OwnerGone(v)),
                (VolumeKey::Handoff, true) => decode(kv).map(|h| ClusterEvent::HandoffSet(v, h)),
                (VolumeKey::Handoff, false) => Ok(ClusterEvent::HandoffCleared(v)),
                (VolumeKey::Qos, true) => decode(kv).map(|q| ClusterEvent::QosSet(v, q)),
                (VolumeKey::Qos, false) => Ok(ClusterEvent::QosCleared(v)),
                (VolumeKey::Epoch | VolumeKey::State, _) => return None,
            };
            r.map_err(warn).ok()
        }
    }
}

/// One watch on the whole prefix; restarted whenever it fails. A restart
/// resumes after the last revision it delivered, so no event is lost to an
/// etcd member going away; it still sends Resync (the receiver re-reads
/// what it needs), and when etcd has compacted that revision away the
/// watch starts from now.
pub(crate) async fn watch_task(
    client: Client,
    keys: Keys,
    events: broadcast::Sender<ClusterEvent>,
) {
    let prefix = keys.prefix().to_string();
    let mut first = true;
    // The next revision to deliver (None: from now).
    let mut resume: Option<i64> = None;
    loop {
        let mut wc = client.watch_client();
        let mut opts = WatchOptions::new().with_prefix();
        if let Some(r) = resume {
            opts = opts.with_start_revision(r);
        }
        let (watcher, mut stream) = match wc.watch(prefix.clone(), Some(opts)).await {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!("watch {prefix}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if !first {
            let _ = events.send(ClusterEvent::Resync);
        }
        first = false;
        loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    if resp.canceled() {
                        if resp.compact_revision() > 0 {
                            // our resume point is gone: from now, after a Resync
                            resume = None;
                        }
                        tracing::warn!("watch {prefix} canceled: {}", resp.cancel_reason());
                        break;
                    }
                    for ev in resp.events() {
                        if let Some(e) = decode_event(&keys, ev) {
                            let _ = events.send(e);
                        }
                        if let Some(kv) = ev.kv() {
                            resume = Some(resume.unwrap_or(0).max(kv.mod_revision() + 1));
                        }
                    }
                    if let Some(h) = resp.header() {
                        // everything up to the header's revision is delivered
                        resume = Some(resume.unwrap_or(0).max(h.revision() + 1));
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!("watch {prefix}: {e}; re-establishing");
                    break;
                }
            }
        }
        drop(watcher);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
