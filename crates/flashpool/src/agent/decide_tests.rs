//! The table: what etcd shows and what the node shows -> what the node does.
//! One row per case of the failover suite (tests/failover) and of the
//! etcd-backed agent test, and the corners between them. The node deciding
//! is always `c1`; the cluster is `c1`, `c2`, `c3` as in the suite.
//!
//! Not here: whether a volume's members are reachable from this node. No
//! decision reads that today (a takeover that cannot reach a member fails,
//! releases and backs off: the cooldown rows); degraded takeover will add it.

use std::time::{Duration, Instant};

use cluster::{Handoff, Owner, rendezvous};

use super::*;

const ME: &str = "c1";
const ALL: &[&str] = &["c1", "c2", "c3"];

fn ms(t0: Instant, n: u64) -> Instant {
    t0 + Duration::from_millis(n)
}

fn owner(node: &str, epoch: u64) -> Owner {
    Owner {
        node: node.into(),
        epoch,
    }
}

fn handoff(to: &str, epoch: u64) -> Handoff {
    Handoff {
        to: to.into(),
        epoch,
    }
}

/// Not served here yet (a spec this node has not seen).
fn unseen() -> LocalVolume {
    LocalVolume::default()
}

/// Served here on standby.
fn standby() -> LocalVolume {
    LocalVolume {
        served: true,
        ..LocalVolume::default()
    }
}

/// Run here at `epoch`.
fn running(epoch: u64) -> LocalVolume {
    LocalVolume {
        served: true,
        epoch: Some(epoch),
        ..LocalVolume::default()
    }
}

fn members(live: &[&str], draining: &[&str]) -> Members {
    Members {
        live: live.iter().map(|s| s.to_string()).collect(),
        draining: draining.iter().map(|s| s.to_string()).collect(),
    }
}

struct Row {
    case: &'static str,
    live: &'static [&'static str],
    draining: &'static [&'static str],
    volume: &'static str,
    owner: Option<Owner>,
    handoff: Option<Handoff>,
    deleting: bool,
    here: LocalVolume,
    now: Instant,
    want: Vec<Action>,
}

fn step_down(why: &str) -> Action {
    Action::StepDown { why: why.into() }
}

/// The rendezvous orders the rows rely on (`c1` first, second, third).
#[test]
fn the_table_assumes_these_rendezvous_orders() {
    assert_eq!(rendezvous("vol", ALL.iter().copied()), ["c1", "c2", "c3"]);
    assert_eq!(rendezvous("v", ALL.iter().copied()), ["c2", "c1", "c3"]);
    assert_eq!(rendezvous("x", ALL.iter().copied()), ["c3", "c2", "c1"]);
}

