//! A cluster delete whose last step (removing the record from etcd) fails
//! after the drives were wiped: the record stays, marked deleting; no node
//! serves or takes the volume over, and a delete on any node finishes it
//! (not on another node while its owner lives). And the drives a create
//! may take meanwhile: none that a record names or another change holds.

use std::sync::Arc;

use blockdev::BlockDevice;
use volume::superblock::Superblock;

use super::Agent;
use super::lifecycle::FAIL_ETCD_DELETE;
use super::tests::{NQN, pair, wait};
use crate::node::{CreateVolume, ExportRequest, NodeError};

const NAME: &str = "vdel";
/// The second test's volume: the failing list is shared by the tests.
const NAME2: &str = "vdel2";
const NAME3: &str = "vdel3";

async fn create(a: &Arc<Agent>, name: &str, drives: &[&str]) -> Result<(), NodeError> {
    create_at(a, name, drives, 1).await
}

async fn create_at(
    a: &Arc<Agent>,
    name: &str,
    drives: &[&str],
    nsid: u32,
) -> Result<(), NodeError> {
    let export = Some(ExportRequest {
        nqn: NQN.into(),
        nsid,
    });
    let req = CreateVolume {
        export,
        ..crate::node::testing::volume(name, "raid1", drives)
    };
    a.create(req).await.map(|_| ())
}

fn serves(t: &nvmf_target::Target) -> bool {
    t.subsystem(NQN).and_then(|s| s.namespace(1)).is_some()
}

/// The first 4 KiB of drive `d` (`e1:d0`), read through a new link.
async fn head_of(a: &Arc<Agent>, d: &str) -> Vec<u8> {
    let url = a.node.cluster().resolve(d).unwrap();
    let dev: Arc<dyn BlockDevice> = a.node.dial(&url).await.unwrap();
    crate::node::read_head(&dev).await.unwrap()
}

async fn state(a: &Arc<Agent>, name: &str) -> Option<String> {
    let st = a.status().await.unwrap();
    st.volumes
        .into_iter()
        .find(|v| v.name == name)
        .map(|v| v.state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_cut_short_after_the_wipe_is_finished_by_a_retry() {
    let Some(p) = pair().await else {
        return;
    };
    let (a, ta, b, tb) = (&p.a, &p.ta, &p.b, &p.tb);
    create(a, NAME, &["e1:d0", "e1:d1"]).await.unwrap();
    wait("b to serve vdel on standby", 10, async || serves(tb)).await;

    FAIL_ETCD_DELETE.lock().push(NAME.into());
    let e = a.delete(NAME, true).await.unwrap_err();
    FAIL_ETCD_DELETE.lock().retain(|n| n != NAME);
    assert!(
        matches!(&e, NodeError::Unavailable(m) if m.contains("stays marked deleting")),
        "{e}"
    );
    // Before the fix a retry answered "no volume" for ever, and another
    // node could take over a volume whose drives were wiped.
    assert_eq!(state(a, NAME).await.as_deref(), Some("deleting"));
    assert!(!serves(ta));
    wait("b to stop serving vdel", 10, async || !serves(tb)).await;
    // a still lives and owns it: b leaves it to a.
    let e = b.delete(NAME, true).await.unwrap_err();
    assert!(
        matches!(&e, NodeError::Conflict(m) if m.contains("being deleted by node a")),
        "{e}"
    );
    let e = b.move_volume(NAME, "b").await.unwrap_err();
    assert!(
        matches!(&e, NodeError::Conflict(m) if m.contains("being deleted")),
        "{e}"
    );

    // Its owner gone, no node claims it (its drives were wiped), and any
    // node finishes its delete; the drives are free again.
    a.leave().await;
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    assert_eq!(b.session().owner(NAME).await.unwrap(), None);
    assert_eq!(state(b, NAME).await.as_deref(), Some("deleting"));
    // Its drives stay taken while its record names them (no reservation
    // guards them any more: the delete wiped them and let go).
    // Before the check, this create wrote its superblocks there.
    let e = create_at(b, "vnew", &["e1:d2", "e1:d1"], 2)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, NodeError::Conflict(m) if m.contains("drive") && m.contains("is a member of vdel")),
        "{e}"
    );
    assert_eq!(
        state(b, "vnew").await,
        None,
        "a refused create changes nothing"
    );
    b.delete(NAME, true).await.unwrap().expect("found");
    assert_eq!(state(b, NAME).await, None);
    create(b, NAME, &["e1:d0", "e1:d1"]).await.unwrap();
    assert_eq!(state(b, NAME).await.as_deref(), Some("optimal"));
    b.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn its_owner_finishes_a_delete_cut_short() {
    let Some(p) = pair().await else {
        return;
    };
    let (a, b) = (&p.a, &p.b);
    create(a, NAME2, &["e1:d0", "e1:d1"]).await.unwrap();
    FAIL_ETCD_DELETE.lock().push(NAME2.into());
    assert!(a.delete(NAME2, true).await.is_err());
    FAIL_ETCD_DELETE.lock().retain(|n| n != NAME2);
    a.delete(NAME2, false).await.unwrap().expect("found");
    assert_eq!(state(a, NAME2).await, None);
    assert_eq!(state(b, NAME2).await, None);
    a.leave().await;
    b.leave().await;
}

/// The owner marked the delete and stopped before it wiped the drives: the
/// node that finishes the delete wipes them, taking its reservation over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_whose_owner_stopped_before_the_wipe_is_wiped_where_it_is_finished() {
    let Some(p) = pair().await else {
        return;
    };
    let (a, b, tb) = (&p.a, &p.b, &p.tb);
    create(a, NAME3, &["e1:d0", "e1:d1"]).await.unwrap();
    wait("b to serve vdel3 on standby", 10, async || serves(tb)).await;
    // What `Agent::delete` does first, then the owner is gone.
    let s = a.session();
    let spec = s.spec(NAME3).await.unwrap().expect("recorded");
    let epoch = s.owner(NAME3).await.unwrap().expect("owned").epoch;
    s.mark_deleting(&spec, epoch).await.unwrap();
    a.leave().await;
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    assert_eq!(b.session().owner(NAME3).await.unwrap(), None);

    // A change under way holds one of its drives: the finish wipes
    // nothing and leaves the record, marked, for a retry.
    let d1 = vec![b.node.cluster().resolve("e1:d1").unwrap()];
    let held = b.session().take_drives(&d1, "vother").await.unwrap();
    let e = b.delete(NAME3, true).await.unwrap_err();
    assert!(
        matches!(&e, NodeError::Conflict(m) if m.contains("being taken by a change of volume vother")),
        "{e}"
    );
    assert_eq!(state(b, NAME3).await.as_deref(), Some("deleting"));
    for d in ["e1:d0", "e1:d1"] {
        assert!(
            Superblock::decode(&head_of(b, d).await).is_ok(),
            "{d} wiped"
        );
    }
    b.session().release_drives(&held).await.unwrap();

    b.delete(NAME3, true).await.unwrap().expect("found");
    assert_eq!(state(b, NAME3).await, None);
    for d in ["e1:d0", "e1:d1"] {
        let head = head_of(b, d).await;
        assert!(
            Superblock::decode(&head).is_err(),
            "{d} still holds vdel3's superblock"
        );
    }
    // Before, the drives kept a's reservation (and vdel3's superblocks):
    // this create was refused, "reserved by another node".
    create(b, "vnew3", &["e1:d0", "e1:d1"]).await.unwrap();
    assert_eq!(state(b, "vnew3").await.as_deref(), Some("optimal"));
    b.leave().await;
}

