//! Drives taken for a change in progress (`drive-claims/`) against a real
//! etcd: all or none, the first taken by another change named, taken again
//! by its own retry, left to another change by a release that is not its
//! own, and gone with the taker's lease.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drive_is_taken_by_one_change_at_a_time() {
    let Some((etcd, a, b)) = two().await else {
        return;
    };
    let ep = etcd.endpoint();
    a.take_drives(&urls(&["nvme://e1/d0", "nvme://e2/d0"]), "v1")
        .await
        .unwrap();
    // Another change that needs one of them takes none.
    let r = b
        .take_drives(&urls(&["nvme://e3/d0", "nvme://e2/d0"]), "v2")
        .await;
    match r {
        Err(ClusterError::DriveTaken { drive, by, node }) => {
            assert_eq!(
                (drive.as_str(), by.as_str(), node.as_str()),
                ("nvme://e2/d0", "v1", "a")
            );
        }
        r => panic!("{r:?}"),
    }
    assert_eq!(claims(&ep).await.len(), 2);
    // The same change again (a retry) takes them again; another change of
    // this node does not.
    a.take_drives(&urls(&["nvme://e1/d0", "nvme://e2/d0"]), "v1")
        .await
        .unwrap();
    // A retry that needs one more drive takes it too.
    a.take_drives(
        &urls(&["nvme://e1/d0", "nvme://e4/d0", "nvme://e2/d0"]),
        "v1",
    )
    .await
    .unwrap();
    assert_eq!(claims(&ep).await.len(), 3);
    a.release_drives(&urls(&["nvme://e4/d0"]), "v1")
        .await
        .unwrap();
    assert!(matches!(
        a.take_drives(&urls(&["nvme://e1/d0"]), "v3").await,
        Err(ClusterError::DriveTaken { .. })
    ));
    // A release that is not the holder's leaves the drive taken.
    b.release_drives(&urls(&["nvme://e2/d0"]), "v2")
        .await
        .unwrap();
    assert_eq!(claims(&ep).await.len(), 2);
    a.release_drives(&urls(&["nvme://e1/d0", "nvme://e2/d0"]), "v1")
        .await
        .unwrap();
    assert!(claims(&ep).await.is_empty());
    b.take_drives(&urls(&["nvme://e3/d0", "nvme://e2/d0"]), "v2")
        .await
        .unwrap();
    // The taker's lease gone (its node died mid-change): so are its drives.
    assert!(a.revoke_node("b").await.unwrap());
    assert!(claims(&ep).await.is_empty());
    a.take_drives(&urls(&["nvme://e2/d0"]), "v1").await.unwrap();
}
