//! Long work runs as jobs with progress (initial
//! sync, rebuild, scrub), scrub can be stopped, and hot spares take a
//! failed member's place by themselves.

use std::collections::HashSet;

use super::*;
use crate::events::EventKind;
use crate::node::jobs::{JobKind, JobState};
use crate::node::testing::{job_of, wait_job};

/// Member byte offset where data starts (the default metadata area).
const META: u64 = volume::DEFAULT_META_BYTES;

/// Junk on the drives' data areas, so that a new volume needs a sync.
async fn dirty(node: &Node, drives: &[&str]) {
    let mut st = node.state.lock().await;
    for (i, d) in drives.iter().enumerate() {
        let dr = st.drives.get_mut(*d).unwrap();
        dr.fresh = false;
        for k in 0..64u64 {
            let lba = (META + k * 40_960) / 4096;
            io(
                &*dr.dev,
                BlockOp::Write { fua: false },
                lba,
                Some(&stamp(lba, i as u64 + 1)),
            )
            .await;
        }
    }
}

/// A 2 GiB raid5 used to take 34 s inside the create request, holding
/// the API. Now create answers at once and the sync is a job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_sync_is_a_job_and_create_answers_at_once() {
    let node = mem_node(4, 32 * MIB);
    dirty(&node, &["d0", "d1", "d2", "d3"]).await;
    let mut r = req("r5", "raid5", &["d0", "d1", "d2", "d3"]);
    r.export = Some(ns1());
    let v = node.create_volume(r).await.unwrap();
    assert!(
        v.state == "resyncing" || v.state == "optimal",
        "{}",
        v.state
    );
    let jobs = node.jobs().await;
    let sync = job_of(&jobs, "r5", JobKind::Sync).expect("a sync job");
    let done = wait_job(&node, sync.id).await;
    assert_eq!(done.state, JobState::Finished, "{done:?}");
    assert!(done.total_stripes > 0 && done.done_stripes == done.total_stripes);
    assert_eq!(done.percent, 100.0);
    assert_eq!(node.volume("r5").await.unwrap().state, "optimal");
    let kinds: Vec<EventKind> = node.events.recent().iter().map(|e| e.kind).collect();
    assert!(kinds.contains(&EventKind::SyncStarted) && kinds.contains(&EventKind::SyncFinished));
    // Parity is real: a scrub finds nothing, and a lost member reads back.
    let j = node
        .scrub_volume("r5", ScrubRequest::default())
        .await
        .unwrap();
    let j = wait_job(&node, j.id).await;
    assert_eq!((j.mismatches, j.skipped), (0, 0), "{j:?}");
    let dev = served(&node);
    let l = lbas(&*dev);
    write_all(&*dev, &l, 5).await;
    node.fail_drive("d2", false).await.unwrap();
    check_all(&*dev, &l, 5).await;
}

