//! Encrypted volumes on a node: made with `encrypt`, their members' files
//! hold no plaintext, they come back after a restart with the node's KEK
//! (and stay offline, saying why, without it), the KEK rotates without
//! rewriting data, and a delete destroys the key.

use std::path::Path;
use std::sync::Arc;

use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest};

use super::testing::{TestNode, volume};
use super::tests::{io, tempdir};
use super::{DriveSpec, Node};

const MIB: u64 = 1 << 20;
const PATTERN: &[u8] = b"<<flashpool plaintext pattern 0123456789>>";

fn file_drives(dir: &Path, n: usize) -> Vec<DriveSpec> {
    (0..n)
        .map(|i| DriveSpec {
            name: format!("f{i}"),
            backend: "file".into(),
            size: Some(8 * MIB),
            path: Some(dir.join(format!("f{i}.img"))),
            create: true,
            block_size: 4096,
            ..Default::default()
        })
        .collect()
}

fn node(specs: &[DriveSpec], state: &Path) -> Arc<Node> {
    TestNode::new().drives(specs).state_dir(Some(state)).build()
}

async fn dev_of(node: &Node, name: &str) -> Arc<dyn BlockDevice> {
    node.state.lock().await.volumes[name].device()
}

fn block(lba: u64) -> Vec<u8> {
    let mut b: Vec<u8> = PATTERN.iter().copied().cycle().take(4096).collect();
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b
}

const LBAS: [u64; 4] = [0, 1, 77, 1000];

async fn write_pattern(dev: &dyn BlockDevice) {
    for l in LBAS {
        io(dev, BlockOp::Write { fua: false }, l, Some(&block(l))).await;
    }
    dev.submit(IoRequest {
        op: BlockOp::Flush,
        lba: 0,
        blocks: 0,
        buf: AlignedBuf::empty(),
    })
    .await
    .result
    .unwrap();
}

async fn check_pattern(dev: &dyn BlockDevice) {
    for l in LBAS {
        assert_eq!(io(dev, BlockOp::Read, l, None).await, block(l), "lba {l}");
    }
}

fn file_holds(path: &Path, needle: &[u8]) -> bool {
    let b = std::fs::read(path).unwrap();
    b.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_volume_on_file_drives_end_to_end() {
    let dir = tempdir();
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let specs = file_drives(&dir, 5);
    {
        let n = node(&specs, &state);
        let mut r = volume("sec", "raid5", &["f0", "f1", "f2"]);
        r.encrypt = true;
        let info = n.create_volume(r).await.unwrap();
        assert!(info.encrypted);
        // The control: the same pattern on an unencrypted volume is found,
        // so the scan below would see plaintext if it were there.
        let plain = n
            .create_volume(volume("plain", "raid1", &["f3", "f4"]))
            .await
            .unwrap();
        assert!(!plain.encrypted);
        write_pattern(&*dev_of(&n, "sec").await).await;
        write_pattern(&*dev_of(&n, "plain").await).await;
        check_pattern(&*dev_of(&n, "sec").await).await;
        n.shutdown().await;
    }
    for i in 0..3 {
        assert!(
            !file_holds(&dir.join(format!("f{i}.img")), PATTERN),
            "plaintext in member file f{i}"
        );
    }
    assert!(
        file_holds(&dir.join("f3.img"), PATTERN),
        "control: plaintext"
    );
    // The KEK file: made at first start, 0600, no volume key in the log or files.
    {
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::metadata(state.join("kek")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
    }

    // Another node (another KEK): the volume stays offline and says why.
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    {
        let n = node(&specs, &other);
        n.assemble_found(&[]).await.unwrap();
        let v = n.volume("sec").await.unwrap();
        assert_eq!(v.state, "offline");
        let why = v.reason.unwrap();
        assert!(why.contains("key-encryption key"), "{why}");
        n.shutdown().await;
    }

    // Its own KEK: assembled, the data is back.
    {
        let n = node(&specs, &state);
        n.assemble_found(&[]).await.unwrap();
        let v = n.volume("sec").await.unwrap();
        assert_eq!(v.state, "optimal");
        assert!(v.encrypted);
        check_pattern(&*dev_of(&n, "sec").await).await;
        assert!(
            n.metrics()
                .await
                .contains("flashpool_volume_encrypted{volume=\"sec\"} 1"),
            "the metric says the volume is encrypted"
        );
        // Rotation rewraps the key; the data stays as it is.
        let before = std::fs::read(state.join("kek")).unwrap();
        let r = n.rotate_kek().await.unwrap();
        assert_eq!(r.rewrapped, ["sec"]);
        let said: Vec<_> = n
            .events
            .recent()
            .into_iter()
            .filter(|e| e.kind == crate::events::EventKind::KekRotated)
            .collect();
        assert_eq!(said.len(), 1, "one kek_rotated event");
        assert!(said[0].message.contains(&r.kek_id), "{}", said[0].message);
        assert_ne!(std::fs::read(state.join("kek")).unwrap(), before);
        assert!(!state.join("kek.next").exists());
        check_pattern(&*dev_of(&n, "sec").await).await;
        n.shutdown().await;
    }
    {
        let n = node(&specs, &state);
        n.assemble_found(&[]).await.unwrap();
        check_pattern(&*dev_of(&n, "sec").await).await;
        // Delete: the superblocks, the only copies of the wrapped key, go.
        n.delete_volume("sec", true).await.unwrap();
        n.shutdown().await;
    }
    {
        let n = node(&specs, &state);
        n.assemble_found(&[]).await.unwrap();
        assert!(
            n.volume("sec").await.is_err(),
            "crypto-erased: nothing to assemble"
        );
        n.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thin_volume_is_encrypted_with_its_pool() {
    let dir = tempdir();
    let n = TestNode::new()
        .mem_drives(4, 32 * MIB)
        .state_dir(Some(&dir))
        .build();
    let mut p = volume("pool", "raid1", &["d0", "d1"]);
    p.thin_pool = true;
    p.encrypt = true;
    n.create_volume(p).await.unwrap();
    let mut plain = volume("plainpool", "raid1", &["d2", "d3"]);
    plain.thin_pool = true;
    n.create_volume(plain).await.unwrap();
    let thin = |pool: &str, name: &str| {
        let mut t = volume(name, "x", &[]);
        t.layout = None;
        t.pool = Some(pool.into());
        t.size = Some("16MiB".into());
        t.encrypt = true;
        t
    };
    let t = n.create_volume(thin("pool", "t1")).await.unwrap();
    assert!(t.encrypted);
    write_pattern(&*dev_of(&n, "t1").await).await;
    check_pattern(&*dev_of(&n, "t1").await).await;
    let e = n.create_volume(thin("plainpool", "t2")).await.unwrap_err();
    assert!(e.to_string().contains("is not encrypted"), "{e}");
    n.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypt_without_a_kek_is_refused_and_changes_nothing() {
    let n = TestNode::new().mem_drives(2, 16 * MIB).build();
    let mut r = volume("v", "raid1", &["d0", "d1"]);
    r.encrypt = true;
    let e = n.create_volume(r).await.unwrap_err();
    assert!(e.to_string().contains("kek_file"), "{e}");
    assert!(n.volume("v").await.is_err());
    assert_eq!(n.drive("d0").await.unwrap().state, "free");
    n.shutdown().await;
}
