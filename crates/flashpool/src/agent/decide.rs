//! What the agent decides, apart from doing it: a pure function from what
//! etcd shows and what this node shows to the actions each cluster volume
//! needs. No I/O, no locks, no clock: the time comes in as an argument, and
//! the little the agent remembers between passes ([`Memory`]: since when a
//! volume is unowned, which handoff it saw and when, its back-off after a
//! failed takeover) comes in and goes out as values. `own.rs` gathers the
//! views and carries the actions out; the table in `decide_tests.rs` says,
//! row by row, what the node does for each state of etcd.
//!
//! # One volume at a time, and why
//!
//! Every decision is per volume: [`decide_volume`] sees the cluster's
//! members ([`Members`]: live nodes, draining nodes), that one volume's keys
//! ([`VolumeView`]) and this node's side of that one volume
//! ([`LocalVolume`]), and returns that volume's [`Plan`]. No decision reads
//! another volume's state or depends on the order in which volumes are
//! visited; [`decide`] only maps it over a whole snapshot (and is what the
//! table tests). So the plans of different volumes may be carried out in any
//! order, or at once.
//!
//! The agent (`runner.rs`) carries them out concurrently: each volume in
//! its own task, a bounded number at a time, at most one task per volume,
//! each on its volume's keys as read just before it (by its pass, or by
//! itself where the pass's read may be older than its own last change):
//! its owner, and its handoff where [`handoff_matters`]. A pass names only the volumes
//! the etcd events since the last pass were about (all of them on the
//! periodic resync, or when the members change), so its etcd reads follow
//! what changed.
//!
//! What this relies on:
//! - one volume's plan is executed by one function (`Agent::act`), which
//!   needs that volume's slot and nothing else;
//! - back-off is per volume ([`Memory::cooldown_until`]), and a volume that
//!   waits for its turn says until when ([`Wait::Turn`]), so the runner
//!   wakes just that volume;
//! - [`VolumeView`] is plain data: a snapshot could as well come from one
//!   etcd range read, and a handoff the volume's decision never reads may
//!   be left out ([`handoff_matters`]).
//!
//! What still serializes takeovers elsewhere: the node-wide state lock that
//! `Node::assemble_volume` holds while it opens the members one at a time.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use cluster::{Handoff, Owner, rendezvous};

/// How long a node waits per rank before claiming an unowned volume, so
/// that the rendezvous winner normally takes it and a dead winner does not
/// leave it unowned.
pub const RANK_DELAY: Duration = Duration::from_millis(300);
/// A handoff not acted on for this long is ignored.
pub const HANDOFF_STALE: Duration = Duration::from_secs(5);
/// A node that failed to take a volume over leaves it to others this long.
pub const COOLDOWN: Duration = Duration::from_secs(5);

/// The cluster's members as etcd shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members {
    /// Live nodes: those whose record is under a live lease.
    pub live: Vec<String>,
    /// Nodes marked draining (they give their volumes away, claim none).
    pub draining: HashSet<String>,
}

impl Members {
    /// Live nodes that may own volumes (not draining), in etcd's order.
    pub fn eligible(&self) -> impl Iterator<Item = &str> {
        self.live
            .iter()
            .map(String::as_str)
            .filter(|n| !self.draining.contains(*n))
    }
}

/// One volume's keys in etcd.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeView {
    pub name: String,
    /// `volumes/<v>/owner`: none when its owner's lease ended or it was released.
    pub owner: Option<Owner>,
    /// `volumes/<v>/handoff`. It may be left unread (`None`) where
    /// [`handoff_matters`] says no decision reads it.
    pub handoff: Option<Handoff>,
    /// Its spec is marked deleting: a delete wipes (or wiped) its drives.
    pub deleting: bool,
}

/// What etcd shows: members and every volume that has a spec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub members: Members,
    pub volumes: Vec<VolumeView>,
}

