//! Both sides over loopback, and each side against the `openssl` command
//! (an independent TLS 1.3 PSK peer).

use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;

use nvme_wire::tls_psk::{ConfiguredPsk, PskHash};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6f1c7e52-0000-4000-8000-000000000001";
const SUB: &str = "nqn.2026-01.io.flashpool:tls";
const T: Duration = Duration::from_secs(10);

struct Keys(HashMap<(String, String), ConfiguredPsk>);

impl PskStore for Keys {
    fn configured_psk(&self, h: &str, s: &str) -> Option<ConfiguredPsk> {
        self.0.get(&(h.to_string(), s.to_string())).cloned()
    }
}

fn key(hash: PskHash, seed: u8) -> ConfiguredPsk {
    let k: Vec<u8> = (0..hash.key_len() as u8)
        .map(|i| i.wrapping_mul(7) ^ seed)
        .collect();
    ConfiguredPsk::from_key(Some(hash), &k).unwrap()
}

fn acceptor(k: &ConfiguredPsk) -> TlsAcceptor {
    let mut m = HashMap::new();
    m.insert((HOST.to_string(), SUB.to_string()), k.clone());
    TlsAcceptor::new(Arc::new(Keys(m))).unwrap()
}

/// Runs a server handshake on one accepted connection and a client one.
async fn pair(
    server_key: &ConfiguredPsk,
    client: ClientPsk,
) -> (Result<Accepted, TlsError>, Result<Stream, TlsError>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let acc = acceptor(server_key);
    let srv = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        acc.accept(s, T).await
    });
    let c = connect(TcpStream::connect(addr).await.unwrap(), client, T).await;
    (srv.await.unwrap(), c)
}

#[tokio::test]
async fn both_hashes_and_identity_versions_carry_data() {
    for (hash, version, suite) in [
        (PskHash::Sha256, 0, "TLS_AES_128_GCM_SHA256"),
        (PskHash::Sha256, 1, "TLS_AES_128_GCM_SHA256"),
        (PskHash::Sha384, 0, "TLS_AES_256_GCM_SHA384"),
        (PskHash::Sha384, 1, "TLS_AES_256_GCM_SHA384"),
    ] {
        let k = key(hash, 1);
        let (s, c) = pair(&k, ClientPsk::new(&k, HOST, SUB, version)).await;
        let (a, mut c) = (s.unwrap(), c.unwrap());
        assert_eq!(a.identity.hostnqn, HOST);
        assert_eq!(a.identity.version, version);
        assert_eq!(a.stream.cipher(), Some(suite));
        assert_eq!(c.cipher(), Some(suite));
        let mut srv = a.stream;
        // a vectored write larger than one gather, read back whole
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let writer = tokio::spawn(async move {
            let (a, b) = big.split_at(100_000);
            let mut off = 0;
            while off < a.len() + b.len() {
                let iov = if off < a.len() {
                    vec![IoSlice::new(&a[off..]), IoSlice::new(b)]
                } else {
                    vec![IoSlice::new(&b[off - a.len()..])]
                };
                off += srv.write_vectored(&iov).await.unwrap();
            }
            srv.flush().await.unwrap();
            let mut back = [0u8; 5];
            srv.read_exact(&mut back).await.unwrap();
            (srv, back)
        });
        let mut got = vec![0u8; 300_000];
        c.read_exact(&mut got).await.unwrap();
        assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        c.write_all(b"hello").await.unwrap();
        let (_, back) = writer.await.unwrap();
        assert_eq!(&back, b"hello");
    }
}

