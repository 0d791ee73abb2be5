//! Carrying the decisions out for many volumes at once: which
//! volumes the next pass settles, the per-volume tasks that settle them,
//! and the `served` map those tasks and the API share.
//!
//! A pass reads the members and the specs (three range reads; the QoS
//! limits come with the specs, see `qos.rs`), then starts
//! one task per volume it names: the volumes named by the watch events
//! since the last pass (a burst of events is one pass), or every volume on
//! the periodic resync and whenever the members change. The pass does not
//! wait for its tasks, so a slow or failing takeover delays no other
//! volume; each task takes its volume's keys from the pass's read where
//! that is safe ([`PassRead::usable`]; else it reads them itself), decides
//! ([`super::decide`]) and acts ([`Agent::settle`]). At most one task runs
//! per volume (a volume named again while its task runs is settled once
//! more after it), and at most [`concurrency`] at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::{ClusterError, ClusterEvent, Owner, Session, VolumeRead, VolumeSpec};
use tokio::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Semaphore};

use super::decide::{self, Members};
use super::{Agent, Served};

/// How many volumes are settled at once: takeovers wait mostly on the
/// network and etcd, so a few more than the cores.
pub(super) fn concurrency() -> usize {
    // A takeover mostly waits on the network (connects, reservations,
    // etcd): measured with 48 volumes on 2 cores, 4 at a time served the
    // last after six waves (2.9-3.6 s); the CPU work (resync) is short. A
    // planned handoff waits even more (the old owner's close, then the new
    // owner's claim): a drain of 48 kept 0.45 of 2 CPUs busy with 16 at a
    // time (docs/performance.md, "A drain of 48 volumes").
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (8 * cores).max(32)
}

/// A volume's keys as its pass read them ([`cluster::PassView::reads`]),
/// and when that read was sent.
pub(super) struct PassRead {
    pub read: VolumeRead,
    pub at: Instant,
}

impl PassRead {
    /// How old a pass's read may be when its volume's task decides on it.
    /// A task that waited longer (for a slot, or for the API's hold on the
    /// served map) reads its keys again.
    const FRESH: Duration = Duration::from_millis(250);

    /// The read, if `name`'s task may decide on it instead of reading
    /// again: fresh, of a volume not run here, and not owned by this node.
    ///
    /// Why that is safe: for such a volume a decision can only serve it on
    /// standby, stop serving it (deleting), keep, wait or claim. A claim
    /// on this read compares the owner key (absent) and the epoch key's
    /// revision and claims nothing if they moved (`Session::claim_on`):
    /// anything that claimed, released or marked the volume since the read
    /// claimed it first. Whatever changed since comes as a watch event,
    /// which settles the volume once more, on a newer read. A volume run here, or owned by
    /// this node, is different: a change this node made itself after the
    /// read (its own takeover, release or handoff, by a task that ended
    /// since) would be undone by a decision on it.
    pub(super) fn usable(self, me: &str, run_here: bool) -> Option<VolumeRead> {
        (self.at.elapsed() < Self::FRESH
            && !run_here
            && self.read.owner.as_ref().is_none_or(|o| o.node != me))
        .then_some(self.read)
    }
}

/// The volumes served here. A volume's task takes its [`Served`] out while
/// it acts and puts it back after, holding the map's lock only for that;
/// the API's [`ServedMap::lock`] waits until no task acts and keeps them
/// all out while it holds the map (as the whole-pass lock did before).
pub(super) struct ServedMap {
    /// Shared by every acting task, exclusive for the API.
    gate: RwLock<()>,
    map: Mutex<BTreeMap<String, Served>>,
}

/// The whole map, with no volume's task acting.
pub(super) struct ServedGuard<'a> {
    _gate: RwLockWriteGuard<'a, ()>,
    map: MutexGuard<'a, BTreeMap<String, Served>>,
}