/// Scrub used to be reachable from neither the CLI nor the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrub_counts_repairs_stops_and_refuses_clearly() {
    let node = mem_node(5, 16 * MIB);
    let mut r = req("r5", "raid5", &["d0", "d1", "d2"]);
    r.export = Some(ns1());
    node.create_volume(r).await.unwrap();
    node.create_volume(req("r0", "raid0", &["d3", "d4"]))
        .await
        .unwrap();
    let dev = served(&node);
    let l = lbas(&*dev);
    write_all(&*dev, &l, 7).await;
    // Rot below the volume: one block of member 1's data area.
    {
        let st = node.state.lock().await;
        let d1 = st.drives["d1"].dev.clone();
        let lba = META / 4096 + 3;
        io(
            &*d1,
            BlockOp::Write { fua: false },
            lba,
            Some(&stamp(1, 99)),
        )
        .await;
    }
    let check = node
        .scrub_volume("r5", ScrubRequest::default())
        .await
        .unwrap();
    assert_eq!(check.kind, JobKind::Scrub);
    let check = wait_job(&node, check.id).await;
    assert_eq!((check.mismatches, check.repaired), (1, 0), "{check:?}");
    let v = node.volume("r5").await.unwrap();
    assert_eq!(v.last_scrub.as_ref().map(|s| s.id), Some(check.id));
    let ev = node.events.recent();
    let m = ev
        .iter()
        .find(|e| e.kind == EventKind::ScrubMismatch)
        .expect("a scrub_mismatch event");
    assert_eq!(m.volume.as_deref(), Some("r5"));
    let fix = ScrubRequest {
        repair: true,
        rate: None,
    };
    let fix = node.scrub_volume("r5", fix).await.unwrap();
    let fix = wait_job(&node, fix.id).await;
    assert_eq!((fix.mismatches, fix.repaired), (1, 1));
    let again = node
        .scrub_volume("r5", ScrubRequest::default())
        .await
        .unwrap();
    assert_eq!(wait_job(&node, again.id).await.mismatches, 0);

    // Refusals change nothing.
    let before = api_state(&node).await;
    let e = node.scrub_volume("r0", ScrubRequest::default()).await;
    assert!(
        matches!(e, Err(NodeError::BadRequest(ref m)) if m.contains("no parity")),
        "{e:?}"
    );
    let e = node.scrub_volume("nope", ScrubRequest::default()).await;
    assert!(matches!(e, Err(NodeError::Missing { .. })), "{e:?}");
    let bad = ScrubRequest {
        repair: false,
        rate: Some("fast".into()),
    };
    assert!(matches!(
        node.scrub_volume("r5", bad).await,
        Err(NodeError::BadRequest(_))
    ));
    let e = node.stop_scrub("r5").await;
    assert!(matches!(e, Err(NodeError::Conflict(_))), "{e:?}");
    assert_eq!(before, api_state(&node).await);

    // A slow scrub: a second one is refused, and stop stops it.
    let slow = ScrubRequest {
        repair: false,
        rate: Some("1MiB".into()),
    };
    let j = node.scrub_volume("r5", slow).await.unwrap();
    let e = node.scrub_volume("r5", ScrubRequest::default()).await;
    assert!(
        matches!(e, Err(NodeError::Conflict(ref m)) if m.contains(&format!("job {}", j.id))),
        "{e:?}"
    );
    assert_eq!(node.volume("r5").await.unwrap().jobs.len(), 1);
    node.stop_scrub("r5").await.unwrap();
    let j = wait_job(&node, j.id).await;
    assert_eq!(j.state, JobState::Stopped);
    assert!(j.done_stripes < j.total_stripes, "{j:?}");
}

/// Right after a replace the progress used to say `0.0% (0 of 0
/// stripes)` or the last rebuild's 100%, and never named the drive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_progress_names_its_drives_from_the_moment_of_the_replace() {
    let node = mem_node(6, 16 * MIB);
    let mut r = req("r6", "raid6", &["d0", "d1", "d2", "d3"]);
    r.rebuild_rate = Some("4MiB".into());
    node.create_volume(r).await.unwrap();
    node.fail_drive("d1", false).await.unwrap();
    node.fail_drive("d2", false).await.unwrap();
    let v = node.replace_drive("d1", "d4").await.unwrap();
    assert!(v.rebuild.running);
    assert!(v.rebuild.total_stripes > 0, "{:?}", v.rebuild);
    let named: Vec<String> = v
        .rebuild
        .drives
        .iter()
        .chain(&v.rebuild.queued_drives)
        .cloned()
        .collect();
    assert_eq!(named, ["d4"]);
    // A second replacement while the first runs: it is queued, and the
    // job's total covers both.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let v = node.replace_drive("d2", "d5").await.unwrap();
    let job = job_of(&node.jobs().await, "r6", JobKind::Rebuild).expect("a rebuild job");
    assert_eq!(job.drives, ["d4"], "{job:?}");
    assert_eq!(job.queued_drives, ["d5"], "{job:?}");
    assert!(job.total_stripes > v.rebuild.total_stripes / 2, "{job:?}");
    assert!(job.eta_secs.is_some() || job.done_stripes == 0, "{job:?}");
    // Full speed from here.
    node.state
        .lock()
        .await
        .volumes
        .get_mut("r6")
        .unwrap()
        .rebuild_rate = None;
    let j = wait_job(&node, job.id).await;
    assert_eq!(j.state, JobState::Finished, "{j:?}");
    assert_eq!(node.volume("r6").await.unwrap().state, "optimal");
}