#[tokio::test]
async fn try_calls_follow_readiness() {
    let k = key(PskHash::Sha256, 2);
    let (s, c) = pair(&k, ClientPsk::new(&k, HOST, SUB, 0)).await;
    let (mut srv, mut c) = (s.unwrap().stream, c.unwrap());
    let mut b = [0u8; 64];
    assert_eq!(
        c.try_read(&mut b).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
    srv.write_all(&[9u8; 40]).await.unwrap();
    // the target side gathers records until it flushes
    srv.flush().await.unwrap();
    std::future::poll_fn(|cx| c.poll_read_ready(cx))
        .await
        .unwrap();
    let mut n = 0;
    while n < 40 {
        match c.try_read(&mut b[n..]) {
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::future::poll_fn(|cx| c.poll_read_ready(cx))
                    .await
                    .unwrap();
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(&b[..40], &[9u8; 40]);
    let n = c
        .try_write_vectored(&[IoSlice::new(b"ab"), IoSlice::new(b"cd")])
        .unwrap();
    assert_eq!(n, 4);
    let mut r = [0u8; 4];
    srv.read_exact(&mut r).await.unwrap();
    assert_eq!(&r, b"abcd");
}

#[tokio::test]
async fn wrong_key_unknown_host_and_plain_tcp_are_refused() {
    let k = key(PskHash::Sha256, 3);
    let (s, c) = pair(&k, ClientPsk::new(&key(PskHash::Sha256, 4), HOST, SUB, 0)).await;
    let e = s.err().expect("the server refuses a wrong key").to_string();
    assert!(e.contains("identity NVMe0R01"), "{e}");
    assert!(c.is_err());
    // a v1 identity carries a digest of the key: refused before the binder
    let (s, c) = pair(&k, ClientPsk::new(&key(PskHash::Sha256, 4), HOST, SUB, 1)).await;
    let e = s.err().unwrap().to_string();
    assert!(e.contains("does not fit identity"), "{e}");
    assert!(c.is_err());
    let (s, c) = pair(&k, ClientPsk::new(&k, "nqn.2014-08.org.other:h", SUB, 0)).await;
    let e = s.err().unwrap().to_string();
    assert!(
        e.contains("no TLS PSK for host nqn.2014-08.org.other:h"),
        "{e}"
    );
    assert!(c.is_err());
    // a SHA-384 key offered for a SHA-256 configured key
    let (s, c) = pair(&k, ClientPsk::new(&key(PskHash::Sha384, 3), HOST, SUB, 0)).await;
    assert!(s.is_err() && c.is_err());

    // an NVMe/TCP ICReq where a ClientHello belongs, and a silent peer
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let acc = acceptor(&k);
    let mut icreq = vec![0u8; 128];
    icreq[2] = 128;
    icreq[4] = 128;
    let mut cl = TcpStream::connect(addr).await.unwrap();
    cl.write_all(&icreq).await.unwrap();
    let (sv, _) = l.accept().await.unwrap();
    assert!(matches!(
        acc.accept(sv, T).await,
        Err(TlsError::Handshake(_))
    ));
    let _silent = TcpStream::connect(addr).await.unwrap();
    let (sv, _) = l.accept().await.unwrap();
    assert!(matches!(
        acc.accept(sv, Duration::from_millis(200)).await,
        Err(TlsError::Timeout(_))
    ));
}

/// What the child prints until `needle` appears (or it stops, or T passes).
async fn read_until(child: &mut tokio::process::Child, needle: &str) -> String {
    let mut so = child.stdout.take().unwrap();
    let mut out = String::new();
    let _ = tokio::time::timeout(T, async {
        let mut b = [0u8; 64];
        while !out.contains(needle) {
            let n = so.read(&mut b).await.unwrap();
            if n == 0 {
                break;
            }
            out.push_str(&String::from_utf8_lossy(&b[..n]));
        }
    })
    .await;
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `openssl s_client` as the host: an independent ClientHello, binder and
/// record layer (its -psk option gives TLS 1.3 a SHA-256 PSK).
#[tokio::test]
async fn openssl_s_client_connects_with_the_derived_psk() {
    let k = key(PskHash::Sha256, 5);
    let (id, psk) = k.derive(HOST, SUB, 0);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let acc = acceptor(&k);
    let srv = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut a = acc.accept(s, T).await?;
        let mut b = [0u8; 6];
        a.stream.read_exact(&mut b).await.unwrap();
        a.stream.write_all(b"pong\n").await.unwrap();
        a.stream.flush().await.unwrap();
        Ok::<_, TlsError>(b)
    });
    let mut child = tokio::process::Command::new("openssl")
        .args(["s_client", "-quiet", "-tls1_3", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["-ciphersuites", "TLS_AES_128_GCM_SHA256", "-psk_identity"])
        .arg(id.encode())
        .arg("-psk")
        .arg(hex(&psk))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the openssl command (Debian package openssl)");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"ping!\n").await.unwrap();
    let got = tokio::time::timeout(T, srv)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(&got, b"ping!\n");
    let out = read_until(&mut child, "pong").await;
    drop(stdin);
    let _ = child.kill().await;
    assert!(out.contains("pong"), "s_client printed {out:?}");
}

/// `openssl s_server` as the target: our ClientHello and PSK binder.
#[tokio::test]
async fn openssl_s_server_accepts_our_client() {
    let k = key(PskHash::Sha256, 6);
    let (id, psk) = k.derive(HOST, SUB, 0);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = tokio::process::Command::new("openssl")
        .args([
            "s_server", "-quiet", "-tls1_3", "-nocert", "-naccept", "1", "-accept",
        ])
        .arg(port.to_string())
        .args(["-ciphersuites", "TLS_AES_128_GCM_SHA256", "-psk_identity"])
        .arg(id.encode())
        .arg("-psk")
        .arg(hex(&psk))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the openssl command");
    let mut tcp = None;
    for _ in 0..100 {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)).await {
            tcp = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut c = connect(
        tcp.expect("s_server listens"),
        ClientPsk::new(&k, HOST, SUB, 0),
        T,
    )
    .await
    .unwrap();
    c.write_all(b"from-host\n").await.unwrap();
    let out = read_until(&mut child, "from-host").await;
    let _ = child.kill().await;
    assert!(out.contains("from-host"), "s_server printed {out:?}");
}

/// With read-ahead, OpenSSL may hold part of a record the socket has not
/// finished delivering: readiness must then wait for the socket instead of
/// answering "ready" again and again (a busy loop, or a stall for a caller
/// that trusts it). Counts the times readiness said ready and the next
/// read still found nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_socket_on_a_partial_record() {
    let k = key(PskHash::Sha256, 7);
    let (s, c) = pair(&k, ClientPsk::new(&k, HOST, SUB, 0)).await;
    let (mut srv, mut c) = (s.unwrap().stream, c.unwrap());
    const TOTAL: usize = 4 << 20;
    let w = tokio::spawn(async move {
        let chunk = vec![0xA5u8; 100_000];
        let mut sent = 0;
        while sent < TOTAL {
            let n = chunk.len().min(TOTAL - sent);
            srv.write_all(&chunk[..n]).await.unwrap();
            sent += n;
        }
        srv.flush().await.unwrap();
        srv
    });
    let (mut got, mut empty_after_ready) = (0usize, 0u32);
    let mut buf = vec![0u8; 3000];
    let mut just_ready = false;
    tokio::time::timeout(T, async {
        while got < TOTAL {
            match c.try_read(&mut buf) {
                Ok(0) => panic!("closed early"),
                Ok(n) => {
                    assert!(buf[..n].iter().all(|&b| b == 0xA5));
                    got += n;
                    just_ready = false;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if just_ready {
                        empty_after_ready += 1;
                        // a busy loop never yields: stop it here
                        assert!(
                            empty_after_ready < 50,
                            "readiness spins on a partial record"
                        );
                    }
                    std::future::poll_fn(|cx| c.poll_read_ready(cx))
                        .await
                        .unwrap();
                    just_ready = true;
                }
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
    .expect("all data read");
    w.await.unwrap();
    assert!(
        empty_after_ready < 50,
        "readiness said ready {empty_after_ready} times with nothing to read"
    );
}
