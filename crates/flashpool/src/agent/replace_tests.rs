//! `drive replace` of a cluster volume's member: asked of a node that does
//! not own the volume (passed on to the owner), recorded in the volume's
//! spec, rebuilt, and still in place after a planned move, where the next
//! owner assembles the volume from the new drive and not from the wiped
//! one; refused replaces change nothing; a replace cut short after its
//! record (the drive listed as joining, nothing written to it) leaves the
//! volume whole at the next owner, and is finished there by asking again;
//! so does one cut short after the owner's node put the drive in (the next
//! owner assembles from it), and a drive only listed as joining is not
//! replaced itself.

use std::sync::Arc;

use nvmf_target::AnaState;

use super::Agent;
use super::tests::{Pair, create_v, io, pair_with, wait};

/// The names and states of `v`'s members on `a`'s node.
async fn members(a: &Agent) -> Vec<(String, String)> {
    a.node
        .volume("v")
        .await
        .unwrap()
        .members
        .into_iter()
        .map(|m| (m.drive, m.state))
        .collect()
}

/// Whether `v`'s spec lists no drive as joining.
async fn none_joining(a: &Agent) -> bool {
    let s = a.session().spec("v").await.unwrap().unwrap();
    s.joining.is_empty()
}

/// Lists `drive` as joining `v`, as the owner `a`'s first step does.
async fn record_joining(a: &Agent, drive: &str) {
    let s = a.session();
    let epoch = s.owner("v").await.unwrap().unwrap().epoch;
    let before = s.spec("v").await.unwrap().unwrap();
    let mut cut = before.clone();
    cut.joining.push(a.node.cluster().resolve(drive).unwrap());
    s.update_spec(&before, &cut, epoch).await.unwrap();
}