/// A drive that another node has taken for a change under way (a create
/// between its check and its record) is refused, and the refused create
/// changes nothing; once it is let go, the create goes through, and lets
/// go of its own drives once its record names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_meets_a_drive_taken_by_a_change_on_another_node() {
    let Some(p) = pair().await else {
        return;
    };
    let (a, b) = (&p.a, &p.b);
    let claims = async || {
        cluster::testing::keys_under(&p.etcd.endpoint(), "/flashpool/")
            .await
            .unwrap()
            .into_iter()
            .filter(|(k, _)| k.contains("/drive-claims/"))
            .map(|(_, v)| v)
            .collect::<Vec<_>>()
    };
    let d1 = vec![a.node.cluster().resolve("e1:d1").unwrap()];
    let held = b.session().take_drives(&d1, "vother").await.unwrap();
    // Before the drives were taken in etcd, both creates could pass the
    // check of the records and write their superblocks over each other.
    let e = create(a, "vdel4", &["e1:d0", "e1:d1"]).await.unwrap_err();
    assert!(
        matches!(&e, NodeError::Conflict(m) if m.contains("being taken by a change of volume vother on node b")),
        "{e}"
    );
    assert_eq!(
        state(a, "vdel4").await,
        None,
        "a refused create changes nothing"
    );
    assert_eq!(a.session().spec("vdel4").await.unwrap(), None);
    let held_by: Vec<String> = claims().await;
    assert!(
        held_by.len() == 1 && held_by[0].starts_with("vother@b#"),
        "{held_by:?}"
    );
    b.session().release_drives(&held).await.unwrap();
    create(a, "vdel4", &["e1:d0", "e1:d1"]).await.unwrap();
    assert_eq!(state(a, "vdel4").await.as_deref(), Some("optimal"));
    // Let go before the answer: a retry right after it does not meet them.
    assert!(claims().await.is_empty());
    // Now the record keeps them.
    let e = create_at(b, "vnew3", &["e1:d2", "e1:d1"], 2)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, NodeError::Conflict(m) if m.contains("is a member of vdel4")),
        "{e}"
    );
    assert!(
        claims().await.is_empty(),
        "a refused create lets go before it answers"
    );
    // A drive listed twice is the request's mistake (400), not etcd's.
    let e = create_at(b, "vdup", &["e1:d2", "e1:d2"], 3)
        .await
        .unwrap_err();
    assert!(matches!(&e, NodeError::BadRequest(_)), "{e}");
    assert!(claims().await.is_empty());
    a.leave().await;
    b.leave().await;
}