/// This node's lease, as its session sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lease {
    /// Trusted: this node may claim and own volumes.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "the actor decides per volume while valid")
    )]
    Valid,
    /// Past its deadline but not yet declared lost (a keep-alive is late):
    /// the switches refuse I/O already; nothing is decided until it is
    /// refreshed or lost.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "the actor skips the pass before deciding")
    )]
    NotValid,
    /// Gone for good (expired, revoked, or its watch ended): every volume
    /// owned here steps down; the node joins again.
    Lost(String),
}

/// What this node remembers of one volume between passes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// When this node first saw the volume unowned (claim delays count from it).
    pub unowned_since: Option<Instant>,
    /// The volume's handoff as first seen, and when (a stale one is ignored).
    /// Kept with the handoff itself: one left from an earlier move must not
    /// make a new handoff look stale.
    pub handoff_seen: Option<(Handoff, Instant)>,
    /// A failed takeover here: leave the volume to others until then.
    pub cooldown_until: Option<Instant>,
}

/// This node's side of one volume.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalVolume {
    /// Its namespace is served here (standby or owner).
    pub served: bool,
    /// The epoch this node runs it at; `None` on standby.
    pub epoch: Option<u64>,
    /// Why the volume run here fenced itself (a member answered Reservation
    /// Conflict, ...), if it did. Read only for a volume run here.
    pub fenced: Option<String>,
    pub memory: Memory,
}

/// What this node shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalView {
    /// This node's name in the cluster.
    pub me: String,
    pub lease: Lease,
    /// Every volume this node serves or remembers something of.
    pub volumes: BTreeMap<String, LocalVolume>,
}

/// One thing to do for a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Serve its namespace on standby here (subsystem, Inaccessible ANA
    /// group, a switch with nothing behind it). If that fails, the volume's
    /// later steps are skipped this pass.
    ServeStandby,
    /// Stop serving its namespace (its spec is gone).
    Unserve,
    /// Try to become its owner (an etcd transaction; of concurrent claimers
    /// exactly one wins). The winner takes it over: preempt, assemble,
    /// Optimized; a failed takeover releases it and backs off
    /// ([`COOLDOWN`]). A loser does nothing: the next pass sees the owner.
    Claim { rank: u32 },
    /// Let go without writing: Inaccessible, switch off, volume dropped.
    StepDown { why: String },
    /// The volume fenced itself here: step down, then release the ownership
    /// key of `epoch` so that a node that can run it takes it.
    Fence { why: String, epoch: u64 },
    /// The ownership key names this node at `epoch`, but the volume does not
    /// run here (a claim whose takeover did not finish): release it.
    Release { epoch: u64 },
    /// A planned move asked of this owner: ANA Change, drain the commands in
    /// flight, close clean, release; `to` claims at once.
    HandOff { to: String, epoch: u64 },
    /// This owner drains: write the handoff marker naming `to` (the
    /// plan's next step hands off).
    AskHandOff { to: String, epoch: u64 },
    /// Nothing now, for a reason that will pass.
    Wait(Wait),
    /// Nothing: the volume is where it should be.
    Keep(Keep),
}

/// Why a volume waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A takeover failed here; others get it first.
    Cooldown { until: Instant },
    /// A planned move names another live node, and it is not stale yet.
    HandoffToOther { to: String },
    /// Unowned, and this node's rendezvous rank lets a better-placed node
    /// claim first: claim at `due` unless someone did.
    Turn { rank: u32, due: Instant },
}

/// Why nothing is to be done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Owned and run here; nothing asks it to move.
    Owner,
    /// Another node owns it; served here on standby.
    Standby { owner: String },
    /// Unowned, but this node may not own volumes (draining, or not among
    /// the live nodes).
    NotEligible,
    /// This owner drains, but no other node may take the volume.
    NowhereToDrain,
    /// Its delete has begun: nobody serves it; a delete finishes it.
    Deleting,
}

/// One volume's steps, in order, and what to remember of it afterwards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub volume: String,
    pub steps: Vec<Action>,
    /// The volume's memory after this decision; stored before the first
    /// step that is not [`Action::ServeStandby`] runs (a failed
    /// `ServeStandby` leaves the memory as it was).
    pub memory: Memory,
}

