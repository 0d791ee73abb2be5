//! Volumes on other nodes' drives, in one process: an enclosure (a target
//! exporting RAM drives as `nqn...:drive:e1:dN`) on 127.0.0.1, and owner
//! nodes whose volumes use those drives over NVMe/TCP.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use blockdev::{
    AlignedBuf, BlockDevice, BlockError, BlockOp, Geometry, IoFuture, IoRequest, MemDevice,
};
use nvmf_host::ResvType;
use nvmf_host::remote::{RemoteDevice, RemoteOptions};
use nvmf_target::{
    ListenerConfig, ListenerKind, Namespace, Server, Subsystem, Target, TransportConfig,
};

use super::*;
use crate::node::identity::{Cluster, Peer, RemoteSettings, drive_nqn, node_host_nqn, stable_id};

const NQN: &str = "nqn.2026-01.io.flashpool:test";
const DRIVE_BYTES: u64 = 16 << 20;

/// A RAM drive that counts the writes it takes once armed.
struct Counting {
    dev: MemDevice,
    armed: AtomicBool,
    writes: AtomicU64,
}

impl BlockDevice for Counting {
    fn geometry(&self) -> Geometry {
        self.dev.geometry()
    }
    fn submit(&self, req: IoRequest) -> IoFuture {
        if matches!(
            req.op,
            BlockOp::Write { .. } | BlockOp::WriteZeroes | BlockOp::Deallocate
        ) && self.armed.load(Ordering::SeqCst)
        {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        self.dev.submit(req)
    }
    fn deallocate_reads_zeroes(&self) -> bool {
        self.dev.deallocate_reads_zeroes()
    }
    fn describe(&self) -> String {
        "counting mem".into()
    }
}

/// A node that exports `n` RAM drives, and can be stopped and started again
/// on the same port with the same drives (a node process killed and restarted).
pub(crate) struct Enclosure {
    pub(crate) name: String,
    drives: Vec<Arc<Counting>>,
    hosts: Vec<String>,
    pub(crate) addr: SocketAddr,
    server: Option<Server>,
}

impl Enclosure {
    pub(crate) fn new(name: &str, n: usize, hosts: &[String]) -> Enclosure {
        let drives = (0..n)
            .map(|_| {
                Arc::new(Counting {
                    dev: MemDevice::new(DRIVE_BYTES, 4096).unwrap(),
                    armed: AtomicBool::new(false),
                    writes: AtomicU64::new(0),
                })
            })
            .collect();
        let mut e = Enclosure {
            name: name.into(),
            drives,
            hosts: hosts.to_vec(),
            addr: "127.0.0.1:0".parse().unwrap(),
            server: None,
        };
        e.start();
        e
    }

    pub(crate) fn start(&mut self) {
        let subs = self
            .drives
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let id = [i as u8 + 1; 16];
                Arc::new(Subsystem::new(
                    drive_nqn(&self.name, &format!("d{i}")),
                    format!("{}-d{i}", self.name),
                    "flashpool drive".into(),
                    false,
                    self.hosts.clone(),
                    vec![Namespace::new(1, d.clone(), id, id)],
                ))
            })
            .collect();
        let target = Arc::new(Target::new(TransportConfig::default(), subs));
        let server = Server::start(
            target,
            &[ListenerConfig {
                addr: self.addr,
                kind: ListenerKind::Io,
                tls: nvmf_target::TlsMode::None,
            }],
        )
        .unwrap();
        self.addr = server.local_addrs()[0].0;
        self.server = Some(server);
    }

    pub(crate) fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }

    pub(super) fn arm(&self) {
        for d in &self.drives {
            d.armed.store(true, Ordering::SeqCst);
        }
    }

    fn writes(&self) -> u64 {
        self.drives
            .iter()
            .map(|d| d.writes.load(Ordering::SeqCst))
            .sum()
    }
}

impl Drop for Enclosure {
    fn drop(&mut self) {
        self.stop();
    }
}

pub(crate) fn settings() -> RemoteSettings {
    RemoteSettings {
        fail_after: Duration::from_millis(1500),
        io_timeout: Duration::from_secs(3),
        kato_ms: 1000,
        queues: 2,
        queue_depth: 32,
        takeover_wait: Duration::from_millis(500),
        standby_links: RemoteSettings::DEFAULT_STANDBY_LINKS,
        reactor_queues: true,
    }
}

pub(crate) fn owner(name: &str, enc: &Enclosure) -> Arc<Node> {
    owner_in(name, enc, None)
}

