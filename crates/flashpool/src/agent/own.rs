//! Owning a cluster volume: when to claim it, taking it over, and the two
//! ways of letting it go (fenced, or handed over cleanly).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::{ClusterError, Handoff, NodeRecord, Session, VolumeState, rendezvous};
use nvmf_target::AnaState;

use super::{Agent, COOLDOWN, HANDOFF_STALE, RANK_DELAY, Served};
use crate::node::AssembleVolume;

impl Agent {
    /// Brings one volume's ownership where etcd says it should be.
    pub(super) async fn settle(
        self: &Arc<Self>,
        s: &Session,
        sv: &mut Served,
        nodes: &[NodeRecord],
        draining: &HashSet<String>,
    ) -> Result<(), ClusterError> {
        let name = sv.spec.name.clone();
        let me = s.node().to_string();
        let owner = s.owner(&name).await?;
        match (owner, sv.epoch) {
            (Some(o), Some(e)) if o.node == me && o.epoch == e => {
                if let Some(why) = self.node.volume_fenced(&name).await {
                    self.step_down(sv, &why).await;
                    s.release(&name, e).await?;
                    return Ok(());
                }
                if let Some(h) = s.handoff(&name).await?
                    && h.epoch == e
                    && h.to != me
                {
                    let to = h.to.clone();
                    self.hand_off(s, sv, e, &to).await;
                    return Ok(());
                }
                if draining.contains(&me) {
                    let others: Vec<&str> = eligible(nodes, draining)
                        .into_iter()
                        .filter(|n| *n != me)
                        .collect();
                    if let Some(to) = rendezvous(&name, others).first() {
                        tracing::info!("volume {name}: this node drains; handing it to {to}");
                        s.set_handoff(
                            &name,
                            &Handoff {
                                to: to.to_string(),
                                epoch: e,
                            },
                        )
                        .await?;
                        self.kick.notify_one();
                    }
                }
            }
            (Some(o), Some(_)) => {
                let why = format!("deposed: {} owns it now at epoch {}", o.node, o.epoch);
                self.step_down(sv, &why).await;
            }
            (Some(o), None) if o.node == me => {
                // Claimed in an earlier attempt that did not finish: give it
                // back, so that whoever can serve it takes it.
                tracing::warn!(
                    "volume {name}: owned here at epoch {} but not running; releasing it",
                    o.epoch
                );
                s.release(&name, o.epoch).await?;
            }
            (Some(_), None) => {
                self.unowned_since
                    .lock()
                    .expect("not poisoned")
                    .remove(&name);
            }
            (None, Some(_)) => {
                self.step_down(sv, "its ownership key is gone (lease expired or revoked)")
                    .await;
            }
            (None, None) => self.maybe_claim(s, sv, nodes, draining).await?,
        }
        Ok(())
    }

    /// Claims an unowned volume when it is this node's turn: at once for
    /// the handoff's target or the rendezvous winner among live, undrained
    /// nodes, later for the next in that order.
    async fn maybe_claim(
        self: &Arc<Self>,
        s: &Session,
        sv: &mut Served,
        nodes: &[NodeRecord],
        draining: &HashSet<String>,
    ) -> Result<(), ClusterError> {
        let name = sv.spec.name.clone();
        let me = s.node().to_string();
        let now = Instant::now();
        if self
            .cooldown
            .lock()
            .expect("not poisoned")
            .get(&name)
            .is_some_and(|t| *t > now)
        {
            return Ok(());
        }
        let live: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        let handoff = s.handoff(&name).await?;
        let rank = match &handoff {
            Some(h) if h.to == me => 0,
            Some(h) if live.contains(&h.to.as_str()) && !self.handoff_stale(&name, h, now) => {
                return Ok(());
            }
            _ => match rendezvous(&name, eligible(nodes, draining))
                .iter()
                .position(|n| *n == me)
            {
                Some(r) => r as u32,
                None => return Ok(()),
            },
        };
        let since = *self
            .unowned_since
            .lock()
            .expect("not poisoned")
            .entry(name.clone())
            .or_insert(now);
        let due = since + RANK_DELAY * rank;
        if now < due {
            self.kick_after(due - now);
            return Ok(());
        }
        let Some(o) = s.claim(&name).await? else {
            return Ok(());
        };
        self.unowned_since
            .lock()
            .expect("not poisoned")
            .remove(&name);
        self.take_over(s, sv, o.epoch).await;
        Ok(())
    }

    fn handoff_stale(&self, name: &str, h: &Handoff, now: Instant) -> bool {
        handoff_stale(
            &mut self.handoff_seen.lock().expect("not poisoned"),
            name,
            h,
            now,
        )
    }

