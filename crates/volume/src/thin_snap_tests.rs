//! Snapshot and clone tests on RAM devices: point-in-time reads, read-only
//! snapshots, copy-on-write, clones, deletes in any order with exact space
//! accounting, revert, consistency groups, reopen, and a crash loop over
//! all of them checked against a model and by `check_with_device`.

use std::collections::BTreeMap;
use std::pin::pin;

use blockdev::{BlockDevice, BlockError, BlockOp};

use crate::fault::{CrashSwitch, FaultDevice};
use crate::testutil::{Rng, block_on};
use crate::thin::{ThinError, ThinPool};
use crate::thin_tests::{BS, CB, dev, mem, rand_data, tread, twrite, tzero};

const PER: u64 = CB / BS;

async fn pattern(v: &dyn BlockDevice, lba: u64, blocks: u64, byte: u8) {
    twrite(v, lba, &vec![byte; (blocks * BS) as usize])
        .await
        .unwrap();
}

fn all(got: &[u8], byte: u8) -> bool {
    got.iter().all(|&b| b == byte)
}

async fn checked(pool: &ThinPool) {
    pool.check().unwrap();
    pool.check_with_device().await.unwrap();
}

#[test]
fn a_snapshot_keeps_the_past_and_refuses_writes() {
    block_on(async {
        let pool = ThinPool::format(dev(&mem(4 << 20)), CB).await.unwrap();
        let v = pool.create_volume("v", 8 * CB, 4096).await.unwrap();
        pattern(&v, 0, 2 * PER, 1).await;
        let s = pool.snapshot(&[("v", "s1")]).await.unwrap().remove(0);
        assert!(s.read_only() && !v.read_only());
        assert_eq!(s.geometry().num_blocks, v.geometry().num_blocks);
        // All of v's clusters moved to the snapshot; v owns none yet.
        assert_eq!(s.allocated_bytes(), 2 * CB);
        assert_eq!(v.allocated_bytes(), 0);
        assert_eq!(pool.usage().allocated_clusters, 2);
        // A partial overwrite copies the rest of its cluster (COW).
        pattern(&v, 1, 1, 2).await;
        let got = tread(&v, 0, 2 * PER).await;
        assert!(all(&got[..4096], 1) && all(&got[4096..8192], 2) && all(&got[8192..], 1));
        assert!(all(&tread(&s, 0, 2 * PER).await, 1));
        assert_eq!(v.allocated_bytes(), CB);
        assert_eq!(pool.usage().allocated_clusters, 3);
        // Writes of every kind to the snapshot are refused and change nothing.
        let e = twrite(&s, 0, &[9u8; 4096]).await.unwrap_err();
        assert!(matches!(e, BlockError::ReadOnly(_)), "{e:?}");
        for op in [BlockOp::WriteZeroes, BlockOp::Deallocate] {
            let e = tzero(&s, op, 0, PER).await.unwrap_err();
            assert!(matches!(e, BlockError::ReadOnly(_)), "{e:?}");
        }
        assert!(all(&tread(&s, 0, 2 * PER).await, 1));
        // Deallocating what v shares with its snapshot reads zeroes in v.
        tzero(&v, BlockOp::Deallocate, 0, 2 * PER).await.unwrap();
        assert!(all(&tread(&v, 0, 2 * PER).await, 0));
        assert!(all(&tread(&s, 0, 2 * PER).await, 1));
        let info = pool.volumes();
        let vi = info.iter().find(|i| i.name == "v").unwrap();
        assert_eq!(vi.parent.as_deref(), Some("s1"));
        assert!(!vi.snapshot);
        assert_eq!(vi.shared_bytes, 0, "v hides both clusters now");
        checked(&pool).await;
        // Refusals change nothing.
        assert!(matches!(
            pool.snapshot(&[("v", "s1")]).await,
            Err(ThinError::NameTaken(_))
        ));
        assert!(matches!(
            pool.snapshot(&[("s1", "s2")]).await,
            Err(ThinError::Config(_))
        ));
        assert!(matches!(
            pool.snapshot(&[("v", "a"), ("v", "b")]).await,
            Err(ThinError::Config(_))
        ));
        assert!(matches!(
            pool.clone_volume("v", "c").await,
            Err(ThinError::Config(_))
        ));
        assert_eq!(pool.volumes().len(), 2);
        checked(&pool).await;
    });
}