fn owner_in(name: &str, enc: &Enclosure, dir: Option<&std::path::Path>) -> Arc<Node> {
    let host_nqn = node_host_nqn(name);
    let cluster = Cluster {
        node_name: name.into(),
        host_id: stable_id(&host_nqn),
        host_nqn,
        peers: vec![Peer {
            name: enc.name.clone(),
            addr: Some(enc.addr),
            host_nqn: node_host_nqn(&enc.name),
            auth: None,
            tls: None,
        }],
        remote: settings(),
        dhchap: None,
        tls: None,
    };
    super::testing::TestNode::new()
        .state_dir(dir)
        .cluster(cluster)
        .target(NQN)
        .build()
}

/// A volume exported as namespace 1 of the test subsystem.
pub(crate) fn create(name: &str, layout: &str, drives: &[&str]) -> CreateVolume {
    CreateVolume {
        export: Some(ExportRequest {
            nqn: NQN.into(),
            nsid: 1,
        }),
        ..super::testing::volume(name, layout, drives)
    }
}

pub(super) fn served(node: &Node) -> Arc<dyn BlockDevice> {
    node.target()
        .unwrap()
        .subsystem(NQN)
        .unwrap()
        .namespace(1)
        .expect("exported")
        .dev
}

pub(super) fn stamp(lba: u64, seq: u64) -> AlignedBuf {
    let mut b = AlignedBuf::new(4096);
    b.set_len(4096);
    for (i, w) in b.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&(lba.rotate_left(17) ^ seq ^ (i as u64 * 0x9E37)).to_le_bytes());
    }
    b
}

pub(super) async fn write(dev: &dyn BlockDevice, lba: u64, seq: u64) -> Result<(), BlockError> {
    dev.submit(IoRequest {
        op: BlockOp::Write { fua: false },
        lba,
        blocks: 1,
        buf: stamp(lba, seq),
    })
    .await
    .result
}

pub(super) async fn read(dev: &dyn BlockDevice, lba: u64) -> Result<AlignedBuf, BlockError> {
    let mut b = AlignedBuf::new(4096);
    b.set_len(4096);
    let done = dev
        .submit(IoRequest {
            op: BlockOp::Read,
            lba,
            blocks: 1,
            buf: b,
        })
        .await;
    done.result.map(|_| done.buf)
}

