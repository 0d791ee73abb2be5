//! End to end: one in-process target on 127.0.0.1; each input is one TCP
//! connection that gets a handshake (or not) and then the fuzz bytes. The
//! host half-closes after sending, so the target must close the connection
//! soon after; a panic anywhere in the target aborts the fuzzer.
//!
//! Input: byte 0 picks the set-up (low 2 bits: 0 nothing, 1 ICReq, 2 admin
//! queue connected, 3 I/O queue connected; bit 2 digests; bit 3 skip CC.EN);
//! the rest goes to the target as is.
#![no_main]

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use flashpool_fuzz::*;
use libfuzzer_sys::fuzz_target;
use nvme_wire::fabrics::CNTLID_DYNAMIC;
use nvme_wire::pdu::CommonHeader;
use nvmf_target::{ListenerConfig, ListenerKind, Server};

/// How long the target may take to close after the host half-closed.
const CLOSE_WITHIN: Duration = Duration::from_secs(5);

fn server() -> SocketAddr {
    // Kept in a static (not forgotten) so that it stays reachable for LeakSanitizer.
    static S: OnceLock<(Server, SocketAddr)> = OnceLock::new();
    S.get_or_init(|| {
        // libFuzzer's main is not Rust's: ignore SIGPIPE as a Rust binary would,
        // so a write to a closed socket is an error, not a kill.
        // SAFETY: setting a signal disposition to SIG_IGN has no preconditions.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
        let target = make_target(2);
        let server = Server::start(
            target,
            &[ListenerConfig {
                addr: "127.0.0.1:0".parse().unwrap(),
                kind: ListenerKind::Io,
                tls: nvmf_target::TlsMode::None,
            }],
        )
        .expect("server starts");
        let addr = server.local_addrs()[0].0;
        (server, addr)
    })
    .1
}

fn open(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect to the in-process target");
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads one PDU; None if the connection ended or timed out.
fn read_pdu(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut h = [0u8; 8];
    s.read_exact(&mut h).ok()?;
    let ch = CommonHeader::decode(&h).ok()?;
    assert!(
        ch.plen >= 8 && ch.plen <= 1 << 20,
        "target sent plen {}",
        ch.plen
    );
    let mut b = vec![0u8; ch.plen as usize];
    b[..8].copy_from_slice(&h);
    s.read_exact(&mut b[8..]).ok()?;
    Some(b)
}

/// Sends a capsule and expects a successful CapsuleResp; returns dword 0.
fn command(s: &mut TcpStream, pdu: &[u8]) -> u32 {
    s.write_all(pdu).expect("send");
    let r = read_pdu(s).expect("CapsuleResp");
    assert_eq!(r[0], 0x05, "expected a CapsuleResp, got type {:#x}", r[0]);
    let status = u16::from_le_bytes([r[8 + 14], r[8 + 15]]) >> 1;
    assert_eq!(status, 0, "set-up command failed with status {status:#x}");
    u32::from_le_bytes(r[8..12].try_into().unwrap())
}

fn handshake(s: &mut TcpStream, digests: bool) {
    s.write_all(&icreq(digests)).expect("send ICReq");
    let r = read_pdu(s).expect("ICResp");
    assert_eq!(r[0], 0x01, "expected ICResp");
}

fn admin(addr: SocketAddr, digests: bool, enable: bool) -> (TcpStream, u16) {
    let mut s = open(addr);
    handshake(&mut s, digests);
    let (sqe, data) = connect(1, 0, CNTLID_DYNAMIC, NQN_OPEN, HOST_NQN, 0);
    let cntlid = command(&mut s, &capsule(&sqe, &data, digests)) as u16;
    if enable {
        command(&mut s, &capsule(&enable_sqe(2), &[], digests));
    }
    (s, cntlid)
}

fuzz_target!(|input: &[u8]| {
    let addr = server();
    let Some((&sel, garbage)) = input.split_first() else {
        return;
    };
    let digests = sel & 4 != 0;
    let enable = sel & 8 == 0;
    let (_admin, mut s) = match sel & 3 {
        0 => (None, open(addr)),
        1 => {
            let mut s = open(addr);
            handshake(&mut s, digests);
            (None, s)
        }
        2 => (None, admin(addr, digests, enable).0),
        _ => {
            let (a, cntlid) = admin(addr, digests, true);
            let mut s = open(addr);
            handshake(&mut s, digests);
            let (sqe, data) = connect(1, 1, cntlid, NQN_OPEN, HOST_NQN, 0);
            command(&mut s, &capsule(&sqe, &data, digests));
            (Some(a), s)
        }
    };
    // The target may close early (a TermReq); a failed write is fine.
    let _ = s.write_all(garbage);
    let _ = s.shutdown(Shutdown::Write);
    let start = Instant::now();
    let mut b = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
        assert!(
            start.elapsed() < CLOSE_WITHIN,
            "hang: the target did not close the connection {CLOSE_WITHIN:?} after the host half-closed"
        );
    }
});
