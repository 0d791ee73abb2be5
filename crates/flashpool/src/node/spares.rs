//! Hot spares: a drive declared `spare = true` takes the place of a failed
//! member of a redundant volume by itself, like md's spares, and the
//! rebuild starts at once. The watch looks every half second (a member can
//! fail on an I/O error deep in the data path, which tells no one), picks
//! the smallest spare that fits, and replaces through the same checked path
//! as `drive replace`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use volume::MemberState;

use super::{Node, NodeState};
use crate::events::{EventKind, NewEvent};

const WATCH_EVERY: Duration = Duration::from_millis(500);

/// One replacement to try: the failed member's drive and the spare.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct SparePick {
    pub volume: String,
    pub position: usize,
    pub failed: String,
    pub spare: String,
}

impl NodeState {
    /// For each failed member of a redundant volume that can still be
    /// rebuilt, the smallest free spare that can take its place.
    pub(super) fn spare_picks(&self) -> Vec<SparePick> {
        let mut taken: HashSet<&str> = HashSet::new();
        let mut picks = Vec::new();
        for e in self.volumes.values() {
            let Some(vol) = e.on_drives() else { continue };
            if vol.layout().parity_columns() == 0 || vol.is_failed() || vol.is_fenced() {
                continue;
            }
            for (p, s) in vol.member_states().iter().enumerate() {
                if *s != MemberState::Failed {
                    continue;
                }
                let Some(failed) = e.drives.get(p) else {
                    continue;
                };
                let mut spares: Vec<(&str, u64)> = self
                    .drives
                    .values()
                    .filter(|d| d.spare && !d.failed && !taken.contains(d.name.as_str()))
                    .filter(|d| self.user_of(&d.name).is_none() && d.export.is_none())
                    .filter(|d| self.check_not_assembling(&d.name).is_ok())
                    .filter(|d| vol.check_replacement(p, &d.dev).is_ok())
                    .map(|d| (d.name.as_str(), d.dev.geometry().size_bytes()))
                    .collect();
                spares.sort_by_key(|&(n, size)| (size, n));
                if let Some(&(spare, _)) = spares.first() {
                    taken.insert(spare);
                    picks.push(SparePick {
                        volume: e.name.clone(),
                        position: p,
                        failed: failed.clone(),
                        spare: spare.to_string(),
                    });
                }
            }
        }
        picks
    }
}

impl Node {
    /// Starts the hot-spare watch (for as long as the node lives).
    pub fn spawn_spare_watch(self: &Arc<Self>) {
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            // A pick that failed is not retried until something changes,
            // so one bad spare does not fill the log.
            let mut refused: HashSet<SparePick> = HashSet::new();
            loop {
                tokio::time::sleep(WATCH_EVERY).await;
                let Some(n) = node.upgrade() else { return };
                n.take_spares(&mut refused).await;
            }
        });
    }

    /// One look: replaces every failed member a spare can take.
    pub(super) async fn take_spares(self: &Arc<Self>, refused: &mut HashSet<SparePick>) {
        let picks = self.state.lock().await.spare_picks();
        refused.retain(|r| picks.contains(r));
        for pick in picks {
            if refused.contains(&pick) {
                continue;
            }
            let SparePick {
                volume,
                position,
                failed,
                spare,
            } = &pick;
            match self.replace_drive(failed, spare).await {
                Ok(_) => {
                    self.events.emit(
                        NewEvent::new(
                            EventKind::SpareTaken,
                            format!(
                                "volume {volume}: hot spare {spare} takes the place of failed \
                                 drive {failed} (position {position}); rebuilding onto it"
                            ),
                        )
                        .volume(volume)
                        .drive(spare),
                    );
                }
                Err(e) => {
                    tracing::warn!(
                        "volume {volume}: hot spare {spare} cannot replace failed drive {failed}: {e}"
                    );
                    refused.insert(pick);
                }
            }
        }
    }
}