#[test]
fn clones_share_until_written_and_deletes_free_exactly() {
    block_on(async {
        let pool = ThinPool::format(dev(&mem(4 << 20)), CB).await.unwrap();
        let v = pool.create_volume("v", 8 * CB, 4096).await.unwrap();
        pattern(&v, 0, 4 * PER, 1).await;
        pool.snapshot(&[("v", "s")]).await.unwrap();
        let a = pool.clone_volume("s", "a").await.unwrap();
        let b = pool.clone_volume("s", "b").await.unwrap();
        assert!(all(&tread(&a, 0, 4 * PER).await, 1));
        pattern(&a, 0, PER, 2).await;
        pattern(&b, PER, PER, 3).await;
        pattern(&v, 2 * PER, PER, 4).await;
        let (ga, gb, gv) = (
            tread(&a, 0, 4 * PER).await,
            tread(&b, 0, 4 * PER).await,
            tread(&v, 0, 4 * PER).await,
        );
        let c = CB as usize;
        assert!(all(&ga[..c], 2) && all(&ga[c..], 1));
        assert!(all(&gb[..c], 1) && all(&gb[c..2 * c], 3) && all(&gb[2 * c..], 1));
        assert!(all(&gv[..2 * c], 1) && all(&gv[2 * c..3 * c], 4) && all(&gv[3 * c..], 1));
        let ai = pool.volumes().into_iter().find(|i| i.name == "a").unwrap();
        assert_eq!((ai.allocated_bytes, ai.shared_bytes), (CB, 3 * CB));
        assert_eq!(pool.usage().allocated_clusters, 4 + 3);
        // The snapshot with three children goes first: hidden, nothing freed.
        pool.delete_volume("s").await.unwrap();
        assert!(pool.volume("s").is_none());
        let u = pool.usage();
        assert_eq!((u.snapshots, u.hidden_snapshots), (0, 1));
        assert_eq!(u.allocated_clusters, 7);
        assert!(all(&tread(&b, 2 * PER, 2 * PER).await, 1));
        checked(&pool).await;
        // The name is free again.
        pool.snapshot(&[("a", "s")]).await.unwrap();
        pool.delete_volume("s").await.unwrap();
        // v goes: its one cluster is freed; two clones still read the rest.
        pool.delete_volume("v").await.unwrap();
        assert_eq!(pool.usage().allocated_clusters, 6);
        assert_eq!(pool.usage().hidden_snapshots, 1);
        checked(&pool).await;
        // a goes: the hidden snapshot has one child left and merges into b,
        // which keeps its own cluster 1 and takes 0, 2 and 3.
        pool.delete_volume("a").await.unwrap();
        let u = pool.usage();
        assert_eq!((u.hidden_snapshots, u.allocated_clusters), (0, 4));
        assert_eq!(b.allocated_bytes(), 4 * CB);
        let gb = tread(&b, 0, 4 * PER).await;
        assert!(all(&gb[..c], 1) && all(&gb[c..2 * c], 3) && all(&gb[2 * c..], 1));
        checked(&pool).await;
        pool.delete_volume("b").await.unwrap();
        assert_eq!(pool.usage().allocated_clusters, 0);
        checked(&pool).await;
    });
}