impl Deref for ServedGuard<'_> {
    type Target = BTreeMap<String, Served>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl DerefMut for ServedGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}

impl ServedMap {
    pub(super) fn new() -> Self {
        ServedMap {
            gate: RwLock::new(()),
            map: Mutex::new(BTreeMap::new()),
        }
    }

    /// Exclusive use of the whole map: waits for the tasks acting now.
    pub(super) async fn lock(&self) -> ServedGuard<'_> {
        let gate = self.gate.write().await;
        ServedGuard {
            _gate: gate,
            map: self.map.lock().await,
        }
    }

    /// Held by a volume's task while it acts.
    async fn acting(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().await
    }

    async fn take(&self, name: &str) -> Option<Served> {
        self.map.lock().await.remove(name)
    }

    async fn put(&self, name: &str, sv: Served) {
        self.map.lock().await.insert(name.to_string(), sv);
    }

    async fn names(&self) -> Vec<String> {
        self.map.lock().await.keys().cloned().collect()
    }
}

/// The volumes the next pass settles.
#[derive(Default)]
pub(super) struct Dirty {
    /// Every volume.
    all: bool,
    /// Every volume that the pass's read does not show [`steady`].
    tick: bool,
    names: BTreeSet<String>,
    /// Volumes whose owner key was set: settled unless the pass's read
    /// shows them [`steady`] (see [`Agent::owner_news`]).
    owners: BTreeSet<String>,
}

impl Dirty {
    fn is_empty(&self) -> bool {
        !self.all && !self.tick && self.names.is_empty() && self.owners.is_empty()
    }

    fn merge(&mut self, o: Dirty) {
        self.all |= o.all;
        self.tick |= o.tick;
        self.names.extend(o.names);
        self.owners.extend(o.owners);
    }
}

/// Whether a volume needs no settle on a periodic pass: the pass's own
/// read shows it owned by a live node, with no handoff, and this node runs
/// it as that says (the owner at that epoch, not fenced; or a standby of
/// another node's). Anything else (unowned, a move, a dead or draining
/// owner, a fenced or missing volume, a pool, whose thin volumes the
/// settle reads) is settled, with fresh reads, as before. What changes
/// between ticks comes as watch events, which settle their volumes at
/// once; every [`FULL_EVERY`]th tick settles all as a safety net. So an
/// idle cluster's tick costs its three range reads, not one owner read
/// per volume.
pub(super) fn steady(
    me: &str,
    members: &Members,
    owner: Option<&Owner>,
    handoff: bool,
    run_here: Option<&RunHere>,
) -> bool {
    let (Some(o), Some(r)) = (owner, run_here) else {
        return false;
    };
    if handoff || r.pool || r.fenced || members.draining.contains(me) {
        return false;
    }
    if !members.live.contains(&o.node) {
        return false;
    }
    match r.epoch {
        Some(e) => o.node == me && o.epoch == e,
        None => o.node != me,
    }
}

/// What [`steady`] needs of a volume served here.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RunHere {
    /// The epoch this node owns it at; None: a standby.
    pub epoch: Option<u64>,
    pub pool: bool,
    pub fenced: bool,
}

/// Every how many ticks (seconds) a pass settles every volume, steady or
/// not.
pub(super) const FULL_EVERY: u64 = 10;

/// The volume an event is about; `None` for one that may change any
/// volume's decision (members, drains, a restarted watch).
fn volume_of(e: &ClusterEvent) -> Option<&str> {
    match e {
        ClusterEvent::SpecPut(s) => Some(&s.name),
        ClusterEvent::SpecDeleted(v)
        | ClusterEvent::OwnerSet(v, _)
        | ClusterEvent::OwnerGone(v)
        | ClusterEvent::HandoffSet(v, _)
        | ClusterEvent::HandoffCleared(v)
        | ClusterEvent::ThinChanged(v)
        | ClusterEvent::QosSet(v, _)
        | ClusterEvent::QosCleared(v) => Some(v),
        ClusterEvent::NodeUp(_)
        | ClusterEvent::NodeDown(_)
        | ClusterEvent::Drain(..)
        | ClusterEvent::Resync => None,
    }
}

