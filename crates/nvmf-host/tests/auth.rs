//! DH-HMAC-CHAP host ⇄ target end to end over loopback TCP: the host side
//! (nvmf-host) against the controller side (nvmf-target), written apart
//! from each other on the primitives in nvme-wire, whose known answers are
//! checked there.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use blockdev::MemDevice;
use nvmf_host::{Controller, DhGroup, DhchapKeys, HashId, HostError, HostOptions, Secret};
use nvmf_target::auth::HostAuth;
use nvmf_target::{ListenerConfig, ListenerKind, Namespace, Server, Subsystem, Target};

const NQN: &str = "nqn.2026-01.io.flashpool:auth";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000a1";
const NOKEY_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000a2";

fn secret(hh: Option<HashId>, fill: u8, len: usize) -> Secret {
    Secret::from_key(hh, &vec![fill; len]).unwrap()
}

fn host_secret() -> Secret {
    secret(Some(HashId::Sha256), 0x11, 32)
}
fn ctrl_secret() -> Secret {
    secret(Some(HashId::Sha512), 0x22, 64)
}

fn start(auth: HostAuth) -> Server {
    let dev = Arc::new(MemDevice::new(1 << 20, 512).unwrap());
    let mut sub = Subsystem::new(
        NQN.into(),
        "SN-AUTH".into(),
        "flashpool test".into(),
        false,
        vec![HOST.into(), NOKEY_HOST.into()],
        vec![Namespace::new(1, dev, [1; 16], [2; 16])],
    );
    sub.set_host_auth(HOST.into(), auth);
    let target = Arc::new(Target::new(Default::default(), vec![Arc::new(sub)]));
    Server::start(
        target,
        &[ListenerConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            kind: ListenerKind::Io,
            tls: nvmf_target::TlsMode::None,
        }],
    )
    .unwrap()
}

fn addr(s: &Server) -> SocketAddr {
    s.local_addrs()[0].0
}

fn opts(keys: Option<DhchapKeys>) -> HostOptions {
    HostOptions {
        hostnqn: HOST.into(),
        hostid: [0xA1; 16],
        timeout: Duration::from_secs(10),
        nr_io_queues: 2,
        queue_depth: 16,
        dhchap: keys,
        ..HostOptions::default()
    }
}

async fn io_works(c: &Controller) {
    let data = vec![0x5Au8; 4096];
    c.write(1, 1, 8, 8, &data).await.unwrap();
    let mut back = vec![0u8; 4096];
    c.read(1, 1, 8, 8, &mut back).await.unwrap();
    assert_eq!(back, data);
    c.write(2, 1, 16, 8, &data).await.unwrap();
}

fn only(hash: HashId, group: DhGroup, mut k: DhchapKeys) -> DhchapKeys {
    k.hashes = vec![hash];
    k.dh_groups = vec![group];
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unidirectional_each_hash_and_group() {
    let s = start(HostAuth::new(host_secret(), None));
    for (hash, group) in [
        (HashId::Sha256, DhGroup::Null),
        (HashId::Sha384, DhGroup::Null),
        (HashId::Sha512, DhGroup::Null),
        (HashId::Sha256, DhGroup::Ffdhe2048),
        (HashId::Sha384, DhGroup::Ffdhe3072),
        (HashId::Sha512, DhGroup::Ffdhe4096),
    ] {
        let keys = only(hash, group, DhchapKeys::new(host_secret(), None));
        let c = Controller::connect(addr(&s), NQN, opts(Some(keys)))
            .await
            .unwrap_or_else(|e| panic!("{hash:?} {group:?}: {e}"));
        io_works(&c).await;
        c.disconnect().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidirectional_and_reauthentication() {
    let s = start(HostAuth::new(host_secret(), Some(ctrl_secret())));
    for group in [DhGroup::Null, DhGroup::Ffdhe2048] {
        let keys = only(
            HashId::Sha384,
            group,
            DhchapKeys::new(host_secret(), Some(ctrl_secret())),
        );
        let c = Controller::connect(addr(&s), NQN, opts(Some(keys)))
            .await
            .unwrap();
        io_works(&c).await;
        c.reauthenticate().await.unwrap();
        io_works(&c).await;
        c.disconnect().await.unwrap();
    }
    // The default offer (every hash and group): the controller picks.
    let c = Controller::connect(
        addr(&s),
        NQN,
        opts(Some(DhchapKeys::new(host_secret(), Some(ctrl_secret())))),
    )
    .await
    .unwrap();
    io_works(&c).await;
    c.disconnect().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_or_missing_secrets_are_refused() {
    let s = start(HostAuth::new(host_secret(), Some(ctrl_secret())));
    let wrong = DhchapKeys::new(secret(Some(HashId::Sha256), 0x33, 32), None);
    let e = Controller::connect(addr(&s), NQN, opts(Some(wrong)))
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(&e, HostError::Authentication { qid: 0, why, .. } if why.contains("Failure1")),
        "{e}"
    );
    // No secret at all: the host sees AUTHREQ and gives up.
    let e = Controller::connect(addr(&s), NQN, opts(None))
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(&e, HostError::Authentication { why, .. } if why.contains("requires")),
        "{e}"
    );
    // A controller that does not know the controller secret the host expects.
    let bad_ctrl = DhchapKeys::new(host_secret(), Some(secret(None, 0x44, 48)));
    let e = Controller::connect(addr(&s), NQN, opts(Some(bad_ctrl)))
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(&e, HostError::Authentication { why, .. } if why.contains("controller's response")),
        "{e}"
    );
    // A host without configured secrets is not asked to authenticate.
    let mut o = opts(None);
    o.hostnqn = NOKEY_HOST.into();
    let c = Controller::connect(addr(&s), NQN, o).await.unwrap();
    io_works(&c).await;
    c.disconnect().await.unwrap();
}
