//! A cluster pool's extents (`pool expand`) against a real etcd: the spec
//! that lists them and each extent's member-state record are written only
//! by the pool's owner at its epoch, the spec only over the one read; a
//! refusal writes nothing; the pool's delete takes the records with it; a
//! spec in an older version's encoding is updated all the same.

use cluster::testing::{keys_under, put_raw};
use cluster::{ClusterError, ExtentSpec, VolumeState};

mod common;
use common::{spec, two};

fn state(epoch: u64, members: &[&str]) -> VolumeState {
    VolumeState {
        epoch,
        generation: 1,
        members: members.iter().map(|m| m.to_string()).collect(),
        note: String::new(),
        serving: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_pools_owner_records_its_extents() {
    let Some((etcd, a, b)) = two().await else {
        return;
    };
    let p0 = spec("p", 2, true);
    a.create_spec(&p0).await.unwrap();
    let own = a.claim("p").await.unwrap().unwrap();
    let mut p1 = p0.clone();
    p1.extents.push(ExtentSpec {
        name: "p-x1".into(),
        drives: vec!["nvme://b/1".into(), "nvme://c/1".into()],
        joining: Vec::new(),
        layout: "raid1".into(),
    });

    // Refused, writing nothing: not the owner, another epoch, a spec that
    // is not the one read.
    for r in [
        b.update_spec(&p0, &p1, own.epoch).await,
        a.update_spec(&p0, &p1, own.epoch + 1).await,
        a.update_spec(&p1, &p1, own.epoch).await,
    ] {
        assert!(matches!(r, Err(ClusterError::Deposed { .. })), "{r:?}");
    }
    assert_eq!(b.spec("p").await.unwrap().unwrap(), p0);
    assert!(matches!(
        b.put_extent_state("p", "p-x1", &state(own.epoch, &["active"]))
            .await,
        Err(ClusterError::Deposed { .. })
    ));
    assert_eq!(a.extent_state("p", "p-x1").await.unwrap(), None);

    // The owner's: read back by every node.
    a.update_spec(&p0, &p1, own.epoch).await.unwrap();
    assert_eq!(b.spec("p").await.unwrap().unwrap().extents, p1.extents);
    let st = state(own.epoch, &["active", "failed"]);
    a.put_extent_state("p", "p-x1", &st).await.unwrap();
    assert_eq!(b.extent_state("p", "p-x1").await.unwrap(), Some(st));

    // A new owner's epoch: the old one's records are refused.
    assert!(a.release("p", own.epoch).await.unwrap());
    let own_b = b.claim("p").await.unwrap().unwrap();
    assert!(matches!(
        a.put_extent_state("p", "p-x1", &state(own.epoch, &["active", "active"]))
            .await,
        Err(ClusterError::Deposed { .. })
    ));
    b.put_extent_state("p", "p-x1", &state(own_b.epoch, &["active", "active"]))
        .await
        .unwrap();

    // The pool's delete takes its extents' records.
    b.delete_volume("p", own_b.epoch).await.unwrap();
    let left = keys_under(&etcd.endpoint(), "/flashpool/t/volumes/")
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_in_an_older_encoding_is_updated() {
    let Some((etcd, a, b)) = two().await else {
        return;
    };
    let v0 = spec("v", 2, false);
    a.create_spec(&v0).await.unwrap();
    let own = a.claim("v").await.unwrap().unwrap();
    // As a version before `thin_pool` wrote it: the same spec, other bytes.
    let key = "/flashpool/t/volumes/v/spec";
    let (_, stored) = keys_under(&etcd.endpoint(), key).await.unwrap().remove(0);
    let mut old: serde_json::Value = serde_json::from_str(&stored).unwrap();
    assert!(old.as_object_mut().unwrap().remove("thin_pool").is_some());
    put_raw(&etcd.endpoint(), key, &old.to_string())
        .await
        .unwrap();
    assert_eq!(b.spec("v").await.unwrap().unwrap(), v0);

    let mut v1 = v0.clone();
    v1.drives[0] = "nvme://c/9".into();
    a.update_spec(&v0, &v1, own.epoch).await.unwrap();
    assert_eq!(b.spec("v").await.unwrap().unwrap(), v1);
    // Still one update over the one read: the old spec is refused now.
    let r = a.update_spec(&v0, &v1, own.epoch).await;
    assert!(matches!(r, Err(ClusterError::Deposed { .. })), "{r:?}");
}
