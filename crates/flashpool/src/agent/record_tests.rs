//! The owner's member-state record in etcd (`record.rs`) and a takeover
//! that cannot run (`node/degraded.rs`): two nodes, a real etcd, one
//! enclosure.

use super::tests::{Pair, create_v, events_of, pair, wait};

/// The record follows a member failure before the failure's write is
/// acknowledged; with the enclosure gone and the owner dead, the survivor
/// cannot run the volume: it says so (event, `cluster status` note) and
/// leaves it unowned, claiming nothing on the drives; when the enclosure
/// is back, it takes the volume over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_follows_member_failures_and_a_takeover_that_cannot_run_says_why() {
    let Some(Pair {
        etcd: _etcd,
        mut enc,
        a,
        ta: _,
        b,
        tb,
    }) = pair().await
    else {
        return;
    };
    create_v(&a).await;
    let s = a.session();
    let st = s.state("v").await.unwrap().expect("recorded at create");
    assert_eq!(st.members, ["active", "active", "active"]);
    assert!(st.serving, "recorded as served once Optimized: {st:?}");
    a.node.fail_drive("e1:d1", false).await.unwrap();
    // recorded before the call returned
    let st = s.state("v").await.unwrap().unwrap();
    assert_eq!(st.members, ["active", "failed", "active"], "{st:?}");
    assert!(st.serving);
    let info = a.node.volume("v").await.unwrap();
    assert_eq!(st.generation, info.generation, "{st:?} {info:?}");
    // `volume show v` on the standby answers as `volume list` does there.
    wait("b to serve v on standby", 10, async || {
        tb.subsystem(super::tests::NQN)
            .and_then(|s| s.namespace(1))
            .is_some()
    })
    .await;
    let api = b.record.api.clone().expect("member() gives an API");
    let shown = tokio::task::spawn_blocking(move || {
        let c = crate::client::Client::new(&crate::client::Endpoint {
            api,
            ..Default::default()
        })
        .unwrap();
        c.get("/volumes/v")
            .unwrap()
            .parse::<crate::node::VolumeInfo>()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(shown.state, "standby", "{shown:?}");
    assert_eq!(shown.owner.as_deref(), Some("a"));
    assert_eq!(shown.members[1].state, "failed", "as the owner recorded");

    // The enclosure goes, then the owner: b claims v but reaches no member.
    enc.stop();
    a.leaving.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(b.session().revoke_node("a").await.unwrap());
    wait("b's takeover_failed event", 20, async || {
        !events_of(&b, "takeover_failed", Some("v")).is_empty()
    })
    .await;
    let e = events_of(&b, "takeover_failed", Some("v"));
    assert_eq!(&*e[0].severity, "critical");
    assert!(e[0].message.contains("e1:d0"), "{e:?}");
    let status = b.status().await.unwrap();
    let v = &status.volumes[0];
    assert_eq!(v.owner, None, "{v:?}");
    let note = v.note.clone().unwrap_or_default();
    assert!(note.contains("could not run it"), "{note}");
    // the record's members and generation are kept
    let st2 = b.session().state("v").await.unwrap().unwrap();
    assert_eq!(st2.members, st.members);
    assert_eq!(st2.generation, st.generation);

    // Back: b takes it over (degraded: e1:d1 was failed) and serves it.
    enc.start();
    let g = v.ana_group;
    wait("b to own v", 30, async || {
        tb.ana_state(g) == nvmf_target::AnaState::Optimized
    })
    .await;
    let st3 = b.session().state("v").await.unwrap().unwrap();
    assert_eq!(st3.members[1], "failed", "{st3:?}");
}