fn rows(t0: Instant) -> Vec<Row> {
    let t = |n| ms(t0, n);
    let row = |case, volume, owner, here, want| Row {
        case,
        live: ALL,
        draining: &[],
        volume,
        owner,
        handoff: None,
        deleting: false,
        here,
        now: t0,
        want,
    };
    let since = |here: LocalVolume, at: Instant| LocalVolume {
        memory: Memory {
            unowned_since: Some(at),
            ..here.memory.clone()
        },
        ..here
    };
    let seen = |here: LocalVolume, h: Handoff, at: Instant| LocalVolume {
        memory: Memory {
            handoff_seen: Some((h, at)),
            ..here.memory.clone()
        },
        ..here
    };
    let cooling = |until: Instant| LocalVolume {
        memory: Memory {
            cooldown_until: Some(until),
            ..Memory::default()
        },
        ..standby()
    };
    vec![
        // ---- owner alive
        row(
            "fo-up: a new spec owned elsewhere: serve it on standby",
            "vol",
            Some(owner("c2", 1)),
            unseen(),
            vec![
                Action::ServeStandby,
                Action::Keep(Keep::Standby { owner: "c2".into() }),
            ],
        ),
        row(
            "owner alive elsewhere: stay on standby",
            "vol",
            Some(owner("c2", 1)),
            standby(),
            vec![Action::Keep(Keep::Standby { owner: "c2".into() })],
        ),
        row(
            "this node owns it, lease valid (etcd-leader-loss: nothing moves)",
            "vol",
            Some(owner(ME, 1)),
            running(1),
            vec![Action::Keep(Keep::Owner)],
        ),
        // ---- owner gone (kill9-owner, sigstop-owner, cut-owner on a survivor)
        row(
            "owner gone, this node first in rendezvous: claim at once",
            "vol",
            None,
            standby(),
            vec![Action::Claim { rank: 0 }],
        ),
        row(
            "owner gone, a new spec: serve on standby, then claim",
            "vol",
            None,
            unseen(),
            vec![Action::ServeStandby, Action::Claim { rank: 0 }],
        ),
        row(
            "owner gone, this node second: wait one rank delay",
            "v",
            None,
            standby(),
            vec![Action::Wait(Wait::Turn {
                rank: 1,
                due: t(300),
            })],
        ),
        Row {
            now: t(300),
            ..row(
                "owner gone, this node second, unowned for one rank delay: claim",
                "v",
                None,
                since(standby(), t0),
                vec![Action::Claim { rank: 1 }],
            )
        },
        Row {
            now: t(300),
            ..row(
                "owner gone, this node third, unowned for one rank delay: wait for two",
                "x",
                None,
                since(standby(), t0),
                vec![Action::Wait(Wait::Turn {
                    rank: 2,
                    due: t(600),
                })],
            )
        },
        Row {
            live: &["c1", "c3"],
            ..row(
                "owner's node record gone (lease expired, revoked): ranked without it",
                "v",
                None,
                standby(),
                vec![Action::Claim { rank: 0 }],
            )
        },
        // ---- this node's ownership ends
        row(
            "this node runs it but its owner key is gone (its lease expired or was revoked)",
            "vol",
            None,
            running(1),
            vec![step_down(WHY_KEY_GONE)],
        ),
        row(
            "fenced by a newer epoch: another node owns it now",
            "vol",
            Some(owner("c2", 4)),
            running(3),
            vec![step_down("deposed: c2 owns it now at epoch 4")],
        ),
        row(
            "the owner key names this node at another epoch: deposed all the same",
            "vol",
            Some(owner(ME, 5)),
            running(3),
            vec![step_down("deposed: c1 owns it now at epoch 5")],
        ),
        row(
            "the volume fenced itself here (Reservation Conflict): step down, release",
            "vol",
            Some(owner(ME, 3)),
            LocalVolume {
                fenced: Some("reservation conflict on e1:d0".into()),
                ..running(3)
            },
            vec![Action::Fence {
                why: "reservation conflict on e1:d0".into(),
                epoch: 3,
            }],
        ),
        // ---- planned move (planned-move, rejoin-rebuild's move back)
        Row {
            handoff: Some(handoff("c2", 3)),
            ..row(
                "handoff of this owner's epoch to another node: hand it off",
                "vol",
                Some(owner(ME, 3)),
                running(3),
                vec![Action::HandOff {
                    to: "c2".into(),
                    epoch: 3,
                }],
            )
        },
        Row {
            handoff: Some(handoff("c2", 2)),
            ..row(
                "a handoff left from an earlier epoch: keep owning",
                "vol",
                Some(owner(ME, 3)),
                running(3),
                vec![Action::Keep(Keep::Owner)],
            )
        },
        Row {
            handoff: Some(handoff("c2", 3)),
            ..row(
                "handoff written, the old owner still holds it: wait on standby",
                "vol",
                Some(owner("c3", 3)),
                standby(),
                vec![Action::Keep(Keep::Standby { owner: "c3".into() })],
            )
        },
        Row {
            handoff: Some(handoff(ME, 3)),
            ..row(
                "handoff to this node, released: claim at once whatever the rank",
                "x",
                None,
                standby(),
                vec![Action::Claim { rank: 0 }],
            )
        },
        Row {
            handoff: Some(handoff("c2", 3)),
            ..row(
                "handoff to another live node: leave it to that node",
                "vol",
                None,
                standby(),
                vec![Action::Wait(Wait::HandoffToOther { to: "c2".into() })],
            )
        },
        Row {
            handoff: Some(handoff("c2", 3)),
            now: t(4_000),
            ..row(
                "handoff to another node, seen 4 s ago: still its turn",
                "vol",
                None,
                seen(standby(), handoff("c2", 3), t0),
                vec![Action::Wait(Wait::HandoffToOther { to: "c2".into() })],
            )
        },
        Row {
            handoff: Some(handoff("c2", 3)),
            now: t(5_001),
            ..row(
                "stale handoff (not acted on for 5 s): rendezvous order again",
                "vol",
                None,
                seen(standby(), handoff("c2", 3), t0),
                vec![Action::Claim { rank: 0 }],
            )
        },
        Row {
            handoff: Some(handoff("c3", 4)),
            now: t(20_000),
            ..row(
                "a new handoff is not stale because an old one was seen long ago",
                "vol",
                None,
                seen(standby(), handoff("c2", 3), t0),
                vec![Action::Wait(Wait::HandoffToOther { to: "c3".into() })],
            )
        },
        Row {
            live: &["c1", "c3"],
            handoff: Some(handoff("c2", 3)),
            ..row(
                "handoff to a node that died: rendezvous order among the live",
                "v",
                None,
                standby(),
                vec![Action::Claim { rank: 0 }],
            )
        },
        // ---- drain
        Row {
            draining: &["c1"],
            ..row(
                "drain of this node, which owns it: name the next node, then hand it over",
                "vol",
                Some(owner(ME, 3)),
                running(3),
                vec![
                    Action::AskHandOff {
                        to: "c2".into(),
                        epoch: 3,
                    },
                    Action::HandOff {
                        to: "c2".into(),
                        epoch: 3,
                    },
                ],
            )
        },
        Row {
            draining: &["c1", "c2"],
            ..row(
                "drain of this node, the next one drains too: the one after it",
                "vol",
                Some(owner(ME, 3)),
                running(3),
                vec![
                    Action::AskHandOff {
                        to: "c3".into(),
                        epoch: 3,
                    },
                    Action::HandOff {
                        to: "c3".into(),
                        epoch: 3,
                    },
                ],
            )
        },
        Row {
            live: &["c1"],
            draining: &["c1"],
            ..row(
                "drain of the only node: nowhere to go",
                "vol",
                Some(owner(ME, 3)),
                running(3),
                vec![Action::Keep(Keep::NowhereToDrain)],
            )
        },
        Row {
            draining: &["c1"],
            handoff: Some(handoff("c3", 3)),
            ..row(
                "drain of this node with a handoff already written: hand off as asked",
                "vol",
                Some(owner(ME, 3)),
                running(3),
                vec![Action::HandOff {
                    to: "c3".into(),
                    epoch: 3,
                }],
            )
        },
        Row {
            draining: &["c1"],
            ..row(
                "drain of this node, an unowned volume: never claim it",
                "vol",
                None,
                standby(),
                vec![Action::Keep(Keep::NotEligible)],
            )
        },
        Row {
            draining: &["c2"],
            ..row(
                "drain of another node: ranked without it",
                "v",
                None,
                standby(),
                vec![Action::Claim { rank: 0 }],
            )
        },
        Row {
            draining: &["c2"],
            ..row(
                "drain of another node that owns it: it moves through its handoff",
                "v",
                Some(owner("c2", 3)),
                standby(),
                vec![Action::Keep(Keep::Standby { owner: "c2".into() })],
            )
        },
        // ---- claim-race, rejoin
        Row {
            now: t(1_000),
            ..row(
                "claim-race: both woke past their turns and claim; etcd picks one",
                "v",
                None,
                since(standby(), t0),
                vec![Action::Claim { rank: 1 }],
            )
        },
        row(
            "claim-race: someone else won: standby",
            "v",
            Some(owner("c2", 5)),
            since(standby(), t0),
            vec![Action::Keep(Keep::Standby { owner: "c2".into() })],
        ),
        row(
            "rejoin after being deposed: standby under the new owner",
            "vol",
            Some(owner("c2", 4)),
            standby(),
            vec![Action::Keep(Keep::Standby { owner: "c2".into() })],
        ),
        row(
            "owner key names this node, volume not running here (a takeover that did not finish): release",
            "vol",
            Some(owner(ME, 4)),
            standby(),
            vec![Action::Release { epoch: 4 }],
        ),
        // ---- not eligible, back-off
        Row {
            live: &["c2", "c3"],
            ..row(
                "this node not among the live nodes: never claims",
                "vol",
                None,
                standby(),
                vec![Action::Keep(Keep::NotEligible)],
            )
        },
        row(
            "a takeover failed here 1 s ago: back off",
            "vol",
            None,
            cooling(t(4_000)),
            vec![Action::Wait(Wait::Cooldown { until: t(4_000) })],
        ),
        Row {
            now: t(4_000),
            ..row(
                "the back-off is over: claim again",
                "vol",
                None,
                cooling(t(4_000)),
                vec![Action::Claim { rank: 0 }],
            )
        },
        Row {
            handoff: Some(handoff(ME, 3)),
            ..row(
                "back-off wins over a handoff to this node",
                "vol",
                None,
                cooling(t(4_000)),
                vec![Action::Wait(Wait::Cooldown { until: t(4_000) })],
            )
        },
        // ---- a delete began (the spec is marked deleting): nobody runs,
        // serves or claims it, whatever else etcd says
        Row {
            deleting: true,
            ..row(
                "being deleted, run here (its delete failed in etcd): step down, stop serving",
                "vol",
                Some(owner(ME, 3)),
                running(3),
                vec![step_down(WHY_DELETING), Action::Unserve],
            )
        },
        Row {
            deleting: true,
            ..row(
                "being deleted, on standby here: stop serving",
                "vol",
                Some(owner("c2", 3)),
                standby(),
                vec![Action::Unserve],
            )
        },
        Row {
            deleting: true,
            ..row(
                "being deleted, its owner gone, this node first in line: no claim",
                "vol",
                None,
                unseen(),
                vec![Action::Keep(Keep::Deleting)],
            )
        },
        Row {
            deleting: true,
            handoff: Some(handoff(ME, 3)),
            ..row(
                "being deleted, owned here but not run (no release) and handed to this node",
                "vol",
                Some(owner(ME, 3)),
                unseen(),
                vec![Action::Keep(Keep::Deleting)],
            )
        },
    ]
}