async fn spec_drives(a: &Arc<Agent>) -> Vec<String> {
    let s = a.session().spec("v").await.unwrap().unwrap();
    a.names_of(&s.drives)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_member_is_recorded_and_assembled_by_the_next_owner() {
    let Some(Pair {
        etcd: _etcd,
        enc: _enc,
        a,
        ta,
        b,
        tb,
    }) = pair_with(6).await
    else {
        return;
    };
    let info = create_v(&a).await;
    let g = a.status().await.unwrap().volumes[0].ana_group;
    let ns = |t: &nvmf_target::Target| t.subsystem(super::tests::NQN)?.namespace(1);
    let na = ns(&ta).unwrap().dev.clone();
    io(&na, Some(0xC3)).await.unwrap();
    assert_eq!(spec_drives(&a).await, ["e1:d0", "e1:d1", "e1:d2"]);

    // Refused, nothing changed: the new drive is another member already, or
    // is not a remote drive.
    for with in ["e1:d2", "d9"] {
        assert!(b.replace_drive("e1:d1", with).await.is_err(), "{with}");
    }
    assert_eq!(spec_drives(&a).await, ["e1:d0", "e1:d1", "e1:d2"]);
    assert!(members(&a).await.iter().all(|(_, s)| s == "active"));
    // A drive of no cluster volume is left to the node.
    assert!(b.replace_drive("e1:d4", "e1:d3").await.unwrap().is_none());
    // The new drive held by a change under way (a create between its check
    // and its record): refused at the owner, nothing changed.
    let d3 = vec![b.node.cluster().resolve("e1:d3").unwrap()];
    let held = b.session().take_drives(&d3, "vother").await.unwrap();
    let e = b.replace_drive("e1:d1", "e1:d3").await.unwrap_err();
    assert!(
        e.to_string()
            .contains("being taken by a change of volume vother"),
        "{e}"
    );
    assert_eq!(spec_drives(&a).await, ["e1:d0", "e1:d1", "e1:d2"]);
    b.session().release_drives(&held).await.unwrap();

    // Asked of b, which does not own v: a replaces it and records it.
    let v = b.replace_drive("e1:d1", "e1:d3").await.unwrap().unwrap();
    assert_eq!(v.name, info.name);
    assert_eq!(v.owner.as_deref(), Some("a"));
    assert_eq!(spec_drives(&a).await, ["e1:d0", "e1:d3", "e1:d2"]);
    wait("a to rebuild e1:d3", 20, async || {
        members(&a).await.iter().all(|(_, s)| s == "active")
    })
    .await;
    let names: Vec<String> = members(&a).await.into_iter().map(|(d, _)| d).collect();
    assert_eq!(names, ["e1:d0", "e1:d3", "e1:d2"]);

    // Moved to b: b assembles v from the drives the spec names, every
    // member active (e1:d1 was wiped by the replace: had b opened it, the
    // volume would run degraded), and the data is there.
    a.move_volume("v", "b").await.unwrap();
    assert_eq!(tb.ana_state(g), AnaState::Optimized);
    let m = members(&b).await;
    assert_eq!(
        m,
        [
            ("e1:d0".to_string(), "active".to_string()),
            ("e1:d3".to_string(), "active".to_string()),
            ("e1:d2".to_string(), "active".to_string()),
        ]
    );
    let nb = ns(&tb).unwrap().dev.clone();
    assert_eq!(io(&nb, None).await.unwrap(), vec![0xC3; 16384]);
    assert!(none_joining(&b).await);

    // A replace cut short after its first step: the spec lists e1:d4 as
    // joining, and nothing was written to it.
    record_joining(&b, "e1:d4").await;
    // The cluster's status shows it, on any node.
    let st = a.status().await.unwrap();
    let v = st.volumes.iter().find(|v| v.name == "v").unwrap();
    assert_eq!(v.joining, [a.node.cluster().resolve("e1:d4").unwrap()]);
    // The next owner opens e1:d4 beside the members and leaves it out:
    // every position keeps its member.
    b.move_volume("v", "a").await.unwrap();
    assert_eq!(ta.ana_state(g), AnaState::Optimized);
    let m = members(&a).await;
    assert!(m.iter().all(|(_, s)| s == "active"), "{m:?}");
    assert_eq!(io(&na, None).await.unwrap(), vec![0xC3; 16384]);
    // Asked again, it is finished.
    a.replace_drive("e1:d3", "e1:d4").await.unwrap().unwrap();
    assert_eq!(spec_drives(&a).await, ["e1:d0", "e1:d4", "e1:d2"]);
    assert!(none_joining(&a).await);
    wait("a to rebuild e1:d4", 20, async || {
        members(&a).await.iter().all(|(_, s)| s == "active")
    })
    .await;
    assert_eq!(io(&na, None).await.unwrap(), vec![0xC3; 16384]);

    // Cut short after its second step: e1:d5 is listed as joining and the
    // owner's node put it in (its superblock claims position 1), but the
    // spec does not place it yet.
    record_joining(&a, "e1:d5").await;
    a.node.replace_drive("e1:d4", "e1:d5").await.unwrap();
    io(&na, Some(0xD4)).await.unwrap();
    // A drive only listed as joining is not replaced itself: that would
    // leave its position to no record.
    let e = b.replace_drive("e1:d5", "e1:d3").await.unwrap_err();
    assert!(e.to_string().contains("joining"), "{e}");
    // The next owner assembles position 1 from e1:d5, the newest claim.
    a.move_volume("v", "b").await.unwrap();
    assert_eq!(tb.ana_state(g), AnaState::Optimized);
    wait("b to finish e1:d5's rebuild", 20, async || {
        members(&b).await.iter().all(|(_, s)| s == "active")
    })
    .await;
    let names: Vec<String> = members(&b).await.into_iter().map(|(d, _)| d).collect();
    assert_eq!(names, ["e1:d0", "e1:d5", "e1:d2"]);
    assert_eq!(io(&nb, None).await.unwrap(), vec![0xD4; 16384]);
    // Asked again, only the record is left to do.
    b.replace_drive("e1:d4", "e1:d5").await.unwrap().unwrap();
    assert_eq!(spec_drives(&b).await, ["e1:d0", "e1:d5", "e1:d2"]);
    assert!(none_joining(&b).await);
}
