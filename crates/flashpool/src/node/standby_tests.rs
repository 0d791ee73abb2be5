//! Standby member links (`standby.rs`): an assembly takes them instead of
//! connecting, a clean hand-over parks its members as standby links, and a
//! link that broke is never handed to an assembly.

use std::sync::Arc;
use std::time::Duration;

use nvmf_host::remote::{LinkState, RemoteDevice};

use super::remote_tests::{Enclosure, hosts, owner, read, stamp, wait_for, write};
use super::*;

fn names(v: &[&str]) -> std::collections::BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn assemble(drives: &[&str], takeover: bool) -> AssembleVolume {
    AssembleVolume {
        drives: drives.iter().map(|d| d.to_string()).collect(),
        takeover,
        force: false,
        export: None,
        only: None,
    }
}

/// The remote device behind drive `name` of `node`.
async fn remote_of(node: &Node, name: &str) -> Arc<RemoteDevice> {
    node.state.lock().await.drives[name]
        .remote
        .clone()
        .expect("a remote drive")
}

async fn device(node: &Node, vol: &str) -> Arc<dyn BlockDevice> {
    node.state.lock().await.volumes[vol].device()
}

/// Enclosure e1 with two drives for nodes a and b, and a's raid1 `m` on them.
async fn mirror_of_a() -> (Enclosure, Arc<Node>) {
    let enc = Enclosure::new("e1", 2, &hosts(&["a", "b"]));
    let a = owner("a", &enc);
    a.create_volume(testing::volume("m", "raid1", &["e1:d0", "e1:d1"]))
        .await
        .unwrap();
    (enc, a)
}

/// B holds standby links to A's members; its takeover assembles on those
/// very connections (no new ones), preempts A, and serves A's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_assembles_on_the_standby_links() {
    let (enc, a) = mirror_of_a().await;
    write(&*device(&a, "m").await, 9, 1).await.unwrap();

    let b = owner("b", &enc);
    b.refresh_standby(names(&["e1:d0", "e1:d1"])).await;
    assert_eq!(b.standby_links(), names(&["e1:d0", "e1:d1"]));
    let parked: Vec<Arc<RemoteDevice>> = ["e1:d0", "e1:d1"]
        .iter()
        .map(|n| b.standby.lock().links[*n].clone())
        .collect();
    assert!(b.drives().await.is_empty(), "a standby link is not a drive");

    let info = b
        .assemble_volume(assemble(&["e1:d0", "e1:d1"], true))
        .await
        .unwrap();
    assert_eq!(info.name, "m");
    assert!(b.standby_links().is_empty(), "taken, not copied");
    for (n, p) in ["e1:d0", "e1:d1"].iter().zip(&parked) {
        assert!(
            Arc::ptr_eq(&remote_of(&b, n).await, p),
            "drive {n}: connected afresh instead of taking the standby link"
        );
        assert_eq!(p.connects(), 1, "drive {n}: reconnected");
    }
    let got = read(&*device(&b, "m").await, 9).await.unwrap();
    assert!(got[..] == stamp(9, 1)[..], "A's write is missing on B");
    wait_for("A fenced", Duration::from_secs(10), async || {
        write(&*device(&a, "m").await, 10, 2).await.is_err()
    })
    .await;
}

/// A clean hand-over keeps the members open as standby links (without a
/// reservation: the next owner assembles without a takeover), and the move
/// back assembles on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_parks_its_members_and_a_move_back_takes_them() {
    let (enc, a) = mirror_of_a().await;
    let first = remote_of(&a, "e1:d0").await;
    a.hand_over("m").await.unwrap();
    assert!(a.drives().await.is_empty());
    assert_eq!(a.standby_links(), names(&["e1:d0", "e1:d1"]));

    let b = owner("b", &enc);
    b.assemble_volume(assemble(&["e1:d0", "e1:d1"], false))
        .await
        .expect("A released its reservations");
    write(&*device(&b, "m").await, 3, 7).await.unwrap();
    b.hand_over("m").await.unwrap();

    a.assemble_volume(assemble(&["e1:d0", "e1:d1"], false))
        .await
        .unwrap();
    assert!(
        Arc::ptr_eq(&remote_of(&a, "e1:d0").await, &first),
        "the move back connected afresh"
    );
    let got = read(&*device(&a, "m").await, 3).await.unwrap();
    assert!(got[..] == stamp(3, 7)[..], "B's write is missing on A");
    // Its link is followed again: one watcher per drive, not two.
    assert_eq!(a.link_watchers.lock().len(), 2);
    // A closed link's watcher ends and takes its entry with it.
    a.shutdown().await;
    wait_for("the watchers gone", Duration::from_secs(10), async || {
        a.link_watchers.lock().is_empty()
    })
    .await;
}

/// A standby link that broke (its enclosure went away) is dropped by the
/// next refresh, which does not dial the drive again for a while; an
/// assembly connects afresh once the enclosure is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_standby_link_is_dropped_not_used() {
    let (mut enc, a) = mirror_of_a().await;
    a.hand_over("m").await.unwrap();
    let b = owner("b", &enc);
    let wanted = names(&["e1:d0", "e1:d1"]);
    b.refresh_standby(wanted.clone()).await;
    let old = b.standby.lock().links["e1:d0"].clone();

    enc.stop();
    wait_for("the links broken", Duration::from_secs(10), async || {
        !matches!(
            old.link_state(),
            LinkState::Connected | LinkState::Reconnecting { .. }
        )
    })
    .await;
    b.refresh_standby(wanted.clone()).await;
    assert!(
        !b.standby_links().contains("e1:d0"),
        "a broken link stayed in standby"
    );
    enc.start();
    // The failed reopen backs off: the enclosure is not dialled every pass.
    b.refresh_standby(wanted).await;
    assert!(
        !b.standby_links().contains("e1:d0"),
        "a drive that could not be reached was dialled again at once"
    );
    b.assemble_volume(assemble(&["e1:d0", "e1:d1"], false))
        .await
        .unwrap();
    assert!(!Arc::ptr_eq(&remote_of(&b, "e1:d0").await, &old));
    assert_eq!(old.link_state(), LinkState::Closed, "the broken link leaks");
}

/// `remote.standby_links` caps the set: the links open already are kept
/// first, so a reached cap does not churn connections; 0 keeps none.
#[test]
fn the_cap_keeps_the_open_links_first() {
    use super::standby::within_cap;
    let wanted = names(&["e1:d0", "e1:d1", "e2:d0", "e2:d1"]);
    let open = |n: &str| n.starts_with("e2:");
    assert_eq!(within_cap(wanted.clone(), 8, open), wanted);
    assert_eq!(
        within_cap(wanted.clone(), 3, open),
        names(&["e1:d0", "e2:d0", "e2:d1"])
    );
    assert_eq!(
        within_cap(wanted.clone(), 1, |n| n == "e1:d1"),
        names(&["e1:d1"])
    );
    assert!(within_cap(wanted, 0, open).is_empty());
}