#[test]
fn revert_groups_and_reopen() {
    block_on(async {
        let m = mem(4 << 20);
        {
            let pool = ThinPool::format(dev(&m), CB).await.unwrap();
            let x = pool.create_volume("x", 4 * CB, 4096).await.unwrap();
            let y = pool.create_volume("y", 4 * CB, 4096).await.unwrap();
            pattern(&x, 0, PER, 1).await;
            twrite(&y, 0, &[1u8; 4096]).await.unwrap();
            let snaps = pool.snapshot(&[("x", "x-1"), ("y", "y-1")]).await.unwrap();
            assert_eq!(snaps.len(), 2);
            assert_eq!(snaps[1].geometry().block_size, 4096);
            pattern(&x, 0, PER, 2).await;
            pool.snapshot(&[("x", "x-2")]).await.unwrap();
            pattern(&x, 0, 2 * PER, 3).await;
            // Not one of x's snapshots: refused.
            assert!(matches!(
                pool.revert_volume("x", "y-1").await,
                Err(ThinError::Config(_))
            ));
            pool.revert_volume("x", "x-1").await.unwrap();
            assert!(all(&tread(&x, 0, 2 * PER).await[..CB as usize], 1));
            assert!(all(&tread(&x, PER, PER).await, 0));
            let xi = pool.volumes().into_iter().find(|i| i.name == "x").unwrap();
            assert_eq!(xi.parent.as_deref(), Some("x-1"));
            // x-2 still reads as it was.
            let s2 = pool.volume("x-2").unwrap();
            assert!(all(&tread(&s2, 0, PER).await, 2));
            checked(&pool).await;
            pool.close().await.unwrap();
        }
        let pool = ThinPool::open(dev(&m)).await.unwrap();
        checked(&pool).await;
        let names: Vec<String> = pool.volumes().into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["x", "x-1", "x-2", "y", "y-1"]);
        let s2 = pool.volume("x-2").unwrap();
        assert!(s2.read_only());
        assert_eq!(
            pool.volumes()
                .into_iter()
                .find(|i| i.name == "x-2")
                .unwrap()
                .parent
                .as_deref(),
            Some("x-1")
        );
        assert!(all(&tread(&s2, 0, PER).await, 2));
        assert!(all(&tread(&pool.volume("x").unwrap(), 0, PER).await, 1));
        let y1 = pool.volume("y-1").unwrap();
        assert!(all(&tread(&y1, 0, 1).await, 1));
    });
}

#[test]
fn shrink_cuts_only_an_unused_end() {
    block_on(async {
        let pool = ThinPool::format(dev(&mem(4 << 20)), CB).await.unwrap();
        let v = pool.create_volume("v", 8 * CB, 4096).await.unwrap();
        pattern(&v, 5 * PER + 1, 1, 1).await;
        pool.snapshot(&[("v", "s")]).await.unwrap();
        // Cluster 5 holds data (in the snapshot): cutting into it is refused.
        for size in [5 * CB + BS, 4 * CB] {
            let e = pool.shrink_volume("v", size).await.unwrap_err();
            assert!(
                matches!(e, ThinError::ShrinkInUse { cluster: 5, .. }),
                "{e:?}"
            );
        }
        assert!(matches!(
            pool.shrink_volume("s", 6 * CB).await,
            Err(ThinError::Config(_))
        ));
        assert_eq!(v.geometry().num_blocks, 8 * PER);
        // Past it: cut; the end is refused, and grown back it reads zeroes.
        pool.shrink_volume("v", 6 * CB).await.unwrap();
        assert_eq!(v.geometry().num_blocks, 6 * PER);
        let e = twrite(&v, 6 * PER, &[2u8; 4096]).await.unwrap_err();
        assert!(matches!(e, BlockError::OutOfRange { .. }), "{e:?}");
        pool.grow_volume("v", 8 * CB).await.unwrap();
        assert!(all(&tread(&v, 6 * PER, 2 * PER).await, 0));
        let got = tread(&v, 5 * PER, PER).await;
        assert!(all(&got[4096..8192], 1) && all(&got[..4096], 0));
        checked(&pool).await;
    });
}

