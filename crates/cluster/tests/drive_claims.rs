//! Drives taken for a change in progress (`drive-claims/`) against a real
//! etcd: all or none, the first taken by another change named (another
//! change of the same volume on the same node too), a drive listed twice
//! taken once, let go only by its own take, and gone with the taker's
//! lease.

use cluster::ClusterError;
use cluster::testing::keys_under;

mod common;
use common::two;

fn urls(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

async fn claims(ep: &str) -> Vec<(String, String)> {
    keys_under(ep, "/flashpool/t/drive-claims/").await.unwrap()
}

fn taken_by(r: Result<cluster::DriveTake, ClusterError>) -> (String, String, String) {
    match r {
        Err(ClusterError::DriveTaken { drive, by, node }) => (drive, by, node),
        r => panic!("{r:?}"),
    }
}

fn t(a: &str, b: &str, c: &str) -> (String, String, String) {
    (a.into(), b.into(), c.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drive_is_taken_by_one_change_at_a_time() {
    let Some((etcd, a, b)) = two().await else {
        return;
    };
    let ep = etcd.endpoint();
    // listed twice: taken once (a transaction may not name a key twice)
    let v1 = a
        .take_drives(
            &urls(&["nvme://e1/d0", "nvme://e2/d0", "nvme://e1/d0"]),
            "v1",
        )
        .await
        .unwrap();
    assert_eq!(claims(&ep).await.len(), 2);
    // Another change that needs one of them takes none.
    let r = b
        .take_drives(&urls(&["nvme://e3/d0", "nvme://e2/d0"]), "v2")
        .await;
    assert_eq!(taken_by(r), t("nvme://e2/d0", "v1", "a"));
    assert_eq!(claims(&ep).await.len(), 2);
    // Nor does a second change of the same volume on the same node (a
    // client's retry while the first runs): its release would let go of
    // the first's drives.
    let r = a.take_drives(&urls(&["nvme://e1/d0"]), "v1").await;
    assert_eq!(taken_by(r), t("nvme://e1/d0", "v1", "a"));
    // A release of another take leaves them taken.
    let v2 = b.take_drives(&urls(&["nvme://e3/d0"]), "v2").await.unwrap();
    assert_eq!(claims(&ep).await.len(), 3);
    let v1_again = a.take_drives(&urls(&["nvme://e4/d0"]), "v1").await.unwrap();
    a.release_drives(&v1_again).await.unwrap();
    assert_eq!(claims(&ep).await.len(), 3);
    a.release_drives(&v1).await.unwrap();
    assert_eq!(claims(&ep).await.len(), 1);
    b.take_drives(&urls(&["nvme://e1/d0", "nvme://e2/d0"]), "v2")
        .await
        .unwrap();
    b.release_drives(&v2).await.unwrap();
    assert_eq!(claims(&ep).await.len(), 2);
    // The taker's lease gone (its node died mid-change): so are its drives.
    assert!(a.revoke_node("b").await.unwrap());
    assert!(claims(&ep).await.is_empty());
    a.take_drives(&urls(&["nvme://e2/d0"]), "v1").await.unwrap();
}