/// Why a served volume whose spec is gone steps down.
pub const WHY_DELETED: &str = "its cluster record was deleted";
/// Why a volume run here steps down when its spec is marked deleting.
pub const WHY_DELETING: &str = "it is being deleted";
/// Why a volume run here steps down when its owner key is gone.
pub const WHY_KEY_GONE: &str = "its ownership key is gone (lease expired or revoked)";

/// Every volume's plan, for a whole snapshot. Plans are independent (see
/// the module doc); their order is served-but-deleted volumes first, then
/// etcd's, and carries no meaning.
pub fn decide(view: &ClusterView, local: &LocalView, now: Instant) -> Vec<Plan> {
    match &local.lease {
        Lease::Valid => {}
        Lease::NotValid => return Vec::new(),
        Lease::Lost(why) => return on_lease_lost(local, why),
    }
    let names: HashSet<&str> = view.volumes.iter().map(|v| v.name.as_str()).collect();
    let gone = local
        .volumes
        .iter()
        .filter(|(n, _)| !names.contains(n.as_str()))
        .filter_map(|(n, lv)| decide_gone(n, lv));
    let live = view.volumes.iter().map(|v| {
        let lv = local.volumes.get(&v.name).cloned().unwrap_or_default();
        decide_volume(&view.members, &local.me, v, &lv, now)
    });
    gone.chain(live).collect()
}

/// The lease is lost: every volume run here steps down; nothing else.
fn on_lease_lost(local: &LocalView, why: &str) -> Vec<Plan> {
    local
        .volumes
        .iter()
        .filter(|(_, lv)| lv.epoch.is_some())
        .map(|(n, lv)| Plan {
            volume: n.clone(),
            steps: vec![Action::StepDown {
                why: why.to_string(),
            }],
            memory: lv.memory.clone(),
        })
        .collect()
}

/// A volume served here whose spec is gone: step down if run here, stop
/// serving it. `None` for one not served here.
pub fn decide_gone(name: &str, lv: &LocalVolume) -> Option<Plan> {
    if !lv.served {
        return None;
    }
    let mut steps = Vec::new();
    if lv.epoch.is_some() {
        steps.push(Action::StepDown {
            why: WHY_DELETED.to_string(),
        });
    }
    steps.push(Action::Unserve);
    Some(Plan {
        volume: name.to_string(),
        steps,
        memory: lv.memory.clone(),
    })
}

/// A volume whose delete has begun: whoever its owner, its drives are
/// (being) wiped, so nothing here may run or serve it, and no node claims it.
fn deleting(name: &str, lv: &LocalVolume) -> Plan {
    let mut steps = Vec::new();
    if lv.epoch.is_some() {
        steps.push(Action::StepDown {
            why: WHY_DELETING.to_string(),
        });
    }
    steps.push(match lv.served {
        true => Action::Unserve,
        false => Action::Keep(Keep::Deleting),
    });
    Plan {
        volume: name.to_string(),
        steps,
        memory: lv.memory.clone(),
    }
}

/// Whether `me` is next in line for `volume`, owned by `owner`: the node
/// that claims it at once if the owner dies ([`claim_turn`]'s rank 0
/// once the owner is gone) or drains (the draining owner's
/// [`Action::AskHandOff`]). That node keeps standby links to the volume's
/// members (`node/standby.rs`), so the takeover connects nothing.
pub fn next_in_line(members: &Members, me: &str, volume: &str, owner: &str) -> bool {
    me != owner
        && rendezvous(volume, members.eligible().filter(|n| *n != owner)).first() == Some(&me)
}

/// Whether one volume's decision reads its handoff marker: only for an
/// owner key naming this node or no owner at all. A gatherer may skip the
/// read otherwise.
pub fn handoff_matters(owner: Option<&Owner>, me: &str) -> bool {
    owner.is_none_or(|o| o.node == me)
}

