//! TLS 1.3 (TP 8011) host ⇄ target end to end over loopback TCP: the PSK
//! derived on each side from the host's configured key, both hashes and
//! both identity versions, required and optional listeners, refusals, and
//! what the discovery log says about the listeners.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use blockdev::MemDevice;
use nvme_wire::tls_psk::PskHash;
use nvmf_host::{ConfiguredPsk, Controller, HostError, HostOptions, TlsKey};
use nvmf_target::{ListenerConfig, ListenerKind, Namespace, Server, Subsystem, Target, TlsMode};

const NQN: &str = "nqn.2026-01.io.flashpool:tls";
const H256: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000c1";
const H384: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000c2";
const PLAIN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000c3";

fn key(hash: PskHash, fill: u8) -> ConfiguredPsk {
    ConfiguredPsk::from_key(Some(hash), &vec![fill; hash.key_len()]).unwrap()
}

/// Listeners: [0] TLS required, [1] TLS optional, [2] plain, [3] discovery.
fn start() -> Server {
    let dev = Arc::new(MemDevice::new(1 << 20, 512).unwrap());
    let mut sub = Subsystem::new(
        NQN.into(),
        "SN-TLS".into(),
        "flashpool test".into(),
        false,
        vec![H256.into(), H384.into(), PLAIN.into()],
        vec![Namespace::new(1, dev, [1; 16], [2; 16])],
    );
    sub.set_host_tls(H256.into(), key(PskHash::Sha256, 0x31));
    sub.set_host_tls(H384.into(), key(PskHash::Sha384, 0x32));
    let target = Arc::new(Target::new(Default::default(), vec![Arc::new(sub)]));
    let l = |kind, tls| ListenerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        kind,
        tls,
    };
    Server::start(
        target,
        &[
            l(ListenerKind::Io, TlsMode::Required),
            l(ListenerKind::Io, TlsMode::Optional),
            l(ListenerKind::Io, TlsMode::None),
            l(ListenerKind::Discovery, TlsMode::None),
        ],
    )
    .unwrap()
}

fn addr(s: &Server, i: usize) -> SocketAddr {
    s.local_addrs()[i].0
}

fn opts(host: &str, tls: Option<(ConfiguredPsk, u8)>) -> HostOptions {
    HostOptions {
        hostnqn: host.into(),
        hostid: [host.as_bytes()[host.len() - 1]; 16],
        timeout: Duration::from_secs(10),
        nr_io_queues: 2,
        queue_depth: 16,
        tls: tls.map(|(key, identity_version)| TlsKey {
            key,
            identity_version,
        }),
        ..HostOptions::default()
    }
}

async fn io_works(c: &Controller) {
    // large enough for R2T/H2CData and multi-record C2HData
    let data: Vec<u8> = (0..256 * 1024u32).map(|i| (i % 253) as u8).collect();
    c.write(1, 1, 0, 512, &data).await.unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(2, 1, 0, 512, &mut back).await.unwrap();
    assert_eq!(back, data);
    let small = vec![0x5Au8; 4096];
    c.write(2, 1, 1024, 8, &small).await.unwrap();
    c.read(1, 1, 1024, 8, &mut back[..4096]).await.unwrap();
    assert_eq!(&back[..4096], &small[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_with_keys_do_io_over_tls_on_required_and_optional_listeners() {
    let s = start();
    for (host, k, version, listener) in [
        (H256, key(PskHash::Sha256, 0x31), 0, 0),
        (H256, key(PskHash::Sha256, 0x31), 1, 1),
        (H384, key(PskHash::Sha384, 0x32), 0, 1),
        (H384, key(PskHash::Sha384, 0x32), 1, 0),
    ] {
        let c = Controller::connect(addr(&s, listener), NQN, opts(host, Some((k, version))))
            .await
            .unwrap_or_else(|e| panic!("{host} v{version} on listener {listener}: {e}"));
        io_works(&c).await;
        c.disconnect().await.unwrap();
    }
    assert_eq!(s.target().counters.tls_handshakes.load(Relaxed), 4 * 3);
    // a host without a key, plain, on the optional and the plain listener
    for l in [1, 2] {
        let c = Controller::connect(addr(&s, l), NQN, opts(PLAIN, None))
            .await
            .unwrap();
        io_works(&c).await;
        c.disconnect().await.unwrap();
    }
    s.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_missing_or_plain_is_refused_and_nothing_opens() {
    let s = start();
    let before = s.target().counters.tls_handshake_failures.load(Relaxed);
    // wrong key, each identity version
    for v in [0, 1] {
        let e = Controller::connect(
            addr(&s, 0),
            NQN,
            opts(H256, Some((key(PskHash::Sha256, 9), v))),
        )
        .await
        .err()
        .expect("a wrong key is refused");
        assert!(matches!(e, HostError::Tls { .. }), "{e}");
    }
    // a host the target has no key for
    let e = Controller::connect(
        addr(&s, 0),
        NQN,
        opts(PLAIN, Some((key(PskHash::Sha256, 0x31), 0))),
    )
    .await
    .err()
    .unwrap();
    assert!(matches!(e, HostError::Tls { .. }), "{e}");
    // plain TCP on the TLS-only listener: closed before the ICReq is answered
    let e = Controller::connect(addr(&s, 0), NQN, opts(PLAIN, None))
        .await
        .err()
        .unwrap();
    assert!(matches!(e, HostError::ConnectionLost { .. }), "{e}");
    // a host with a key, plain on the optional or the plain listener: its Connect is refused
    for l in [1, 2] {
        let e = Controller::connect(addr(&s, l), NQN, opts(H256, None))
            .await
            .err()
            .unwrap();
        assert!(matches!(e, HostError::HostNotAllowed { .. }), "{e}");
    }
    // a TLS host against a plain listener: its ClientHello is no ICReq
    let e = Controller::connect(
        addr(&s, 2),
        NQN,
        opts(H256, Some((key(PskHash::Sha256, 0x31), 0))),
    )
    .await
    .err()
    .unwrap();
    assert!(!format!("{e}").is_empty());
    // the count follows the close: the handshake gives the socket up first
    let failures = || s.target().counters.tls_handshake_failures.load(Relaxed) - before;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while failures() < 4 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        failures(),
        4,
        "two wrong keys, an unknown host, plain on the TLS-only listener"
    );
    assert!(
        s.target().controllers().is_empty(),
        "no controller was left behind"
    );
    s.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_discovery_log_advertises_each_listeners_secure_channel() {
    let s = start();
    let log = nvmf_host::discover_with(addr(&s, 3), opts(PLAIN, None))
        .await
        .unwrap();
    let port = |i: usize| addr(&s, i).port().to_string();
    let entry = |i| {
        log.iter()
            .find(|e| e.trsvcid == port(i) && e.subnqn == NQN)
            .unwrap_or_else(|| panic!("listener {i} in {log:?}"))
    };
    // TREQ bits 1:0: 1 required, 2 not required, 0 not specified; SECTYPE 2 = TLS 1.3
    assert_eq!((entry(0).treq & 3, entry(0).sectype), (1, 2));
    assert_eq!((entry(1).treq & 3, entry(1).sectype), (2, 2));
    assert_eq!((entry(2).treq & 3, entry(2).sectype), (0, 0));
    s.shutdown();
}