impl Agent {
    /// The next pass settles what `e` is about.
    pub(super) fn mark_event(&self, e: &ClusterEvent) {
        // new limits come with their value: applied at once, nothing to settle
        if self.qos_event(e) {
            return;
        }
        match (e, volume_of(e)) {
            (ClusterEvent::OwnerSet(v, _), _) => {
                self.dirty.lock().owners.insert(v.clone());
            }
            (_, Some(v)) => self.mark(v),
            (_, None) => self.mark_all(),
        }
    }

    /// The next pass settles every volume.
    pub(super) fn mark_all(&self) {
        self.dirty.lock().all = true;
    }

    /// The next pass settles every volume that is not [`steady`].
    pub(super) fn mark_tick(&self) {
        self.dirty.lock().tick = true;
    }

    /// The next pass settles `name`.
    pub(super) fn mark(&self, name: &str) {
        self.dirty.lock().names.insert(name.to_string());
    }

    /// Settles `name` soon: marks it and wakes the loop.
    pub(super) fn kick_volume(&self, name: &str) {
        self.mark(name);
        self.kick.notify_one();
    }

    /// Settles `name` after `d` (a claim delay or a back-off runs out).
    pub(super) fn kick_after(self: &Arc<Self>, name: &str, d: Duration) {
        let me = Arc::downgrade(self);
        let name = name.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            if let Some(a) = me.upgrade() {
                a.kick_volume(&name);
            }
        });
    }

    /// One pass over what is marked: starts a task per volume and returns
    /// without waiting for them. What it could not read stays marked.
    pub(super) async fn pass(self: &Arc<Self>, s: &Session) {
        let dirty = std::mem::take(&mut *self.dirty.lock());
        if dirty.is_empty() {
            return;
        }
        // decide::decide plans nothing either while the lease is not valid;
        // the next tick tries again
        if !s.is_valid() {
            self.dirty.lock().merge(dirty);
            return;
        }
        let r = self.start_pass(s, &dirty).await;
        self.etcd_answered(&r);
        if let Err(e) = r {
            tracing::warn!("cluster {}: {e}", self.m.name);
            self.dirty.lock().merge(dirty);
        }
    }

    async fn start_pass(self: &Arc<Self>, s: &Session, dirty: &Dirty) -> Result<(), ClusterError> {
        let nodes = s.nodes().await?;
        let members = Arc::new(Members {
            live: nodes.iter().map(|n| n.name.clone()).collect(),
            draining: s.draining().await?.into_iter().collect(),
        });
        self.update_peers(&nodes);
        self.seen_nodes(&nodes);
        // the limits (and the owners) come in the same range read as the specs
        let read_at = std::time::Instant::now();
        let view = s.pass_view().await?;
        self.qos_sync(view.qos, read_at);
        self.refresh_standby(s.node(), &members, &view.specs, &view.owners);
        let mut specs: HashMap<String, VolumeSpec> = view
            .specs
            .into_iter()
            .map(|v| (v.name.clone(), v))
            .collect();
        let mut reads = view.reads;
        let news = self
            .owner_news(
                s.node(),
                &members,
                dirty,
                (&specs, &view.owners, &view.handoffs),
            )
            .await;
        let mut names: BTreeSet<String> = if dirty.all || dirty.tick {
            // served here but without a spec: gone (the task checks)
            let mut all: BTreeSet<String> = specs.keys().cloned().collect();
            let acting: BTreeSet<String> = self.acting.lock().keys().cloned().collect();
            if dirty.all {
                all.extend(self.served.names().await);
                all.extend(acting);
            } else {
                let here = self.run_here().await;
                all.extend(here.keys().cloned());
                let me = s.node();
                // A volume whose task acts now is out of the served map, so
                // it would never look steady; that task settles it anyway.
                all.retain(|n| {
                    dirty.names.contains(n)
                        || (!acting.contains(n)
                            && !steady(
                                me,
                                &members,
                                view.owners.get(n),
                                view.handoffs.contains(n),
                                here.get(n),
                            ))
                });
            }
            all
        } else {
            dirty.names.clone()
        };
        names.extend(news);
        for name in names {
            let spec = specs.remove(&name);
            let read = reads.remove(&name).map(|r| PassRead {
                read: r,
                at: read_at,
            });
            self.start(s, &members, name, spec, read);
        }
        Ok(())
    }

    /// Of the volumes whose owner key was set (a claim: every node hears of
    /// each), the ones to settle. The others are noted as the pass's read
    /// shows them, without a settle's read of their keys:
    /// - one that this node runs as that read says ([`steady`]): a standby
    ///   of the new owner, or its own claim, already served;
    /// - one claimed by this node whose task still acts on it (its
    ///   takeover): that task's outcome is what etcd says, or, if it fails,
    ///   it releases the volume, which comes as another event.
    ///
    /// So a takeover of N volumes costs each node one read per volume it
    /// settles, not one more per claim it hears of.
    async fn owner_news(
        &self,
        me: &str,
        members: &Members,
        dirty: &Dirty,
        view: (
            &HashMap<String, VolumeSpec>,
            &BTreeMap<String, Owner>,
            &BTreeSet<String>,
        ),
    ) -> Vec<String> {
        let (specs, owners, handoffs) = view;
        let news: Vec<&String> = dirty
            .owners
            .iter()
            .filter(|n| !dirty.all && !dirty.names.contains(*n))
            .collect();
        if news.is_empty() {
            return Vec::new();
        }
        let here = self.run_here().await;
        let acting: BTreeSet<String> = self.acting.lock().keys().cloned().collect();
        let mut settle = Vec::new();
        for n in news {
            let o = owners.get(n);
            let group = specs.get(n).map(|sp| sp.ana_group);
            let noted = match (o, group) {
                (Some(o), Some(_)) if acting.contains(n) => o.node == me,
                (Some(_), Some(_)) => steady(me, members, o, handoffs.contains(n), here.get(n)),
                _ => false,
            };
            match group.filter(|_| noted) {
                Some(g) => {
                    self.seen_owner(n, g, o);
                    self.memory_of(n, |m| m.unowned_since = None);
                }
                None => settle.push(n.clone()),
            }
        }
        settle
    }

    /// A volume's members by the `peer:drive` names it was made with (as
    /// its creator shows them), or by URL where no `[[peer]]` names them;
    /// with the drives a replace is putting in (`replace.rs`).
    pub(super) fn member_names(&self, spec: &VolumeSpec) -> Vec<String> {
        let all: Vec<String> = spec.drives.iter().chain(&spec.joining).cloned().collect();
        self.names_of(&all)
    }

    /// Drive URLs by their `peer:drive` names, where a `[[peer]]` names them.
    pub(super) fn names_of(&self, urls: &[String]) -> Vec<String> {
        let c = self.node.cluster();
        urls.iter()
            .map(|u| c.name_of(u).unwrap_or_else(|| u.clone()))
            .collect()
    }

    /// Keeps standby links (`node/standby.rs`) to the members of every
    /// volume this node is [`decide::next_in_line`] for. In the
    /// background; one refresh at a time.
    fn refresh_standby(
        self: &Arc<Self>,
        me: &str,
        members: &Members,
        specs: &[VolumeSpec],
        owners: &BTreeMap<String, Owner>,
    ) {
        let wanted: BTreeSet<String> = specs
            .iter()
            .filter(|v| {
                !v.deleting
                    && owners
                        .get(&v.name)
                        .is_some_and(|o| decide::next_in_line(members, me, &v.name, &o.node))
            })
            // a pool's extents are taken over with it
            .flat_map(|v| {
                let extents = v.extents.iter().flat_map(|x| {
                    self.names_of(&x.drives)
                        .into_iter()
                        .chain(self.names_of(&x.joining))
                });
                self.member_names(v).into_iter().chain(extents)
            })
            .collect();
        let node = self.node.clone();
        tokio::spawn(async move { node.refresh_standby(wanted).await });
    }

    /// The volumes served here, as [`steady`] sees them.
    async fn run_here(&self) -> HashMap<String, RunHere> {
        let fenced = self.node.fenced_volumes().await;
        self.served
            .map
            .lock()
            .await
            .iter()
            .map(|(n, sv)| {
                let r = RunHere {
                    epoch: sv.epoch,
                    pool: sv.spec.thin_pool,
                    fenced: fenced.contains(n),
                };
                (n.clone(), r)
            })
            .collect()
    }

    /// Starts `name`'s task, or asks the one running to go again after
    /// (`read` is dropped then: that settle's next pass reads anew).
    fn start(
        self: &Arc<Self>,
        s: &Session,
        members: &Arc<Members>,
        name: String,
        spec: Option<VolumeSpec>,
        read: Option<PassRead>,
    ) {
        {
            let mut acting = self.acting.lock();
            if let Some(again) = acting.get_mut(&name) {
                *again = true;
                return;
            }
            acting.insert(name.clone(), false);
        }
        self.queued
            .lock()
            .entry(name.clone())
            .or_insert_with(std::time::Instant::now);
        let (a, s, members) = (self.clone(), s.clone(), members.clone());
        let permits: Arc<Semaphore> = self.permits.lock().clone();
        // Queued or running, it is foreground work: the node's resyncs and
        // rebuilds wait for it (`node/foreground.rs`).
        let foreground = self.node.foreground.enter();
        tokio::spawn(async move {
            let _foreground = foreground;
            if let Ok(_permit) = permits.acquire_owned().await {
                let _acting = a.served.acting().await;
                // a task queued before the lease was lost acts on nothing
                if s.is_valid() {
                    a.settle_one(&s, &members, &name, spec.as_ref(), read).await;
                }
            }
            a.queued.lock().remove(&name);
            if a.acting.lock().remove(&name) == Some(true) {
                a.kick_volume(&name);
            }
        });
    }

    /// One volume's pass: its slot out of the map, settled, put back.
    async fn settle_one(
        self: &Arc<Self>,
        s: &Session,
        members: &Members,
        name: &str,
        spec: Option<&VolumeSpec>,
        read: Option<PassRead>,
    ) {
        #[cfg(test)]
        self.settles
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut slot = self.served.take(name).await;
        // Served here but not in the pass's list: a volume created here
        // after the list was read, or really gone. Ask etcd again before
        // letting it go.
        let fresh;
        let spec = match (spec, &slot) {
            (None, Some(_)) => match s.spec(name).await {
                Ok(found) => {
                    fresh = found;
                    fresh.as_ref()
                }
                Err(e) => {
                    tracing::warn!("cluster {}: volume {name}: {e}", self.m.name);
                    self.served.put(name, slot.take().expect("checked")).await;
                    return;
                }
            },
            (spec, _) => spec,
        };
        let r = match (spec, &slot) {
            (Some(spec), _) => self.settle(s, members, spec, &mut slot, read).await,
            (None, Some(sv)) => {
                let here = self.local_volume(name, Some(sv), None);
                match decide::decide_gone(name, &here) {
                    Some(plan) => {
                        let spec = sv.spec.clone();
                        self.act(s, &spec, &mut slot, plan, None).await
                    }
                    None => Ok(()),
                }
            }
            (None, None) => Ok(()),
        };
        if let Some(sv) = slot {
            self.served.put(name, sv).await;
        }
        if let Err(e) = r {
            // this volume only: the next event or resync tries again
            tracing::warn!("cluster {}: volume {name}: {e}", self.m.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_volume_events_names_those_volumes_and_member_events_all() {
        let owner = Owner {
            node: "a".into(),
            epoch: 2,
        };
        let mut d = Dirty::default();
        for e in [
            ClusterEvent::OwnerGone("v1".into()),
            ClusterEvent::OwnerSet("v1".into(), owner),
            ClusterEvent::HandoffCleared("v2".into()),
            ClusterEvent::SpecDeleted("v3".into()),
        ] {
            d.names.insert(volume_of(&e).unwrap().to_string());
        }
        assert_eq!(d.names.iter().collect::<Vec<_>>(), ["v1", "v2", "v3"]);
        assert!(!d.all && !d.is_empty());
        for e in [
            ClusterEvent::NodeDown("b".into()),
            ClusterEvent::Drain("a".into(), true),
            ClusterEvent::Resync,
        ] {
            assert_eq!(volume_of(&e), None, "{e:?}");
        }
        let mut all = Dirty::default();
        assert!(all.is_empty());
        all.merge(Dirty {
            all: true,
            ..Dirty::default()
        });
        all.merge(d);
        assert!(all.all && all.names.len() == 3);
    }

    /// A tick skips only what the pass's read shows as run here the way
    /// etcd says; every doubt settles.
    #[test]
    fn a_tick_skips_only_steady_volumes() {
        let members = Members {
            live: vec!["a".into(), "b".into()],
            draining: Default::default(),
        };
        let own = |node: &str, epoch| Owner {
            node: node.into(),
            epoch,
        };
        let owner_at = |epoch| RunHere {
            epoch: Some(epoch),
            ..RunHere::default()
        };
        let standby = RunHere::default();
        // Steady: owner here at the same epoch; standby of a live owner.
        assert!(steady(
            "a",
            &members,
            Some(&own("a", 3)),
            false,
            Some(&owner_at(3))
        ));
        assert!(steady(
            "a",
            &members,
            Some(&own("b", 3)),
            false,
            Some(&standby)
        ));
        // Settled: unowned, another epoch, owned elsewhere while running it,
        // owned here but run as a standby, a handoff, a dead owner, not
        // served here, a pool, a fenced volume, this node draining.
        assert!(!steady("a", &members, None, false, Some(&standby)));
        assert!(!steady(
            "a",
            &members,
            Some(&own("a", 4)),
            false,
            Some(&owner_at(3))
        ));
        assert!(!steady(
            "a",
            &members,
            Some(&own("b", 4)),
            false,
            Some(&owner_at(3))
        ));
        assert!(!steady(
            "a",
            &members,
            Some(&own("a", 3)),
            false,
            Some(&standby)
        ));
        assert!(!steady(
            "a",
            &members,
            Some(&own("a", 3)),
            true,
            Some(&owner_at(3))
        ));
        assert!(!steady(
            "a",
            &members,
            Some(&own("c", 3)),
            false,
            Some(&standby)
        ));
        assert!(!steady("a", &members, Some(&own("b", 3)), false, None));
        let pool = RunHere {
            pool: true,
            ..standby
        };
        assert!(!steady(
            "a",
            &members,
            Some(&own("b", 3)),
            false,
            Some(&pool)
        ));
        let fenced = RunHere {
            fenced: true,
            ..owner_at(3)
        };
        assert!(!steady(
            "a",
            &members,
            Some(&own("a", 3)),
            false,
            Some(&fenced)
        ));
        let draining = Members {
            draining: ["a".to_string()].into_iter().collect(),
            ..members
        };
        assert!(!steady(
            "a",
            &draining,
            Some(&own("a", 3)),
            false,
            Some(&owner_at(3))
        ));
    }

    #[test]
    fn concurrency_is_a_few_more_than_the_cores() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(concurrency() >= 32 && concurrency() >= 8 * cores);
    }
}