pub(super) async fn wait_for(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) {
    let t = Instant::now();
    while !f().await {
        assert!(t.elapsed() < limit, "{what}: not after {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn hosts(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| node_host_nqn(n)).collect()
}

/// Node B preempts node A's reservation on every member while A writes.
/// An enclosure of three drives open to nodes a and b, and node a owning
/// raid5 `r5` on them, exported as namespace 1.
async fn raid5_of_a() -> (Enclosure, Arc<Node>) {
    let enc = Enclosure::new("e1", 3, &hosts(&["a", "b"]));
    let a = owner("a", &enc);
    a.create_volume(create("r5", "raid5", &["e1:d0", "e1:d1", "e1:d2"]))
        .await
        .unwrap();
    (enc, a)
}

/// An assembly of `drives`, exported as namespace 1 of the test subsystem.
fn assemble_exported(drives: &[&str], takeover: bool) -> AssembleVolume {
    AssembleVolume {
        drives: drives.iter().map(|d| d.to_string()).collect(),
        takeover,
        force: false,
        only: None,
        export: Some(ExportRequest {
            nqn: NQN.into(),
            nsid: 1,
        }),
    }
}

/// Once B's preempts have returned, no write of A reaches any member; A's
/// volume is fenced (its I/O ends in an ANA path error, so hosts go
/// elsewhere); and B assembles the volume from the drives alone, with every
/// write A had acknowledged in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_owner_writes_nothing_more_and_another_node_assembles_the_volume() {
    let (enc, a) = raid5_of_a().await;
    let dev_a = served(&a);
    let blocks = dev_a.geometry().num_blocks;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let dev = dev_a.clone();
        tokio::spawn(async move {
            let mut acked = std::collections::HashMap::new();
            let (mut seq, mut errors) = (0u64, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                seq += 1;
                let lba = (seq * 7919) % blocks;
                match write(&*dev, lba, seq).await {
                    Ok(()) => {
                        acked.insert(lba, seq);
                    }
                    Err(e) => {
                        errors.push(e.to_string());
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            (acked, errors)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    // B, as a plain host with B's identity: register and preempt-and-abort A.
    let b_nqn = node_host_nqn("b");
    let b_key = {
        let id = stable_id(&b_nqn);
        u64::from_be_bytes(id[..8].try_into().unwrap()) | 1
    };
    for i in 0..3 {
        let url = format!(
            "tcp://{}/{}?nsid=1",
            enc.addr,
            drive_nqn("e1", &format!("d{i}"))
        );
        let mut o = RemoteOptions::default();
        o.host.hostnqn = b_nqn.clone();
        o.host.hostid = stable_id(&b_nqn);
        let r = RemoteDevice::connect(&url, o).await.unwrap();
        r.register(b_key).await.unwrap();
        r.preempt_abort(b_key, a.resv_key(), ResvType::WriteExclusiveRegistrantsOnly)
            .await
            .unwrap();
    }
    enc.arm();
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::SeqCst);
    let (acked, errors) = writer.await.unwrap();
    assert_eq!(
        enc.writes(),
        0,
        "writes of the preempted owner reached the members"
    );
    assert!(
        !errors.is_empty(),
        "A's writes kept succeeding after the preempt"
    );
    assert!(
        errors
            .iter()
            .all(|e| e.contains("fenced") || e.contains("reservation conflict")),
        "{errors:?}"
    );
    let vol_a = a.state.lock().await.volumes["r5"]
        .on_drives()
        .unwrap()
        .clone();
    assert!(vol_a.is_fenced(), "A's volume did not fence itself");
    assert!(
        acked.len() > 10,
        "the writer made no progress before the preempt"
    );

    // B, now as a node: the drives alone give it the volume, and B already
    // holds the reservation under its key, so no takeover is needed.
    let b = owner("b", &enc);
    let info = b
        .assemble_volume(assemble_exported(&["e1:d2", "e1:d0", "e1:d1"], false))
        .await
        .unwrap();
    assert_eq!(info.name, "r5");
    let dev_b = served(&b);
    for (&lba, &seq) in &acked {
        let got = read(&*dev_b, lba).await.unwrap();
        assert!(
            got[..] == stamp(lba, seq)[..],
            "LBA {lba}: an acknowledged write of A is missing on B"
        );
    }
}

/// A node that owns the volume refuses to give it to another node that does
/// not ask for a takeover, and the refusal changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assembling_another_nodes_volume_needs_a_takeover() {
    let enc = Enclosure::new("e1", 3, &hosts(&["a", "b"]));
    let a = owner("a", &enc);
    a.create_volume(create("m", "raid1", &["e1:d0", "e1:d1"]))
        .await
        .unwrap();
    write(&*served(&a), 5, 1).await.unwrap();
    let b = owner("b", &enc);
    let drives = vec!["e1:d0".to_string(), "e1:d1".to_string()];
    let e = b
        .assemble_volume(AssembleVolume {
            drives: drives.clone(),
            takeover: false,
            force: false,
            export: None,
            only: None,
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("reserved by another node"), "{e}");
    assert!(
        b.drives().await.is_empty(),
        "the refused request left remote drives open"
    );
    write(&*served(&a), 6, 2).await.expect("A still owns it");
    b.assemble_volume(AssembleVolume {
        drives,
        takeover: true,
        export: None,
        force: false,
        only: None,
    })
    .await
    .unwrap();
    wait_for("A fenced", Duration::from_secs(10), async || {
        write(&*served(&a), 7, 3).await.is_err()
    })
    .await;
}

/// An enclosure that dies: its members fail after `fail_after` and the
/// volume goes on degraded without an error; when the enclosure is back the
/// owner re-adds its drives through the bitmap and every write reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_enclosure_fails_its_member_and_is_re_added_when_back() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("info")
        .try_init();
    let mut e1 = Enclosure::new("e1", 2, &hosts(&["a"]));
    let e2 = Enclosure::new("e2", 2, &hosts(&["a"]));
    let a = {
        let node = owner("a", &e1);
        // Both enclosures are peers.
        let mut c = node.cluster().clone();
        c.peers.push(Peer {
            name: "e2".into(),
            addr: Some(e2.addr),
            host_nqn: node_host_nqn("e2"),
            auth: None,
            tls: None,
        });
        let n2 = super::testing::TestNode::new().cluster(c).build();
        n2.attach_target(node.target().unwrap().clone());
        n2
    };
    a.create_volume(create("r6", "raid6", &["e1:d0", "e2:d0", "e2:d1", "e1:d1"]))
        .await
        .unwrap();
    let dev = served(&a);
    let n = dev.geometry().num_blocks;
    let lbas: Vec<u64> = (0..64).map(|i| (i * 7919) % n).collect();
    for &l in &lbas {
        write(&*dev, l, 1).await.unwrap();
    }
    e1.stop();
    let t = Instant::now();
    // Writes go on: they wait at most fail_after, then run degraded.
    for &l in &lbas {
        write(&*dev, l, 2)
            .await
            .expect("within redundancy: no error");
    }
    assert!(t.elapsed() < Duration::from_secs(20));
    let info = a.volume("r6").await.unwrap();
    assert_eq!(info.state, "degraded", "{info:?}");
    e1.start();
    let t = Instant::now();
    while a.volume("r6").await.unwrap().state != "optimal" {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "members not re-added: {:#?}",
            a.volume("r6").await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for &l in &lbas {
        let got = read(&*dev, l).await.unwrap();
        assert!(got[..] == stamp(l, 2)[..], "LBA {l}");
    }
    // The re-added members hold the data themselves: fail the other
    // enclosure's drives and read again.
    a.fail_drive("e2:d0", false).await.unwrap();
    a.fail_drive("e2:d1", false).await.unwrap();
    for &l in &lbas {
        let got = read(&*dev, l).await.unwrap();
        assert!(got[..] == stamp(l, 2)[..], "LBA {l} after the resync");
    }
}

/// Remote drives named at `volume create` (not in the TOML) are kept in the
/// state directory, so the owner finds its volume again after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_restart_finds_its_volume_on_remote_drives() {
    let enc = Enclosure::new("e1", 2, &hosts(&["a"]));
    let dir = super::tests::tempdir();
    {
        let a = owner_in("a", &enc, Some(&dir));
        a.create_volume(create("m", "raid1", &["e1:d0", "e1:d1"]))
            .await
            .unwrap();
        write(&*served(&a), 9, 42).await.unwrap();
        a.shutdown().await;
    }
    let a = owner_in("a", &enc, Some(&dir));
    a.open_configured_remotes(&[]).await;
    a.assemble_found(&[]).await.unwrap();
    a.restore_exports().await.unwrap();
    let info = a.volume("m").await.unwrap();
    assert_eq!(info.state, "optimal", "{info:?}");
    let got = read(&*served(&a), 9).await.unwrap();
    assert!(got[..] == stamp(9, 42)[..]);
}

/// DH-HMAC-CHAP between nodes, as the TOML sets it up: the enclosure's
/// `[[peer]]` holds the owner's secrets, so its drive export requires them;
/// the owner's `[node] dhchap_key_file` (and ctrl key) are presented by its
/// remote drives. A wrong secret or none is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_drive_authenticates_to_an_export_that_requires_it() {
    use crate::config::auth::tests::{key_dir, write as write_file};
    use nvmf_host::Secret;
    let dir = key_dir();
    let key = |name: &str, b: u8| {
        let s = Secret::from_key(None, &[b; 32]).unwrap().to_dhhc();
        write_file(&dir, name, &s, 0o600)
    };
    let (host_key, ctrl_key, wrong) = (key("host", 1), key("ctrl", 2), key("wrong", 3));
    let cluster_of = |toml: String| {
        crate::config::identity(&crate::config::parse(&toml, "test").unwrap()).unwrap()
    };
    // The enclosure: node "e" exports d0 to its peer "a", which must authenticate.
    let e = super::tests::mem_node(1, DRIVE_BYTES);
    e.set_cluster(cluster_of(format!(
        "[node]\nname = \"e\"\n[[peer]]\nname = \"a\"\naddress = \"127.0.0.1:1\"\n\
         dhchap_key_file = {:?}\ndhchap_ctrl_key_file = {:?}\n",
        host_key, ctrl_key
    )));
    e.export_drive("d0", Default::default(), false)
        .await
        .unwrap();
    let server = Server::start(
        e.target().unwrap().clone(),
        &[ListenerConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            kind: ListenerKind::Io,
            tls: nvmf_target::TlsMode::None,
        }],
    )
    .unwrap();
    let addr = server.local_addrs()[0].0;
    let owner = |keys: &str| {
        super::testing::TestNode::new()
            .cluster(cluster_of(format!(
                "[node]\nname = \"a\"\n{keys}[[peer]]\nname = \"e\"\naddress = \"{addr}\"\n"
            )))
            .build()
    };
    let a = owner(&format!(
        "dhchap_key_file = {host_key:?}\ndhchap_ctrl_key_file = {ctrl_key:?}\n"
    ));
    let d = a.connect_remote("e:d0", None).await.expect("authenticated");
    write(&*d.dev, 3, 9).await.unwrap();
    assert_eq!(&read(&*d.dev, 3).await.unwrap()[..], &stamp(3, 9)[..]);
    // The same host NQN with a wrong secret, or with none, is refused.
    for keys in [format!("dhchap_key_file = {wrong:?}\n"), String::new()] {
        let n = owner(&keys);
        let e = n.connect_remote("e:d0", None).await.err().expect("refused");
        let e = e.to_string();
        assert!(e.contains("drive e:d0"), "{e}");
        assert!(!e.contains("DHHC-1"), "a secret in the error: {e}");
    }
    // Bidirectional: an owner that expects another controller secret
    // refuses the enclosure.
    let n = owner(&format!(
        "dhchap_key_file = {host_key:?}\ndhchap_ctrl_key_file = {wrong:?}\n"
    ));
    assert!(n.connect_remote("e:d0", None).await.is_err());
    server.shutdown();
}

/// TLS between nodes, as the TOML sets it up: the enclosure's `[[peer]]`
/// holds the owner's configured PSK, so its drive export takes the owner
/// only over TLS; the owner's `[node] tls_key_file` makes its remote
/// drives open TLS channels. A wrong key, or plain TCP, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_drive_reaches_an_export_over_tls() {
    use crate::config::auth::tests::{key_dir, write as write_file};
    use nvme_wire::tls_psk::{ConfiguredPsk, PskHash};
    let dir = key_dir();
    let key = |name: &str, b: u8| {
        let k = ConfiguredPsk::from_key(Some(PskHash::Sha384), &[b; 48]).unwrap();
        write_file(&dir, name, &k.to_interchange(), 0o600)
    };
    let (good, wrong) = (key("good.psk", 1), key("wrong.psk", 2));
    let cluster_of = |toml: String| {
        crate::config::identity(&crate::config::parse(&toml, "test").unwrap()).unwrap()
    };
    let e = super::tests::mem_node(1, DRIVE_BYTES);
    e.set_cluster(cluster_of(format!(
        "[node]\nname = \"e\"\n[[peer]]\nname = \"a\"\naddress = \"127.0.0.1:1\"\n\
         tls_key_file = {good:?}\n"
    )));
    e.export_drive("d0", Default::default(), false)
        .await
        .unwrap();
    let server = Server::start(
        e.target().unwrap().clone(),
        &[ListenerConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            kind: ListenerKind::Io,
            tls: nvmf_target::TlsMode::Optional,
        }],
    )
    .unwrap();
    let addr = server.local_addrs()[0].0;
    let owner = |keys: &str| {
        super::testing::TestNode::new()
            .cluster(cluster_of(format!(
                "[node]\nname = \"a\"\n{keys}[[peer]]\nname = \"e\"\naddress = \"{addr}\"\n"
            )))
            .build()
    };
    let a = owner(&format!("tls_key_file = {good:?}\n"));
    let d = a.connect_remote("e:d0", None).await.expect("over TLS");
    write(&*d.dev, 3, 9).await.unwrap();
    assert_eq!(&read(&*d.dev, 3).await.unwrap()[..], &stamp(3, 9)[..]);
    let ok = e
        .target()
        .unwrap()
        .counters
        .tls_handshakes
        .load(Ordering::Relaxed);
    assert!(ok >= 2, "admin and I/O queues over TLS: {ok}");
    for keys in [format!("tls_key_file = {wrong:?}\n"), String::new()] {
        let n = owner(&keys);
        let err = n.connect_remote("e:d0", None).await.err().expect("refused");
        assert!(err.to_string().contains("drive e:d0"), "{err}");
        assert!(
            !err.to_string().contains("NVMeTLSkey"),
            "a key in the error: {err}"
        );
    }
    server.shutdown();
}