#[test]
fn a_write_that_waited_out_a_shrink_writes_nothing_past_the_new_end() {
    block_on(async {
        let pool = ThinPool::format(dev(&mem(4 << 20)), CB).await.unwrap();
        let v = pool.create_volume("v", 4 * CB, 4096).await.unwrap();
        let w = pool.create_volume("w", 4 * CB, 4096).await.unwrap();
        // The shrink takes the volume's locks, then waits for the journal.
        let j = v.pool.journal.lock().await;
        let mut shrink = pin!(pool.shrink_volume("v", 3 * CB + CB / 2));
        assert!(pending(shrink.as_mut()));
        // Writes checked against the old size wait for the last cluster's
        // lock: one into the half that stays (it maps the cluster), then
        // one into the half that goes (it finds the cluster mapped).
        let mut stays = pin!(twrite(&v, 3 * PER, &[6u8; 4096]));
        assert!(pending(stays.as_mut()));
        let mut goes = pin!(twrite(&v, 3 * PER + PER / 2, &[7u8; 4096]));
        assert!(pending(goes.as_mut()));
        drop(j);
        shrink.await.unwrap();
        stays.await.unwrap();
        let e = goes.await.unwrap_err();
        assert!(matches!(e, BlockError::OutOfRange { .. }), "{e:?}");
        // Grown back, the cut part reads zeroes.
        pool.grow_volume("v", 4 * CB).await.unwrap();
        let got = tread(&v, 3 * PER, PER).await;
        assert!(all(&got[..4096], 6) && all(&got[4096..], 0));
        // Alone: nothing maps the last cluster before the write.
        let j = w.pool.journal.lock().await;
        let mut shrink = pin!(pool.shrink_volume("w", 3 * CB + CB / 2));
        assert!(pending(shrink.as_mut()));
        let mut goes = pin!(twrite(&w, 3 * PER + PER / 2, &[7u8; 4096]));
        assert!(pending(goes.as_mut()));
        drop(j);
        shrink.await.unwrap();
        let e = goes.await.unwrap_err();
        assert!(matches!(e, BlockError::OutOfRange { .. }), "{e:?}");
        pool.grow_volume("w", 4 * CB).await.unwrap();
        assert!(all(&tread(&w, 3 * PER, PER).await, 0));
        checked(&pool).await;
    });
}

#[test]
fn deallocating_to_the_end_of_an_odd_size_volume_over_a_snapshot() {
    block_on(async {
        // 3.5 clusters: a Deallocate to the end takes the last one whole,
        // and hiding the snapshot's data there gives it a zeroed cluster.
        let pool = ThinPool::format(dev(&mem(4 << 20)), CB).await.unwrap();
        let v = pool
            .create_volume("v", 3 * CB + CB / 2, 4096)
            .await
            .unwrap();
        pattern(&v, 3 * PER, 2, 4).await;
        pool.snapshot(&[("v", "s")]).await.unwrap();
        tzero(&v, BlockOp::Deallocate, 2 * PER, PER + PER / 2)
            .await
            .unwrap();
        assert!(all(&tread(&v, 2 * PER, PER + PER / 2).await, 0));
        let s = pool.volume("s").unwrap();
        assert!(all(&tread(&s, 3 * PER, 2).await, 4));
        checked(&pool).await;
    });
}

/// Polls `f` once; whether it is still pending.
fn pending<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> bool {
    let waker = std::task::Waker::noop();
    f.poll(&mut std::task::Context::from_waker(waker))
        .is_pending()
}

/// The model of one visible volume or snapshot.
#[derive(Clone)]
struct Model {
    data: Vec<u8>,
    snapshot: bool,
}

enum Step {
    Write(String, u64, Vec<u8>),
    Zero(String, u64, u64, bool),
    Snapshot(String, String),
    Clone(String, String),
    Delete(String),
    Revert(String, String),
}

fn pick<'a>(rng: &mut Rng, names: &[&'a String]) -> Option<&'a String> {
    (!names.is_empty()).then(|| names[rng.below(names.len() as u64) as usize])
}