/// Hot spares take a failed member's place by themselves (there were none before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_spare_takes_a_failed_members_place() {
    let mut specs: Vec<DriveSpec> = (0..4)
        .map(|i| mem_drive(&format!("d{i}"), 16 * MIB))
        .collect();
    specs.push(mem_drive("small", 4 * MIB));
    specs.push(mem_drive("s1", 32 * MIB));
    specs.push(mem_drive("s0", 16 * MIB));
    let node = node_of(&specs);
    {
        let mut st = node.state.lock().await;
        for s in ["small", "s0", "s1"] {
            st.drives.get_mut(s).unwrap().spare = true;
        }
    }
    assert_eq!(node.drive("s0").await.unwrap().state, "spare");
    let mut r = req("r5", "raid5", &["d0", "d1", "d2", "d3"]);
    r.export = Some(ns1());
    node.create_volume(r).await.unwrap();
    let dev = served(&node);
    let l = lbas(&*dev);
    write_all(&*dev, &l, 3).await;
    let mut refused = HashSet::new();
    node.take_spares(&mut refused).await;
    assert_eq!(
        node.volume("r5").await.unwrap().state,
        "optimal",
        "nothing failed yet"
    );
    node.fail_drive("d2", false).await.unwrap();
    node.take_spares(&mut refused).await;
    // The smallest spare that fits: not `small` (too small), not s1.
    let v = node.volume("r5").await.unwrap();
    assert_eq!(v.members[2].drive, "s0");
    let ev = node.events.recent();
    let taken = ev
        .iter()
        .find(|e| e.kind == EventKind::SpareTaken)
        .expect("a spare_taken event");
    assert_eq!(
        (taken.volume.as_deref(), taken.drive.as_deref()),
        (Some("r5"), Some("s0"))
    );
    let v = node
        .wait_rebuild("r5", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(v.state, "optimal");
    check_all(&*dev, &l, 3).await;
    assert_eq!(node.drive("s0").await.unwrap().state, "member");
    assert_eq!(node.drive("small").await.unwrap().state, "spare");
}

/// A delete must not leave a scrub (or sync) writing to drives that are
/// free again: it stops the job first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_stops_the_volumes_scrub_first() {
    let node = mem_node(3, 16 * MIB);
    node.create_volume(req("r5", "raid5", &["d0", "d1", "d2"]))
        .await
        .unwrap();
    let slow = ScrubRequest {
        repair: true,
        rate: Some("1MiB".into()),
    };
    let j = node.scrub_volume("r5", slow).await.unwrap();
    node.delete_volume("r5", true).await.unwrap();
    let j = node.job(j.id).await.unwrap();
    assert_eq!(j.state, JobState::Stopped, "{j:?}");
    assert_eq!(node.drive("d1").await.unwrap().state, "free");
}

/// A rebuild whose task waits for the node's takeovers (due, not running
/// yet) holds a delete off: deleted meanwhile, the volume's drives would be
/// written by it once it starts. Once it is done, the delete goes through.
#[tokio::test]
async fn a_delete_waits_for_a_rebuild_that_is_due() {
    let node = mem_node(3, 16 * MIB);
    node.create_volume(req("m", "raid1", &["d0", "d1"]))
        .await
        .unwrap();
    node.fail_drive("d1", false).await.unwrap();
    // A takeover under way: the rebuild waits for it.
    let busy = node.foreground.enter();
    node.replace_drive("d1", "d2").await.unwrap();
    let e = node.delete_volume("m", true).await.unwrap_err();
    assert!(e.to_string().contains("rebuilding"), "{e}");
    assert!(node.volume("m").await.is_ok(), "nothing was changed");
    drop(busy);
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while let Err(e) = node.delete_volume("m", true).await {
        assert!(std::time::Instant::now() < until, "never deleted: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(node.volume("m").await.is_err());
}