/// Two assemblies on one node run side by side: one whose remote member
/// never answers (a listener that accepts and says nothing) holds nothing
/// that the other needs, so the other assembles meanwhile; cancelled, the
/// hung one gives its drives back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_member_of_one_assembly_delays_no_other() {
    let enc = Enclosure::new("e1", 4, &hosts(&["a", "b"]));
    let a = owner("a", &enc);
    for (v, d) in [("v1", ["e1:d0", "e1:d1"]), ("v2", ["e1:d2", "e1:d3"])] {
        a.create_volume(super::testing::volume(v, "raid1", &d))
            .await
            .unwrap();
    }
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = {
        let host_nqn = node_host_nqn("b");
        let peer = |name: &str, addr| Peer {
            name: name.into(),
            addr: Some(addr),
            host_nqn: node_host_nqn(name),
            auth: None,
            tls: None,
        };
        let cluster = Cluster {
            node_name: "b".into(),
            host_id: stable_id(&host_nqn),
            host_nqn,
            peers: vec![
                peer("e1", enc.addr),
                peer("silent", silent.local_addr().unwrap()),
            ],
            remote: settings(),
            dhchap: None,
            tls: None,
        };
        super::testing::TestNode::new().cluster(cluster).build()
    };
    let req = |drives: &[&str]| AssembleVolume {
        drives: drives.iter().map(|d| d.to_string()).collect(),
        takeover: true,
        force: false,
        export: None,
        only: None,
    };
    let hung = tokio::spawn({
        let (b, r) = (b.clone(), req(&["e1:d0", "silent:d0", "e1:d1"]));
        async move { b.assemble_volume(r).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The hung request holds its drives: another one that wants them is
    // answered at once (busy), not queued behind it.
    let e = tokio::time::timeout(
        Duration::from_secs(1),
        b.assemble_volume(req(&["e1:d0", "e1:d1"])),
    )
    .await
    .expect("answered while the other assembly hangs")
    .unwrap_err()
    .to_string();
    assert!(e.contains("being assembled"), "{e}");
    let t = Instant::now();
    let info = tokio::time::timeout(
        Duration::from_secs(2),
        b.assemble_volume(req(&["e1:d2", "e1:d3"])),
    )
    .await
    .expect("assembled while the other assembly hangs")
    .unwrap();
    assert_eq!(info.name, "v2");
    assert!(!hung.is_finished(), "the silent member answered?");
    tracing::info!("v2 assembled in {:?} beside a hung assembly", t.elapsed());
    hung.abort();
    let _ = hung.await;
    let names: Vec<String> = b.drives().await.into_iter().map(|d| d.name).collect();
    assert!(
        !names.iter().any(|n| n == "e1:d0" || n == "silent:d0"),
        "the cancelled assembly left drives open: {names:?}"
    );
    let info = b.assemble_volume(req(&["e1:d0", "e1:d1"])).await.unwrap();
    assert_eq!(info.name, "v1");
}

/// A takeover of a raid5 its owner left dirty (a crash mid-writes) serves
/// before the crash resync, which then runs as a job: every acknowledged
/// write of the old owner reads back at once, and parity agrees after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_serves_a_dirty_raid5_first_and_resyncs_it_as_a_job() {
    use crate::events::EventKind;
    use crate::node::jobs::{JobKind, JobState};
    use crate::node::testing::{job_of, wait_job};
    let (enc, a) = raid5_of_a().await;
    if let Some(j) = job_of(&a.jobs().await, "r5", JobKind::Sync) {
        wait_job(&a, j.id).await;
    }
    let dev = served(&a);
    let blocks = dev.geometry().num_blocks;
    let lbas: Vec<u64> = (1..=40).map(|i| (i * 7919) % blocks).collect();
    for (i, &lba) in lbas.iter().enumerate() {
        write(&*dev, lba, i as u64 + 1).await.unwrap();
    }
    // The crash: A lets go without writing, its intent bits still set.
    a.drop_fenced("r5", "the test's crash").await;
    let b = owner("b", &enc);
    b.assemble_volume(assemble_exported(&["e1:d0", "e1:d1", "e1:d2"], true))
        .await
        .unwrap();
    let sync = job_of(&b.jobs().await, "r5", JobKind::Sync)
        .expect("the crash resync runs as a job after the takeover");
    let dev = served(&b);
    for (i, &lba) in lbas.iter().enumerate() {
        let got = read(&*dev, lba).await.unwrap();
        assert!(got[..] == stamp(lba, i as u64 + 1)[..], "LBA {lba}");
    }
    let done = wait_job(&b, sync.id).await;
    assert_eq!(done.state, JobState::Finished, "{done:?}");
    let scrub = b
        .scrub_volume("r5", super::scrub::ScrubRequest::default())
        .await
        .unwrap();
    let scrub = wait_job(&b, scrub.id).await;
    assert_eq!((scrub.mismatches, scrub.skipped), (0, 0), "{scrub:?}");
    assert!(
        b.events
            .recent()
            .iter()
            .any(|e| e.kind == EventKind::SyncStarted && e.message.contains("crash resync")),
        "no event names the crash resync"
    );
}