fn random_step(rng: &mut Rng, models: &BTreeMap<String, Model>, n: &mut u64) -> Option<Step> {
    let vols: Vec<&String> = models
        .iter()
        .filter(|m| !m.1.snapshot)
        .map(|m| m.0)
        .collect();
    let snaps: Vec<&String> = models
        .iter()
        .filter(|m| m.1.snapshot)
        .map(|m| m.0)
        .collect();
    *n += 1;
    Some(match rng.below(12) {
        0 => Step::Snapshot(pick(rng, &vols)?.clone(), format!("s{n}")),
        1 => Step::Clone(pick(rng, &snaps)?.clone(), format!("c{n}")),
        2 if models.len() > 3 => {
            let all: Vec<&String> = models.keys().collect();
            let victim = pick(rng, &all)?;
            if vols.len() == 1 && vols[0] == victim {
                return None;
            }
            Step::Delete(victim.clone())
        }
        3 => Step::Revert(pick(rng, &vols)?.clone(), pick(rng, &snaps)?.clone()),
        4 | 5 => {
            let v = pick(rng, &vols)?;
            let size = models[v].data.len() as u64 / BS;
            let lba = rng.below(size);
            let blocks = 1 + rng.below((2 * PER + 1).min(size - lba));
            Step::Zero(v.clone(), lba, blocks, rng.below(2) == 0)
        }
        _ => {
            let v = pick(rng, &vols)?;
            let size = models[v].data.len() as u64 / BS;
            let lba = rng.below(size);
            let blocks = 1 + rng.below((2 * PER + 1).min(size - lba));
            Step::Write(v.clone(), lba, rand_data(rng, (blocks * BS) as usize))
        }
    })
}