#[test]
fn what_etcd_shows_to_what_the_node_does() {
    let t0 = Instant::now();
    let mut failed = Vec::new();
    for r in rows(t0) {
        let v = VolumeView {
            name: r.volume.into(),
            owner: r.owner,
            handoff: r.handoff,
            deleting: r.deleting,
        };
        let got = decide_volume(&members(r.live, r.draining), ME, &v, &r.here, r.now);
        assert_eq!(got.volume, r.volume);
        if got.steps != r.want {
            failed.push(format!(
                "{}:\n  want {:?}\n  got  {:?}",
                r.case, r.want, got.steps
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

fn local(lease: Lease, vols: &[(&str, LocalVolume)]) -> LocalView {
    LocalView {
        me: ME.into(),
        lease,
        volumes: vols
            .iter()
            .map(|(n, lv)| (n.to_string(), lv.clone()))
            .collect(),
    }
}

fn view(vols: &[(&str, Option<Owner>)]) -> ClusterView {
    ClusterView {
        members: members(ALL, &[]),
        volumes: vols
            .iter()
            .map(|(n, o)| VolumeView {
                name: n.to_string(),
                owner: o.clone(),
                handoff: None,
                deleting: false,
            })
            .collect(),
    }
}

#[test]
fn a_volume_deleted_while_served_steps_down_if_owned_and_is_unserved() {
    let l = local(
        Lease::Valid,
        &[
            ("owned", running(2)),
            ("spare", standby()),
            // remembered, never served: nothing to undo
            ("old", unseen()),
        ],
    );
    let plans = decide(&view(&[]), &l, Instant::now());
    let got: Vec<(&str, &[Action])> = plans
        .iter()
        .map(|p| (p.volume.as_str(), p.steps.as_slice()))
        .collect();
    assert_eq!(
        got,
        [
            ("owned", &[step_down(WHY_DELETED), Action::Unserve][..]),
            ("spare", &[Action::Unserve][..]),
        ]
    );
}

#[test]
fn a_lost_lease_steps_down_every_owned_volume_and_decides_nothing_else() {
    let l = local(
        Lease::Lost("lease revoked".into()),
        &[("a", running(2)), ("b", standby()), ("c", running(7))],
    );
    // etcd's view does not matter any more (it may be unreachable)
    let v = view(&[("a", None), ("b", None), ("d", None)]);
    let plans = decide(&v, &l, Instant::now());
    let got: Vec<(&str, &[Action])> = plans
        .iter()
        .map(|p| (p.volume.as_str(), p.steps.as_slice()))
        .collect();
    let down = [step_down("lease revoked")];
    assert_eq!(got, [("a", &down[..]), ("c", &down[..])]);
}

#[test]
fn a_lease_past_its_deadline_decides_nothing() {
    let l = local(Lease::NotValid, &[("a", running(2)), ("b", standby())]);
    let v = view(&[("a", None), ("b", None)]);
    assert!(decide(&v, &l, Instant::now()).is_empty());
}

#[test]
fn memory_unowned_since_is_kept_while_waiting_and_cleared_once_owned() {
    let t0 = Instant::now();
    let m = members(ALL, &[]);
    let v = VolumeView {
        name: "v".into(),
        ..VolumeView::default()
    };
    let p = decide_volume(&m, ME, &v, &standby(), t0);
    assert_eq!(p.memory.unowned_since, Some(t0));
    // the first sighting counts, not the latest
    let later = LocalVolume {
        memory: p.memory.clone(),
        ..standby()
    };
    let p = decide_volume(&m, ME, &v, &later, ms(t0, 100));
    assert_eq!(p.memory.unowned_since, Some(t0));
    let owned = VolumeView {
        owner: Some(owner("c2", 2)),
        ..v
    };
    let p = decide_volume(&m, ME, &owned, &later, ms(t0, 200));
    assert_eq!(p.memory.unowned_since, None);
}

#[test]
fn memory_remembers_a_handoff_from_its_first_sighting() {
    let t0 = Instant::now();
    let m = members(ALL, &[]);
    let v = VolumeView {
        name: "vol".into(),
        owner: None,
        handoff: Some(handoff("c2", 1)),
        deleting: false,
    };
    let p = decide_volume(&m, ME, &v, &standby(), t0);
    assert_eq!(p.memory.handoff_seen, Some((handoff("c2", 1), t0)));
    let again = LocalVolume {
        memory: p.memory,
        ..standby()
    };
    let p = decide_volume(&m, ME, &v, &again, ms(t0, 1_000));
    assert_eq!(p.memory.handoff_seen, Some((handoff("c2", 1), t0)));
}

/// Every volume's plan depends on that volume alone: the order of the
/// snapshot changes the order of the plans, never a plan.
#[test]
fn plans_do_not_depend_on_the_order_volumes_are_visited() {
    let t0 = Instant::now();
    let vols = [
        ("vol", None),
        ("v", None),
        ("x", Some(owner("c3", 2))),
        ("w", Some(owner(ME, 1))),
    ];
    let l = local(
        Lease::Valid,
        &[
            ("vol", standby()),
            ("x", standby()),
            ("w", running(1)),
            ("gone", running(4)),
        ],
    );
    let forward = decide(&view(&vols), &l, t0);
    let mut rev = vols.clone();
    rev.reverse();
    let mut backward = decide(&view(&rev), &l, t0);
    backward.sort_by(|a, b| a.volume.cmp(&b.volume));
    let mut f = forward.clone();
    f.sort_by(|a, b| a.volume.cmp(&b.volume));
    assert_eq!(f, backward);
    // and each equals the one-volume decision
    let m = members(ALL, &[]);
    for v in view(&vols).volumes {
        let lv = l.volumes.get(&v.name).cloned().unwrap_or_default();
        let one = decide_volume(&m, ME, &v, &lv, t0);
        assert!(forward.contains(&one), "{}", v.name);
    }
}

/// A planned move seen from all three nodes, step by step.
#[test]
fn a_planned_move_from_every_side() {
    let t0 = Instant::now();
    let m = members(ALL, &[]);
    let decide_on = |me: &str, owner: Option<Owner>, lv: LocalVolume| {
        let v = VolumeView {
            name: "vol".into(),
            owner,
            handoff: Some(handoff("c3", 1)),
            deleting: false,
        };
        decide_volume(&m, me, &v, &lv, t0).steps
    };
    // the owner hands off; the others wait
    let h = Action::HandOff {
        to: "c3".into(),
        epoch: 1,
    };
    assert_eq!(decide_on("c1", Some(owner("c1", 1)), running(1)), [h]);
    let wait_c1 = Action::Keep(Keep::Standby { owner: "c1".into() });
    assert_eq!(decide_on("c3", Some(owner("c1", 1)), standby()), [wait_c1]);
    // released: the target claims at once, the rendezvous winner waits
    assert_eq!(
        decide_on("c3", None, standby()),
        [Action::Claim { rank: 0 }]
    );
    assert_eq!(
        decide_on("c1", None, standby()),
        [Action::Wait(Wait::HandoffToOther { to: "c3".into() })]
    );
}

#[test]
fn the_handoff_is_read_only_where_it_matters() {
    assert!(handoff_matters(None, ME));
    assert!(handoff_matters(Some(&owner(ME, 2)), ME));
    assert!(!handoff_matters(Some(&owner("c2", 2)), ME));
}

/// The node next in line for a volume (the one with standby links to its
/// members) is the one that claims it at once when its owner dies, and the
/// one a draining owner hands it to; never the owner, never a draining node.
#[test]
fn next_in_line_is_who_claims_first_and_who_a_drain_hands_to() {
    let t0 = Instant::now();
    for vol in ["vol", "v", "x", "db", "pool-7"] {
        for &own in ALL {
            let all = members(ALL, &[]);
            let next: Vec<&str> = ALL
                .iter()
                .copied()
                .filter(|n| next_in_line(&all, n, vol, own))
                .collect();
            assert_eq!(next.len(), 1, "{vol} owned by {own}: {next:?}");
            let next = next[0];
            assert_ne!(next, own);
            // The owner dies: only the node next in line claims at once.
            let survivors: Vec<&str> = ALL.iter().copied().filter(|n| *n != own).collect();
            let gone = members(&survivors, &[]);
            let unowned = VolumeView {
                name: vol.into(),
                ..VolumeView::default()
            };
            for &n in &survivors {
                let p = decide_volume(&gone, n, &unowned, &standby(), t0);
                let claims = p.steps.contains(&Action::Claim { rank: 0 });
                assert_eq!(
                    claims,
                    n == next,
                    "{vol}: {n} after {own} died: {:?}",
                    p.steps
                );
            }
            // The owner drains: it hands the volume to the node next in line.
            let draining = members(ALL, &[own]);
            let owned = VolumeView {
                name: vol.into(),
                owner: Some(owner(own, 4)),
                ..VolumeView::default()
            };
            let p = decide_volume(&draining, own, &owned, &running(4), t0);
            assert!(
                p.steps.contains(&Action::AskHandOff {
                    to: next.into(),
                    epoch: 4
                }),
                "{vol}: {own} draining: {:?}",
                p.steps
            );
            // A draining node is never next in line.
            for &d in ALL.iter().filter(|n| **n != own) {
                assert!(!next_in_line(&members(ALL, &[d]), d, vol, own));
            }
        }
    }
}
