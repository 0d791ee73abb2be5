//! Taking a volume over while some of its members cannot be reached (an
//! enclosure down with its owner), and bringing those members back.
//!
//! A takeover waits a bounded time for each member; those that do not
//! answer are left out when the layout tolerates it, and the volume runs
//! degraded. What the reachable members say is trusted only as far as the
//! cluster's record of member states allows (`volume::StateHook`: the owner
//! records every member-state change before a write that depends on it is
//! acknowledged): a member the record says failed, or one older than the
//! record, may have missed acknowledged writes and is left out too. Beyond
//! the tolerance the takeover is refused before anything is claimed.
//!
//! A member left out comes back only through re-add: when it answers
//! again, the new owner preempts the old owner's reservation on it and
//! resyncs what it missed (through the bitmap), or rebuilds it in full when
//! another owner wrote it after this one's takeover. It is never trusted
//! over the members the volume was assembled from.

use std::sync::Arc;
use std::time::Duration;

use volume::superblock::Superblock;
use volume::{Layout, MemberState};

use super::{Node, NodeError, NodeResult, read_head};

/// How a takeover may leave members out.
#[derive(Debug, Clone)]
pub struct Degraded {
    /// How long to wait for each member's connection.
    pub wait: Duration,
    /// The member states the cluster last recorded, if any.
    pub recorded: Option<Recorded>,
}

/// A volume's member states as its owner last recorded them.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub generation: u64,
    /// State names by position (`active`, `failed`, `rebuilding`, `resyncing`).
    pub members: Vec<String>,
}

/// What a degraded assembly leaves out: positions and why.
#[derive(Debug, Default)]
pub(super) struct LeftOut {
    /// Positions not to assemble from (distrusted members that answered).
    pub distrusted: Vec<u16>,
}

impl Degraded {
    /// Checks that the volume can run from the members that answered
    /// (`chosen`: position -> drive, `generations`: their superblocks'),
    /// after the `unreachable` drives are left out. Refuses, naming what is
    /// missing, when more members are missing, failed or distrusted than
    /// the layout tolerates; nothing is claimed before this check.
    pub(super) fn check(
        &self,
        newest: &Superblock,
        chosen: &std::collections::BTreeMap<u16, String>,
        generations: &std::collections::BTreeMap<u16, u64>,
        unreachable: &[(String, String)],
    ) -> NodeResult<LeftOut> {
        let n = newest.members.len();
        let data_blocks: Vec<u64> = newest.members.iter().map(|m| m.data_blocks).collect();
        let bs = newest.block_size.max(1);
        let tolerated = Layout::new(
            newest.kind,
            u64::from(newest.strip_bytes / bs),
            &data_blocks,
        )
        .map(|l| l.parity_columns())
        .map_err(|e| NodeError::Conflict(format!("volume {:?}: {e}", newest.name)))?;
        let recorded = self.recorded.as_ref().filter(|r| r.members.len() == n);
        let mut out = LeftOut::default();
        let mut bad: Vec<String> = Vec::new();
        for p in 0..n {
            let pos = p as u16;
            let Some(drive) = chosen.get(&pos) else {
                bad.push(format!("position {p} unreachable"));
                continue;
            };
            let state = newest.members[p].state;
            if state != MemberState::Active {
                bad.push(format!("{drive} {}", state_word(state)));
                // A drive older than the position it claims (a replaced
                // member that came back while its replacement is away)
                // would fail the whole assembly as stale: left out instead.
                let old = generations
                    .get(&pos)
                    .is_some_and(|g| g + 1 < newest.generation);
                if state != MemberState::Failed && old {
                    out.distrusted.push(pos);
                }
                continue;
            }
            if let Some(r) = recorded {
                let gen_ok = generations.get(&pos).is_some_and(|g| *g >= r.generation);
                if r.members[p] != "active" || !gen_ok {
                    bad.push(format!(
                        "{drive} not trusted (the cluster recorded it {} at generation {}; \
                         it is at {})",
                        r.members[p],
                        r.generation,
                        generations.get(&pos).copied().unwrap_or(0)
                    ));
                    out.distrusted.push(pos);
                }
            }
        }
        if bad.len() > tolerated {
            let unreach: Vec<String> = unreachable
                .iter()
                .map(|(d, why)| format!("{d} ({why})"))
                .collect();
            return Err(NodeError::Conflict(format!(
                "volume {:?} ({}) cannot run: {} of its {n} members are unusable ({}) and it \
                 tolerates {tolerated}{}; it is taken over as soon as enough members answer",
                newest.name,
                newest.kind,
                bad.len(),
                bad.join(", "),
                if unreach.is_empty() {
                    String::new()
                } else {
                    format!("; unreachable: {}", unreach.join(", "))
                }
            )));
        }
        Ok(out)
    }
}