/// Power cuts at random points of random writes, zeroes, snapshots,
/// clones, deletes and reverts: after each reopen every volume and snapshot
/// reads as its model (the step in flight done or not; a write's blocks old
/// or new each), no other name exists, and the metadata checks in memory
/// and against the device (no cluster in two maps, none held by nothing).
fn snapshot_crash_loop(iterations: u64, seed: u64) {
    block_on(async {
        let m = mem(4 << 20);
        let size = 6 * CB;
        {
            let pool = ThinPool::format(dev(&m), CB).await.unwrap();
            pool.create_volume("v", size, 4096).await.unwrap();
        }
        let mut models = BTreeMap::from([(
            "v".to_string(),
            Model {
                data: vec![0; size as usize],
                snapshot: false,
            },
        )]);
        let mut rng = Rng::new(seed);
        let (mut n, mut reverts, mut merges) = (0u64, 0u64, 0u64);
        let mut log: Vec<String> = Vec::new();
        let mut admin_cuts = 0;
        for it in 0..iterations {
            let crash = CrashSwitch::new();
            let f = FaultDevice::with_crash(dev(&m), crash.clone());
            f.set_yields(3, seed ^ (it << 8));
            let pool = ThinPool::open(f.clone()).await.unwrap();
            pool.check_with_device()
                .await
                .unwrap_or_else(|e| panic!("iteration {it}: {e}"));
            let names: Vec<String> = pool.volumes().into_iter().map(|i| i.name).collect();
            let want: Vec<String> = models.keys().cloned().collect();
            assert_eq!(names, want, "iteration {it}");
            for (name, md) in &models {
                let v = pool.volume(name).unwrap();
                assert_eq!(v.read_only(), md.snapshot, "iteration {it}: {name}");
                let got = tread(&v, 0, md.data.len() as u64 / BS).await;
                if got != md.data {
                    let b = (0..got.len() / BS as usize).find(|&b| {
                        got[b * 4096..(b + 1) * 4096] != md.data[b * 4096..(b + 1) * 4096]
                    });
                    panic!(
                        "iteration {it}: {name} reads other data from block {b:?}; log: {:?}",
                        log.iter().rev().take(12).collect::<Vec<_>>()
                    );
                }
            }
            crash.arm(1 + rng.below(80));
            while !crash.crashed() {
                let Some(step) = random_step(&mut rng, &models, &mut n) else {
                    continue;
                };
                let hidden_before = pool.usage().hidden_snapshots;
                log.push(match &step {
                    Step::Write(v, l, d) => format!("{it}: write {v} {l}+{}", d.len() / 4096),
                    Step::Zero(v, l, b, d) => format!("{it}: zero {v} {l}+{b} {d}"),
                    Step::Snapshot(v, s) => format!("{it}: snap {v} {s}"),
                    Step::Clone(s, c) => format!("{it}: clone {s} {c}"),
                    Step::Delete(v) => format!("{it}: delete {v}"),
                    Step::Revert(v, s) => format!("{it}: revert {v} {s}"),
                });
                let r = match &step {
                    Step::Write(v, lba, data) => twrite(&pool.volume(v).unwrap(), *lba, data)
                        .await
                        .map_err(ThinError::Io),
                    Step::Zero(v, lba, blocks, dealloc) => {
                        let op = if *dealloc {
                            BlockOp::Deallocate
                        } else {
                            BlockOp::WriteZeroes
                        };
                        tzero(&pool.volume(v).unwrap(), op, *lba, *blocks)
                            .await
                            .map_err(ThinError::Io)
                    }
                    Step::Snapshot(v, s) => pool.snapshot(&[(v, s)]).await.map(|_| ()),
                    Step::Clone(s, c) => pool.clone_volume(s, c).await.map(|_| ()),
                    Step::Delete(v) => pool.delete_volume(v).await,
                    Step::Revert(v, s) => pool.revert_volume(v, s).await,
                };
                let crashed = crash.crashed();
                if r.is_err() && !crashed {
                    // Before the cut only refusals fail, and they change nothing.
                    match &r {
                        Err(ThinError::Io(BlockError::NoSpace))
                        | Err(ThinError::TooManyVolumes(_)) => continue,
                        Err(ThinError::Config(_)) if matches!(step, Step::Revert(..)) => continue,
                        _ => panic!("iteration {it}: {r:?}"),
                    }
                }
                if !crashed {
                    if pool.usage().hidden_snapshots < hidden_before {
                        merges += 1;
                    }
                    apply(&mut models, &step);
                    if std::env::var("SNAP_DEBUG").is_ok() {
                        pool.check()
                            .unwrap_or_else(|e| panic!("after {:?}: {e}", log.last()));
                        for (name, md) in &models {
                            let v = pool.volume(name).unwrap();
                            let got = tread(&v, 0, md.data.len() as u64 / BS).await;
                            if got != md.data {
                                let b = (0..got.len() / 4096).find(|&b| {
                                    got[b * 4096..(b + 1) * 4096]
                                        != md.data[b * 4096..(b + 1) * 4096]
                                });
                                for i in pool.volumes() {
                                    eprintln!(
                                        "{} parent {:?} own {:?}",
                                        i.name,
                                        i.parent,
                                        pool.volume(&i.name).unwrap().mapped_clusters()
                                    );
                                }
                                let b = b.unwrap() * 4096;
                                eprintln!("got {:?} want {:?}", &got[b..b + 8], &md.data[b..b + 8]);
                                panic!(
                                    "after {:?}: {name} differs at block {b:?}; {:?}",
                                    log.last(),
                                    &log[log.len().saturating_sub(30)..]
                                );
                            }
                        }
                    }
                    if matches!(step, Step::Revert(..)) {
                        reverts += 1;
                    }
                    continue;
                }
                // The step in flight at the cut: see what the pool kept.
                if !matches!(step, Step::Write(..) | Step::Zero(..)) {
                    admin_cuts += 1;
                }
                drop(pool);
                let pool = ThinPool::open(dev(&m)).await.unwrap();
                settle(&pool, &mut models, &step, it).await;
                break;
            }
        }
        eprintln!(
            "{n} steps, {reverts} reverts, {merges} merges, {admin_cuts} cuts in admin steps"
        );
        assert!(
            n > 100 && reverts > 0 && merges > 0,
            "too few: {n} steps, {reverts} reverts, {merges} merges"
        );
        assert!(
            admin_cuts > 5,
            "only {admin_cuts} cuts hit a snapshot, clone, delete or revert"
        );
    });
}