    /// Takes over a volume just claimed at `epoch`: connects to its members,
    /// preempts the old owner's reservations, assembles (journal replay,
    /// resync), and turns its group Optimized. On failure it gives the
    /// volume back and leaves it to the others for a while.
    async fn take_over(self: &Arc<Self>, s: &Session, sv: &mut Served, epoch: u64) {
        let t0 = Instant::now();
        let name = sv.spec.name.clone();
        let req = AssembleVolume {
            drives: sv.spec.drives.clone(),
            takeover: true,
            export: None,
            force: false,
        };
        let res = match self.node.assemble_volume(req).await {
            Ok(info) if info.name == name => Ok(info),
            Ok(info) => {
                self.node
                    .drop_fenced(&info.name, "not the volume etcd names")
                    .await;
                Err(format!(
                    "the drives hold volume {:?}, not {name:?}",
                    info.name
                ))
            }
            Err(e) => Err(e.to_string()),
        };
        let dev = match res {
            Ok(_) => self.node.volume_device(&name).await,
            Err(_) => None,
        };
        let Some(dev) = dev else {
            let why = res.err().unwrap_or_else(|| "assembled, then gone".into());
            tracing::error!("volume {name}: cannot take it over at epoch {epoch}: {why}");
            self.cooldown
                .lock()
                .expect("not poisoned")
                .insert(name.clone(), Instant::now() + COOLDOWN);
            if let Err(e) = s.release(&name, epoch).await {
                tracing::warn!("volume {name}: releasing after a failed takeover: {e}");
            }
            return;
        };
        let info = res.expect("checked");
        sv.switch.activate(dev);
        sv.epoch = Some(epoch);
        self.owned
            .lock()
            .expect("not poisoned")
            .insert(name.clone(), (sv.spec.ana_group, sv.switch.clone()));
        self.target
            .set_ana_state(sv.spec.ana_group, AnaState::Optimized);
        let took = t0.elapsed();
        tracing::info!(
            "volume {name}: owned here at epoch {epoch}, generation {} (takeover {} ms)",
            info.generation,
            took.as_millis()
        );
        let st = VolumeState {
            epoch,
            generation: info.generation,
            members: info.members.iter().map(|m| m.state.clone()).collect(),
            note: format!("taken over by {} in {} ms", s.node(), took.as_millis()),
        };
        if let Err(e) = s.put_state(&name, &st).await {
            tracing::warn!("volume {name}: recording its state: {e}");
        }
        if let Ok(Some(h)) = s.handoff(&name).await
            && h.to == s.node()
        {
            let _ = s.clear_handoff(&name).await;
        }
        self.handoff_seen
            .lock()
            .expect("not poisoned")
            .remove(&name);
    }

    /// Lets go of a volume without writing: group Inaccessible first (the
    /// host stops sending), then the switch, then the volume itself.
    pub(super) async fn step_down(&self, sv: &mut Served, why: &str) {
        let name = sv.spec.name.clone();
        self.target
            .set_ana_state(sv.spec.ana_group, AnaState::Inaccessible);
        sv.switch.deactivate();
        self.owned.lock().expect("not poisoned").remove(&name);
        self.node.drop_fenced(&name, why).await;
        sv.epoch = None;
        tracing::warn!("volume {name}: stepped down: {why}");
    }

    pub(super) async fn step_down_all(&self, why: &str) {
        let mut served = self.served.lock().await;
        for sv in served.values_mut().filter(|v| v.epoch.is_some()) {
            self.step_down(sv, why).await;
        }
    }

    /// A planned move: the group goes to Change (the host holds its I/O),
    /// commands in flight finish, the volume is closed clean and its
    /// reservations released, then ownership; `to` claims it at once.
    async fn hand_off(&self, s: &Session, sv: &mut Served, epoch: u64, to: &str) {
        let t0 = Instant::now();
        let name = sv.spec.name.clone();
        let g = sv.spec.ana_group;
        self.target.set_ana_state(g, AnaState::Change);
        sv.switch.deactivate();
        let drained = sv.switch.drain(Duration::from_secs(5)).await;
        self.owned.lock().expect("not poisoned").remove(&name);
        if !drained {
            self.node
                .drop_fenced(&name, "commands still running after 5 s of a planned move")
                .await;
        } else if let Err(e) = self.node.hand_over(&name).await {
            tracing::error!("volume {name}: clean handover failed ({e}); letting go fenced");
            self.node.drop_fenced(&name, "clean handover failed").await;
        }
        sv.epoch = None;
        if let Err(e) = s.release(&name, epoch).await {
            tracing::warn!("volume {name}: releasing ownership: {e}");
        }
        self.target.set_ana_state(g, AnaState::Inaccessible);
        tracing::info!(
            "volume {name}: handed over to {to} ({} ms here)",
            t0.elapsed().as_millis()
        );
    }
}

/// Whether `h`, the handoff of `name`, has waited longer than
/// [`HANDOFF_STALE`] since this node first saw it. `seen` remembers the
/// handoff itself: an entry left from an earlier move of the volume must
/// not make a new handoff look stale (a bystander would claim at once).
fn handoff_stale(
    seen: &mut HashMap<String, (Handoff, Instant)>,
    name: &str,
    h: &Handoff,
    now: Instant,
) -> bool {
    let e = seen
        .entry(name.to_string())
        .or_insert_with(|| (h.clone(), now));
    if e.0 != *h {
        *e = (h.clone(), now);
    }
    now.duration_since(e.1) > HANDOFF_STALE
}

/// Live nodes that may own volumes (not draining).
fn eligible<'a>(nodes: &'a [NodeRecord], draining: &HashSet<String>) -> Vec<&'a str> {
    nodes
        .iter()
        .map(|n| n.name.as_str())
        .filter(|n| !draining.contains(*n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_handoff_is_not_stale_because_an_old_one_was_seen() {
        let mut seen = HashMap::new();
        let t0 = Instant::now();
        let h = |to: &str, epoch| Handoff {
            to: to.into(),
            epoch,
        };
        assert!(!handoff_stale(&mut seen, "v", &h("b", 1), t0));
        // the move to b went through long ago; now one to c, same volume
        let later = t0 + HANDOFF_STALE * 4;
        assert!(!handoff_stale(&mut seen, "v", &h("c", 2), later));
        // the same handoff, unanswered past the limit: stale
        assert!(handoff_stale(
            &mut seen,
            "v",
            &h("c", 2),
            later + HANDOFF_STALE + Duration::from_millis(1)
        ));
    }
}