fn state_word(s: MemberState) -> &'static str {
    super::views::member_state_name(s)
}

impl Node {
    /// After a degraded takeover: waits for `drive` (left out of volume
    /// `name` with uuid `uuid`) to answer, then preempts the last owner's
    /// reservation on it and re-adds it. Ends when it is back, or the volume
    /// is gone, fenced, or no longer misses it.
    pub(crate) fn spawn_rejoin(self: &Arc<Self>, name: String, uuid: String, drive: String) {
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(250);
            loop {
                let Some(n) = node.upgrade() else { return };
                match n.rejoin_once(&name, &uuid, &drive).await {
                    Ok(true) => return,
                    Ok(false) => {}
                    Err(e) => tracing::debug!("volume {name}: drive {drive} not back yet: {e}"),
                }
                drop(n);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        });
    }

    /// One try; `true` when nothing is left to do.
    async fn rejoin_once(
        self: &Arc<Self>,
        name: &str,
        uuid: &str,
        drive: &str,
    ) -> NodeResult<bool> {
        let still_ours = |st: &super::NodeState| {
            st.volumes
                .get(name)
                .filter(|e| e.uuid() == uuid)
                .and_then(|e| e.on_drives())
                .is_some_and(|v| !v.is_fenced())
        };
        let have = {
            let st = self.state.lock().await;
            if !still_ours(&st) {
                return Ok(true);
            }
            st.check_not_assembling(drive)?;
            st.drives.get(drive).map(|d| d.dev.clone())
        };
        let (dev, fresh) = match have {
            Some(dev) => (dev, None),
            None => {
                let d =
                    tokio::time::timeout(Duration::from_secs(2), self.connect_remote(drive, None))
                        .await
                        .map_err(|_| {
                            NodeError::Unavailable(format!("drive {drive}: no answer"))
                        })??;
                (d.dev.clone(), Some(d))
            }
        };
        let head = read_head(&dev)
            .await
            .map_err(|e| NodeError::Unavailable(format!("drive {drive}: {e}")))?;
        let mut st = self.state.lock().await;
        let sb = match Superblock::decode(&head) {
            Ok(sb) if volume::superblock::uuid_string(&sb.uuid) == uuid => sb,
            _ => {
                tracing::warn!(
                    "volume {name}: drive {drive} answers again but no longer holds the volume; \
                     it stays out (replace the member)"
                );
                if let Some(d) = fresh {
                    let _ = d.dev.shutdown();
                }
                return Ok(true);
            }
        };
        let p = usize::from(sb.position);
        let failed = still_ours(&st)
            && st.volumes[name]
                .on_drives()
                .is_some_and(|v| v.member_states().get(p) == Some(&MemberState::Failed));
        if !failed {
            if let Some(d) = fresh {
                let _ = d.dev.shutdown();
            }
            return Ok(true);
        }
        if let Some(d) = fresh {
            if let Some(r) = &d.remote {
                self.watch_link(drive, r);
            }
            st.drives.insert(drive.to_string(), d);
            self.save_remote_drives(&st)?;
        }
        let e = st.volumes.get_mut(name).expect("checked");
        let was = std::mem::replace(&mut e.drives[p], drive.to_string());
        match self.re_add_member(&mut st, drive, true).await {
            Ok(info) => {
                tracing::warn!(
                    "volume {name}: drive {drive}, left out at the takeover, is back: {}",
                    info.message
                );
                Ok(true)
            }
            Err(e) => {
                if let Some(v) = st.volumes.get_mut(name) {
                    v.drives[p] = was;
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use volume::LayoutKind;
    use volume::superblock::MemberEntry;

    use super::*;

    fn sb(kind: LayoutKind, states: &[MemberState], generation: u64) -> Superblock {
        Superblock {
            uuid: [7; 16],
            generation,
            position: 0,
            kind,
            clean: true,
            block_size: 4096,
            strip_bytes: 65536,
            meta_bytes: 1 << 20,
            region_stripes: 1,
            records_at: 0,
            role: Default::default(),
            key: None,
            members: states
                .iter()
                .map(|s| MemberEntry {
                    state: *s,
                    data_blocks: 1024,
                    failed_at: 0,
                })
                .collect(),
            name: "v".into(),
        }
    }

    fn chosen(ps: &[u16]) -> (BTreeMap<u16, String>, BTreeMap<u16, u64>) {
        (
            ps.iter().map(|p| (*p, format!("e{p}:d0"))).collect(),
            ps.iter().map(|p| (*p, 5)).collect(),
        )
    }

    fn policy(recorded: Option<(u64, &[&str])>) -> Degraded {
        Degraded {
            wait: Duration::from_secs(1),
            recorded: recorded.map(|(g, m)| Recorded {
                generation: g,
                members: m.iter().map(|s| s.to_string()).collect(),
            }),
        }
    }

    const A: MemberState = MemberState::Active;

    const F: MemberState = MemberState::Failed;

    fn unreachable(d: &str) -> Vec<(String, String)> {
        vec![(d.to_string(), "no answer in 1 s".to_string())]
    }

    #[test]
    fn within_the_tolerance_a_takeover_runs_degraded() {
        let s = sb(LayoutKind::Raid1, &[A, A], 5);
        let (c, g) = chosen(&[0]);
        let out = policy(None)
            .check(&s, &c, &g, &unreachable("e1:d0"))
            .unwrap();
        assert!(out.distrusted.is_empty());
        let s = sb(LayoutKind::Raid6, &[A; 6], 5);
        let (c, g) = chosen(&[0, 2, 3, 5]);
        assert!(policy(None).check(&s, &c, &g, &[]).is_ok());
    }

    #[test]
    fn beyond_the_tolerance_it_is_refused_naming_what_is_missing() {
        let s = sb(LayoutKind::Raid6, &[A; 6], 5);
        let (c, g) = chosen(&[0, 2, 3]);
        let e = policy(None)
            .check(&s, &c, &g, &unreachable("e1:d0"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("3 of its 6 members are unusable"), "{e}");
        assert!(e.contains("tolerates 2"), "{e}");
        assert!(e.contains("unreachable: e1:d0 (no answer in 1 s)"), "{e}");
        // a member already failed counts as well
        let s = sb(LayoutKind::Raid5, &[A, A, F], 5);
        let (c, g) = chosen(&[0, 2]);
        let e = policy(None).check(&s, &c, &g, &[]).unwrap_err().to_string();
        assert!(
            e.contains("position 1 unreachable") && e.contains("failed"),
            "{e}"
        );
    }

    #[test]
    fn a_member_the_cluster_recorded_failed_is_not_trusted() {
        // The last owner failed member 1 of a mirror (recorded at generation
        // 6) and wrote on without it; member 0 is unreachable now. Member 1's
        // own superblock still says both are active: serving it would lose
        // acknowledged writes.
        let s = sb(LayoutKind::Raid1, &[A, A], 5);
        let (c, g) = chosen(&[1]);
        let e = policy(Some((6, &["active", "failed"])))
            .check(&s, &c, &g, &unreachable("e0:d0"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("e1:d0 not trusted"), "{e}");
        // The same with the record's states lost but its generation newer.
        let e = policy(Some((6, &["active", "active"])))
            .check(&s, &c, &g, &unreachable("e0:d0"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("it is at 5"), "{e}");
        // A raid6 runs on, leaving the distrusted member out.
        let s = sb(LayoutKind::Raid6, &[A; 6], 6);
        let (c, mut g) = chosen(&[0, 1, 2, 3, 4]);
        g.values_mut().for_each(|v| *v = 6);
        let rec = ["active", "active", "active", "failed", "active", "active"];
        let out = policy(Some((6, &rec))).check(&s, &c, &g, &[]).unwrap();
        assert_eq!(out.distrusted, vec![3]);
        // A record of another shape (members changed) is not applied.
        let out = policy(Some((9, &["failed"])))
            .check(&s, &c, &g, &[])
            .unwrap();
        assert!(out.distrusted.is_empty());
    }

    /// A replaced member that comes back while its replacement is away
    /// claims a position being rebuilt with an older superblock: left out
    /// (the volume runs degraded), not taken as stale.
    #[test]
    fn an_old_drive_at_a_rebuilding_position_is_left_out() {
        const R: MemberState = MemberState::Rebuilding { checkpoint: 0 };
        let distrusted = |s: &Superblock, c: &BTreeMap<u16, String>, g: &BTreeMap<u16, u64>| {
            policy(None).check(s, c, g, &[]).unwrap().distrusted
        };
        let s = sb(LayoutKind::Raid5, &[A, R, A], 9);
        let (c, mut g) = chosen(&[0, 1, 2]);
        g.insert(0, 9);
        g.insert(2, 9);
        // e1:d0 claims position 1 at generation 5.
        assert_eq!(distrusted(&s, &c, &g), vec![1]);
        // At the volume's generation (the replacement itself), it stays.
        g.insert(1, 9);
        assert!(distrusted(&s, &c, &g).is_empty());
        // A failed member is not: the assembly keeps it failed.
        let s = sb(LayoutKind::Raid5, &[A, F, A], 9);
        g.insert(1, 5);
        assert!(distrusted(&s, &c, &g).is_empty());
    }
}