fn apply(models: &mut BTreeMap<String, Model>, step: &Step) {
    match step {
        Step::Write(v, lba, data) => {
            let at = (lba * BS) as usize;
            models.get_mut(v).unwrap().data[at..at + data.len()].copy_from_slice(data);
        }
        Step::Zero(v, lba, blocks, _) => {
            let at = (lba * BS) as usize;
            models.get_mut(v).unwrap().data[at..at + (blocks * BS) as usize].fill(0);
        }
        Step::Snapshot(v, s) => {
            let data = models[v].data.clone();
            models.insert(
                s.clone(),
                Model {
                    data,
                    snapshot: true,
                },
            );
        }
        Step::Clone(s, c) => {
            let data = models[s].data.clone();
            models.insert(
                c.clone(),
                Model {
                    data,
                    snapshot: false,
                },
            );
        }
        Step::Delete(v) => {
            models.remove(v);
        }
        Step::Revert(v, s) => {
            let data = models[s].data.clone();
            let md = models.get_mut(v).unwrap();
            md.data[..data.len()].copy_from_slice(&data);
            md.data[data.len()..].fill(0);
        }
    }
}

/// Brings the model to what the reopened pool kept of the step in flight.
async fn settle(pool: &ThinPool, models: &mut BTreeMap<String, Model>, step: &Step, it: u64) {
    let mut done = models.clone();
    apply(&mut done, step);
    let names: Vec<String> = pool.volumes().into_iter().map(|i| i.name).collect();
    match step {
        Step::Write(v, lba, data) => {
            let got = tread(
                &pool.volume(v).unwrap(),
                0,
                models[v].data.len() as u64 / BS,
            )
            .await;
            let md = models.get_mut(v).unwrap();
            let s = (lba * BS) as usize;
            for (i, blk) in data.chunks(BS as usize).enumerate() {
                let at = s + i * BS as usize;
                let now = &got[at..at + BS as usize];
                assert!(
                    now == blk || now == &md.data[at..at + BS as usize],
                    "iteration {it}: {v} block {} is neither old nor new",
                    at as u64 / BS
                );
                md.data[at..at + BS as usize].copy_from_slice(now);
            }
        }
        Step::Zero(v, lba, blocks, _) => {
            let got = tread(
                &pool.volume(v).unwrap(),
                0,
                models[v].data.len() as u64 / BS,
            )
            .await;
            let md = models.get_mut(v).unwrap();
            for b in *lba..lba + blocks {
                let at = (b * BS) as usize;
                let now = &got[at..at + BS as usize];
                assert!(
                    all(now, 0) || now == &md.data[at..at + BS as usize],
                    "iteration {it}: {v} block {b} is neither old nor zero"
                );
                md.data[at..at + BS as usize].copy_from_slice(now);
            }
        }
        _ => {
            let want_done: Vec<String> = done.keys().cloned().collect();
            let want_old: Vec<String> = models.keys().cloned().collect();
            if names == want_done && names != want_old {
                *models = done;
            } else if let Step::Revert(v, s) = step {
                // Names do not tell: the volume's data does.
                let got = tread(
                    &pool.volume(v).unwrap(),
                    0,
                    models[v].data.len() as u64 / BS,
                )
                .await;
                if got == done[v].data && got != models[v].data {
                    *models = done;
                } else {
                    assert!(
                        got == models[v].data,
                        "iteration {it}: revert of {v} to {s} torn"
                    );
                }
            } else {
                assert_eq!(names, want_old, "iteration {it}: neither before nor after");
            }
        }
    }
}

#[test]
fn snapshot_crash_restart_loop() {
    snapshot_crash_loop(150, 11);
}

#[test]
fn snapshot_crash_restart_loop_other_seed() {
    snapshot_crash_loop(100, 12);
}
