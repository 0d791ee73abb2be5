//! Bad input on the TLS listeners (TP 8011): plain PDUs, garbage and
//! oversized records where a ClientHello belongs, silent and half-open
//! handshakes, a flood of them; and a malformed PDU inside a good TLS
//! channel. Each ends with the connection closed (or a C2HTermReq inside
//! the channel), counted, and the target serving everyone else.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use fault_tests::{HOST_NQN, NQN_OPEN, test_transport};
use nvme_wire::pdu::{ICReq, PduType};
use nvme_wire::tls_psk::{ConfiguredPsk, PskHash};
use nvmf_target::{ListenerConfig, ListenerKind, Namespace, Server, Subsystem, Target, TlsMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const T: Duration = Duration::from_secs(5);

fn key() -> ConfiguredPsk {
    ConfiguredPsk::from_key(Some(PskHash::Sha256), &[0x77; 32]).unwrap()
}

/// [0]: TLS required, [1]: TLS optional.
fn start() -> (Server, SocketAddr, SocketAddr) {
    let dev = Arc::new(blockdev::MemDevice::new(1 << 20, 512).unwrap());
    let mut sub = Subsystem::new(
        NQN_OPEN.into(),
        "SN-FTLS".into(),
        "flashpool fault".into(),
        true,
        Vec::new(),
        vec![Namespace::new(1, dev, [1; 16], [2; 16])],
    );
    sub.set_host_tls(HOST_NQN.into(), key());
    let target = Arc::new(Target::new(test_transport(), vec![Arc::new(sub)]));
    let l = |tls| ListenerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: ListenerKind::Io,
        tls,
    };
    let s = Server::start(target, &[l(TlsMode::Required), l(TlsMode::Optional)]).unwrap();
    let (r, o) = (s.local_addrs()[0].0, s.local_addrs()[1].0);
    (s, r, o)
}

fn icreq() -> Vec<u8> {
    ICReq {
        pfv: 0,
        hpda: 0,
        dgst: 0,
        maxr2t: 0,
    }
    .encode()
    .to_vec()
}

/// Sends `bytes` and reads until the target closes; returns what it sent.
async fn send_and_drain(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(bytes).await;
    let mut got = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut got)).await;
    assert!(r.is_ok(), "the target must close the connection");
    got
}

/// A plain ICReq on the optional listener is answered with an ICResp.
async fn plain_still_served(addr: SocketAddr) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&icreq()).await.unwrap();
    let mut b = [0u8; 128];
    tokio::time::timeout(T, s.read_exact(&mut b))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(b[0], PduType::ICResp as u8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_where_a_client_hello_belongs_is_closed() {
    let (s, req, opt) = start();
    let t = s.target().clone();
    // a plain ICReq on the TLS-only listener: no ICResp, just closed
    let got = send_and_drain(req, &icreq()).await;
    assert!(got.is_empty(), "no answer in clear: {got:?}");
    // a handshake record of garbage, on both listeners
    let mut junk = vec![0x16, 0x03, 0x01, 0x02, 0x00];
    junk.extend((0..512u32).map(|i| (i * 31 % 251) as u8));
    for a in [req, opt] {
        let got = send_and_drain(a, &junk).await;
        assert!(got.len() < 64, "at most a TLS alert: {} bytes", got.len());
    }
    // a record header that announces 65535 bytes, then the host goes away
    let got = send_and_drain(req, &[0x16, 0x03, 0x03, 0xff, 0xff, 0x01]).await;
    assert!(got.len() < 64);
    // the count follows the close: the handshake gives the socket up first
    let failures = || t.counters.tls_handshake_failures.load(Relaxed);
    let deadline = tokio::time::Instant::now() + T;
    while failures() < 4 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(failures(), 4);
    plain_still_served(opt).await;
    s.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_handshake_or_a_flood_harms_no_one_else() {
    let (s, req, opt) = start();
    // a host that starts a record and stops: the others go on meanwhile
    let mut stalled = TcpStream::connect(req).await.unwrap();
    stalled.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    let mut silent = Vec::new();
    for _ in 0..8 {
        silent.push(TcpStream::connect(opt).await.unwrap());
    }
    let flood: Vec<_> = (0..40)
        .map(|i| {
            tokio::spawn(async move {
                let b: Vec<u8> = std::iter::once(0x16)
                    .chain((0..300).map(|j| ((i * 7 + j) % 256) as u8))
                    .collect();
                send_and_drain(if i % 2 == 0 { req } else { opt }, &b).await
            })
        })
        .collect();
    plain_still_served(opt).await;
    let psk = nvme_tls::ClientPsk::new(&key(), HOST_NQN, NQN_OPEN, 0);
    let tcp = TcpStream::connect(req).await.unwrap();
    let mut tls = nvme_tls::connect(tcp, psk, T)
        .await
        .expect("a good host gets in");
    tls.write_all(&icreq()).await.unwrap();
    let mut b = [0u8; 128];
    tokio::time::timeout(T, tls.read_exact(&mut b))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(b[0], PduType::ICResp as u8);
    for f in flood {
        f.await.unwrap();
    }
    // the stalled one is closed after the handshake timeout (10 s)
    let mut rest = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(15), stalled.read_to_end(&mut rest)).await;
    assert!(r.is_ok(), "a stalled handshake is closed");
    assert!(s.target().counters.tls_handshake_failures.load(Relaxed) >= 41);
    drop(silent);
    s.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_pdu_inside_tls_gets_a_termreq_inside_tls() {
    let (s, req, _) = start();
    let psk = nvme_tls::ClientPsk::new(&key(), HOST_NQN, NQN_OPEN, 1);
    let tcp = TcpStream::connect(req).await.unwrap();
    let mut tls = nvme_tls::connect(tcp, psk, T).await.unwrap();
    let mut bad = icreq();
    bad[2] = 0x7f; // HLEN 127 for an ICReq: invalid header field
    tls.write_all(&bad).await.unwrap();
    let mut got = Vec::new();
    let r = tokio::time::timeout(T, tls.read_to_end(&mut got)).await;
    assert!(r.is_ok(), "closed after the TermReq");
    assert_eq!(got.first(), Some(&(PduType::C2HTermReq as u8)), "{got:?}");
    assert_eq!(s.target().counters.protocol_errors.load(Relaxed), 1);
    s.shutdown();
}