/// One volume's plan: brings its ownership where etcd says it should be.
pub fn decide_volume(
    members: &Members,
    me: &str,
    v: &VolumeView,
    lv: &LocalVolume,
    now: Instant,
) -> Plan {
    if v.deleting {
        return deleting(&v.name, lv);
    }
    let mut memory = lv.memory.clone();
    let mut steps = Vec::new();
    if !lv.served {
        steps.push(Action::ServeStandby);
    }
    let step = settle(members, me, v, lv, &mut memory, now);
    // A draining owner hands off in the same plan: the marker first (the
    // node it names learns that it is the one to claim), then the handoff
    // itself, without waiting for a later pass to read its own marker back.
    let then = match &step {
        Action::AskHandOff { to, epoch } => Some(Action::HandOff {
            to: to.clone(),
            epoch: *epoch,
        }),
        _ => None,
    };
    steps.push(step);
    steps.extend(then);
    Plan {
        volume: v.name.clone(),
        steps,
        memory,
    }
}

fn settle(
    members: &Members,
    me: &str,
    v: &VolumeView,
    lv: &LocalVolume,
    memory: &mut Memory,
    now: Instant,
) -> Action {
    match (&v.owner, lv.epoch) {
        (Some(o), Some(e)) if o.node == me && o.epoch == e => {
            if let Some(why) = &lv.fenced {
                return Action::Fence {
                    why: why.clone(),
                    epoch: e,
                };
            }
            if let Some(h) = &v.handoff
                && h.epoch == e
                && h.to != me
            {
                return Action::HandOff {
                    to: h.to.clone(),
                    epoch: e,
                };
            }
            if !members.draining.contains(me) {
                return Action::Keep(Keep::Owner);
            }
            let others = members.eligible().filter(|n| *n != me);
            match rendezvous(&v.name, others).first() {
                Some(to) => Action::AskHandOff {
                    to: to.to_string(),
                    epoch: e,
                },
                None => Action::Keep(Keep::NowhereToDrain),
            }
        }
        (Some(o), Some(_)) => Action::StepDown {
            why: format!("deposed: {} owns it now at epoch {}", o.node, o.epoch),
        },
        (Some(o), None) if o.node == me => Action::Release { epoch: o.epoch },
        (Some(o), None) => {
            memory.unowned_since = None;
            Action::Keep(Keep::Standby {
                owner: o.node.clone(),
            })
        }
        (None, Some(_)) => Action::StepDown {
            why: WHY_KEY_GONE.to_string(),
        },
        (None, None) => claim_turn(members, me, v, memory, now),
    }
}

/// An unowned volume: claim it when it is this node's turn: at once for
/// the handoff's target or the rendezvous winner among live, undrained
/// nodes, later for the next in that order.
fn claim_turn(
    members: &Members,
    me: &str,
    v: &VolumeView,
    memory: &mut Memory,
    now: Instant,
) -> Action {
    if let Some(until) = memory.cooldown_until
        && until > now
    {
        return Action::Wait(Wait::Cooldown { until });
    }
    let rank = match &v.handoff {
        Some(h) if h.to == me => 0,
        Some(h) if members.live.contains(&h.to) && !handoff_stale(memory, h, now) => {
            return Action::Wait(Wait::HandoffToOther { to: h.to.clone() });
        }
        _ => match rendezvous(&v.name, members.eligible())
            .iter()
            .position(|n| *n == me)
        {
            Some(r) => r as u32,
            None => return Action::Keep(Keep::NotEligible),
        },
    };
    let since = *memory.unowned_since.get_or_insert(now);
    let due = since + RANK_DELAY * rank;
    if now < due {
        return Action::Wait(Wait::Turn { rank, due });
    }
    Action::Claim { rank }
}

/// Whether `h` has waited longer than [`HANDOFF_STALE`] since this node
/// first saw it (remembering it now if it is new).
fn handoff_stale(memory: &mut Memory, h: &Handoff, now: Instant) -> bool {
    let seen = match &memory.handoff_seen {
        Some((seen, at)) if seen == h => *at,
        _ => {
            memory.handoff_seen = Some((h.clone(), now));
            now
        }
    };
    now.duration_since(seen) > HANDOFF_STALE
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
