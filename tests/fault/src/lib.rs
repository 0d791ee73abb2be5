//! Raw-TCP host helpers for the fault tests in `tests/`.
//!
//! Everything here speaks bytes over a blocking `std::net::TcpStream` with
//! read timeouts, so that a target that hangs fails a test instead of hanging
//! it. PDUs are built with `nvme_wire` encoders and answers are decoded with
//! `nvme_wire` decoders; the helpers panic with a message that says what was
//! expected and what came, which is what a test wants.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use blockdev::MemDevice;
use nvme_wire::cqe::Cqe;
use nvme_wire::digest::{crc32c, data_digest};
use nvme_wire::fabrics::{CNTLID_DYNAMIC, ConnectCmd, ConnectData, PropertyCmd, fctype, prop};
use nvme_wire::pdu::{
    C2HDataHdr, CH_LEN, CommonHeader, FLAG_DDGSTF, FLAG_HDGSTF, FLAG_LAST_PDU, H2CDataHdr, ICReq,
    ICResp, PduType, R2THdr, TermReq,
};
use nvme_wire::sqe::{
    SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK, SglDesc, Sqe, admin_opc, io_opc,
};
use nvme_wire::status::Status;
use nvmf_target::{
    ListenerConfig, ListenerKind, Namespace, Server, Subsystem, Target, TransportConfig,
};

/// Subsystem that admits any host; nsid 1 is a RAM namespace.
pub const NQN_OPEN: &str = "nqn.2026-01.io.flashpool:fault-open";
/// Subsystem that admits only `HOST_ALLOWED`.
pub const NQN_CLOSED: &str = "nqn.2026-01.io.flashpool:fault-closed";
pub const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:fa017000-0000-4000-8000-000000000001";
pub const HOST_ALLOWED: &str =
    "nqn.2014-08.org.nvmexpress:uuid:fa017000-0000-4000-8000-0000000000aa";

pub const BLOCK: u32 = 512;
/// Namespace size: 16 MiB (thin, so it costs nothing until written).
pub const NS_BYTES: u64 = 16 << 20;
pub const NS_BLOCKS: u64 = NS_BYTES / BLOCK as u64;
/// In-capsule data accepted on I/O queues by the test target.
pub const ICD: u32 = 8192;
/// MDTS of the test target.
pub const MAX_TRANSFER: u32 = 128 * 1024;
/// MAXH2CDATA of the test target.
pub const MAX_H2C: u32 = 16 * 1024;
/// How long any single read may wait before the test calls it a hang.
pub const READ_TIMEOUT: Duration = Duration::from_secs(3);

/// CC value that enables a controller with 64-byte SQEs and 16-byte CQEs.
pub const CC_ENABLE: u64 = 1 | (6 << 16) | (4 << 20);

/// The transport configuration every test target uses unless told otherwise.
pub fn test_transport() -> TransportConfig {
    TransportConfig {
        max_queue_depth: 32,
        max_io_queues: 4,
        in_capsule_data: ICD,
        max_transfer: MAX_TRANSFER,
        max_h2c_data: MAX_H2C,
        header_digest: true,
        data_digest: true,
        kato_max_ms: 120_000,
        reactors: 1,
        cpus: Vec::new(),
        poll_us: 0,
        auth_timeout_ms: 30_000,
    }
}

fn subsystem(nqn: &str, allow_any_host: bool, hosts: Vec<String>) -> Arc<Subsystem> {
    let dev = Arc::new(MemDevice::new(NS_BYTES, BLOCK).expect("mem device"));
    let ns = Namespace::new(1, dev, [0x11; 16], [0x22; 16]);
    Arc::new(Subsystem::new(
        nqn.into(),
        "FAULT0001".into(),
        "flashpool fault".into(),
        allow_any_host,
        hosts,
        vec![ns],
    ))
}

/// A subsystem on which `HOST_NQN` must authenticate with [`auth_secret`].
pub const NQN_AUTH: &str = "nqn.2026-01.io.flashpool:fault-auth";

/// The DH-HMAC-CHAP secret `HOST_NQN` has on `NQN_AUTH`.
pub fn auth_secret() -> nvme_wire::auth::dhchap::Secret {
    use nvme_wire::auth::dhchap::{HashId, Secret};
    Secret::from_key(Some(HashId::Sha256), &[0x5C; 32]).expect("32 bytes")
}

fn auth_subsystem() -> Arc<Subsystem> {
    let dev = Arc::new(MemDevice::new(NS_BYTES, BLOCK).expect("mem device"));
    let ns = Namespace::new(1, dev, [0x33; 16], [0x44; 16]);
    let mut s = Subsystem::new(
        NQN_AUTH.into(),
        "FAULT0002".into(),
        "flashpool fault".into(),
        false,
        vec![HOST_NQN.into()],
        vec![ns],
    );
    s.set_host_auth(
        HOST_NQN.into(),
        nvmf_target::auth::HostAuth::new(auth_secret(), None),
    );
    Arc::new(s)
}

/// An in-process target on 127.0.0.1 with an ephemeral port.
pub struct TestTarget {
    server: Option<Server>,
    pub addr: SocketAddr,
    pub target: Arc<Target>,
}

impl TestTarget {
    pub fn start() -> Self {
        Self::with(test_transport())
    }

    pub fn with(transport: TransportConfig) -> Self {
        let subs = vec![
            subsystem(NQN_OPEN, true, Vec::new()),
            subsystem(NQN_CLOSED, false, vec![HOST_ALLOWED.into()]),
            auth_subsystem(),
        ];
        let target = Arc::new(Target::new(transport, subs));
        let server = Server::start(
            target.clone(),
            &[ListenerConfig {
                addr: "127.0.0.1:0".parse().expect("addr"),
                kind: ListenerKind::Io,
                tls: nvmf_target::TlsMode::None,
            }],
        )
        .expect("server starts");
        let addr = server.local_addrs()[0].0;
        TestTarget {
            server: Some(server),
            addr,
            target,
        }
    }

    /// A new TCP connection (no ICReq yet).
    pub fn host(&self) -> Host {
        Host::connect(self.addr)
    }

    /// A host through ICReq (optionally with both digests).
    pub fn host_ic(&self, digests: bool) -> Host {
        let mut h = self.host();
        h.icreq(digests);
        h
    }

    /// A host with an admin queue connected to `NQN_OPEN` and enabled.
    pub fn admin(&self, digests: bool) -> Host {
        let mut h = self.host_ic(digests);
        h.connect_admin_ok(NQN_OPEN, HOST_NQN, 0);
        h.enable();
        h
    }

    /// An admin queue (enabled) and I/O queue 1 of the same controller.
    pub fn admin_and_io(&self, digests: bool) -> (Host, Host) {
        let admin = self.admin(digests);
        let mut io = self.host_ic(digests);
        let cqe = io.connect_io(admin.cntlid, 1, NQN_OPEN, HOST_NQN);
        assert_status(&cqe, 0, 0, "I/O queue Connect");
        io.cntlid = admin.cntlid;
        (admin, io)
    }

    /// An enabled admin queue and I/O queue 1 of a controller of `NQN_OPEN`
    /// whose Connect data carried `hostid` (both queues).
    pub fn admin_and_io_hostid(&self, hostid: [u8; 16], digests: bool) -> (Host, Host) {
        let mut admin = self.host_ic(digests);
        let c = admin.connect_admin_hostid(NQN_OPEN, HOST_NQN, hostid);
        assert_status(&c, 0, 0, "admin Connect");
        admin.cntlid = c.dw0 as u16;
        admin.enable();
        let mut io = self.host_ic(digests);
        let c = io.connect_io_hostid(admin.cntlid, 1, NQN_OPEN, HOST_NQN, hostid);
        assert_status(&c, 0, 0, "I/O queue Connect");
        io.cntlid = admin.cntlid;
        (admin, io)
    }

    /// A healthy controller with an I/O queue, for checking that abuse of
    /// other connections leaves it alone.
    pub fn healthy(&self) -> Healthy {
        let (admin, io) = self.admin_and_io(true);
        Healthy {
            admin,
            io,
            base: next_region(),
            round: 0,
        }
    }

    /// Waits until the target holds `n` controllers (teardown runs on the reactor).
    pub fn wait_controllers(&self, n: usize, within: Duration) -> usize {
        let end = Instant::now() + within;
        loop {
            let c = self.target.controller_count();
            if c == n || Instant::now() >= end {
                return c;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn shutdown(mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

impl Drop for TestTarget {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

static REGION: AtomicU32 = AtomicU32::new(0);
/// Blocks per healthy-I/O region (each `Healthy` writes only inside its own).
const REGION_BLOCKS: u64 = 256;

fn next_region() -> u64 {
    let n = u64::from(REGION.fetch_add(1, Ordering::Relaxed));
    // The upper half of the namespace is left to the abuse tests.
    (n % (NS_BLOCKS / 2 / REGION_BLOCKS)) * REGION_BLOCKS + NS_BLOCKS / 2
}

/// One controller (admin + I/O queue) that only ever does correct things.
pub struct Healthy {
    pub admin: Host,
    pub io: Host,
    base: u64,
    round: u32,
}

impl Healthy {
    /// Writes an in-capsule block run and an R2T run, reads both back, and
    /// sends a Keep Alive on the admin queue. Panics on any deviation.
    pub fn verify(&mut self) {
        if let Err(e) = self.try_verify() {
            panic!("healthy connection failed: {e}");
        }
    }

    pub fn try_verify(&mut self) -> Result<(), String> {
        self.round += 1;
        let seed = u64::from(self.round) << 32 | self.base;
        let small = pattern(seed, 4096);
        let big = pattern(seed ^ 0x5555, 40 * 1024);
        let lba_small = self.base;
        let lba_big = self.base + 8;
        let c = self.io.try_write(1, lba_small, &small)?;
        status_ok(&c, "healthy in-capsule write")?;
        let c = self.io.try_write(1, lba_big, &big)?;
        status_ok(&c, "healthy R2T write")?;
        let (c, got) = self
            .io
            .try_read(1, lba_small, (small.len() / BLOCK as usize) as u32)?;
        status_ok(&c, "healthy read 1")?;
        if got != small {
            return Err("healthy read 1 returned other data than written".into());
        }
        let (c, got) = self
            .io
            .try_read(1, lba_big, (big.len() / BLOCK as usize) as u32)?;
        status_ok(&c, "healthy read 2")?;
        if got != big {
            return Err("healthy read 2 returned other data than written".into());
        }
        let cid = self.admin.next_cid();
        let ka = Sqe::new(admin_opc::KEEP_ALIVE, cid);
        self.admin.try_send_capsule(&ka, &[])?;
        let c = self.admin.try_expect_resp()?;
        status_ok(&c, "healthy keep alive")?;
        Ok(())
    }
}

fn status_ok(c: &Cqe, what: &str) -> Result<(), String> {
    if c.status.is_success() {
        Ok(())
    } else {
        Err(format!("{what}: status {:?}", c.status))
    }
}

/// Deterministic test data.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = vec![0u8; len];
    r.fill(&mut v);
    v
}

/// xorshift64*: small, seeded, good enough for test data and garbage.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }
    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
    pub fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// A received PDU: its common header and all `plen` bytes.
#[derive(Debug, Clone)]
pub struct Pdu {
    pub ch: CommonHeader,
    pub bytes: Vec<u8>,
}

impl Pdu {
    pub fn kind(&self) -> Option<PduType> {
        PduType::from_u8(self.ch.pdu_type)
    }
}

/// How a read attempt ended when no PDU came.
#[derive(Debug)]
pub enum RecvError {
    /// The target closed the connection (EOF or reset).
    Closed,
    /// Nothing within the read timeout.
    Timeout,
    Other(std::io::Error),
}

impl std::fmt::Display for RecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecvError::Closed => write!(f, "connection closed by the target"),
            RecvError::Timeout => write!(f, "no answer within {READ_TIMEOUT:?} (hang)"),
            RecvError::Other(e) => write!(f, "socket error: {e}"),
        }
    }
}

fn classify(e: std::io::Error) -> RecvError {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => RecvError::Timeout,
        ErrorKind::UnexpectedEof
        | ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe => RecvError::Closed,
        _ => RecvError::Other(e),
    }
}

/// One host-side connection (one queue).
pub struct Host {
    pub s: TcpStream,
    pub hdgst: bool,
    pub ddgst: bool,
    pub maxh2cdata: u32,
    pub cntlid: u16,
    /// In-capsule data limit used to choose in-capsule vs R2T writes.
    pub icd: u32,
    cid: u16,
}

impl Host {
    pub fn connect(addr: SocketAddr) -> Host {
        let s = TcpStream::connect(addr).expect("TCP connect to the test target");
        s.set_read_timeout(Some(READ_TIMEOUT))
            .expect("read timeout");
        s.set_write_timeout(Some(READ_TIMEOUT))
            .expect("write timeout");
        s.set_nodelay(true).expect("nodelay");
        Host {
            s,
            hdgst: false,
            ddgst: false,
            maxh2cdata: 0,
            cntlid: 0,
            icd: ICD,
            cid: 0,
        }
    }

    pub fn next_cid(&mut self) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        self.cid
    }

    /// Sends raw bytes; a failure (the target already closed) is returned, not fatal.
    pub fn send_raw(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.s.write_all(b)
    }

    pub fn send(&mut self, b: &[u8]) {
        self.send_raw(b).expect("send to the target");
    }

    /// ICReq, then the ICResp; digests as asked (the test target grants both).
    pub fn icreq(&mut self, digests: bool) -> ICResp {
        let req = ICReq {
            pfv: 0,
            hpda: 0,
            dgst: if digests { 3 } else { 0 },
            maxr2t: 0,
        };
        self.send(&req.encode());
        let p = self.expect_pdu("ICResp");
        assert_eq!(
            p.kind(),
            Some(PduType::ICResp),
            "expected ICResp, got {:?}",
            p.ch
        );
        assert_eq!((p.ch.hlen, p.ch.plen), (128, 128), "ICResp lengths");
        let resp = ICResp::decode(&p.bytes).expect("ICResp decodes");
        assert_eq!(resp.pfv, 0);
        assert_eq!(resp.cpda, 0);
        self.hdgst = resp.dgst & 1 != 0;
        self.ddgst = resp.dgst & 2 != 0;
        assert_eq!(self.hdgst, digests, "header digest negotiated as asked");
        assert_eq!(self.ddgst, digests, "data digest negotiated as asked");
        self.maxh2cdata = resp.maxh2cdata;
        resp
    }

    fn hd(&self) -> usize {
        if self.hdgst { 4 } else { 0 }
    }

    /// A CapsuleCmd PDU with digests as negotiated.
    pub fn capsule_pdu(&self, sqe: &Sqe, data: &[u8]) -> Vec<u8> {
        let hd = self.hd();
        let dd = if self.ddgst && !data.is_empty() { 4 } else { 0 };
        let hlen = 72;
        let pdo = if data.is_empty() { 0 } else { hlen + hd };
        let plen = hlen + hd + data.len() + dd;
        let mut b = vec![0u8; plen];
        let mut flags = 0;
        if hd > 0 {
            flags |= FLAG_HDGSTF;
        }
        if dd > 0 {
            flags |= FLAG_DDGSTF;
        }
        CommonHeader {
            pdu_type: PduType::CapsuleCmd as u8,
            flags,
            hlen: hlen as u8,
            pdo: pdo as u8,
            plen: plen as u32,
        }
        .encode(&mut b);
        b[CH_LEN..hlen].copy_from_slice(&sqe.encode());
        if hd > 0 {
            let d = crc32c(&b[..hlen]);
            b[hlen..hlen + 4].copy_from_slice(&d.to_le_bytes());
        }
        if !data.is_empty() {
            b[pdo..pdo + data.len()].copy_from_slice(data);
            if dd > 0 {
                let d = data_digest(data);
                b[pdo + data.len()..].copy_from_slice(&d.to_le_bytes());
            }
        }
        b
    }

    /// An H2CData PDU with digests as negotiated.
    pub fn h2c_pdu(&self, cccid: u16, ttag: u16, datao: u32, data: &[u8], last: bool) -> Vec<u8> {
        let hd = self.hd();
        let dd = if self.ddgst { 4 } else { 0 };
        let pdo = 24 + hd;
        let plen = pdo + data.len() + dd;
        let mut b = vec![0u8; plen];
        let mut flags = if last { FLAG_LAST_PDU } else { 0 };
        if hd > 0 {
            flags |= FLAG_HDGSTF;
        }
        if dd > 0 {
            flags |= FLAG_DDGSTF;
        }
        H2CDataHdr {
            cccid,
            ttag,
            datao,
            datal: data.len() as u32,
        }
        .encode(
            &mut b,
            CommonHeader {
                pdu_type: PduType::H2CData as u8,
                flags,
                hlen: 24,
                pdo: pdo as u8,
                plen: plen as u32,
            },
        );
        if hd > 0 {
            let d = crc32c(&b[..24]);
            b[24..28].copy_from_slice(&d.to_le_bytes());
        }
        b[pdo..pdo + data.len()].copy_from_slice(data);
        if dd > 0 {
            let d = data_digest(data);
            b[pdo + data.len()..].copy_from_slice(&d.to_le_bytes());
        }
        b
    }

    pub fn try_send_capsule(&mut self, sqe: &Sqe, data: &[u8]) -> Result<(), String> {
        let b = self.capsule_pdu(sqe, data);
        self.send_raw(&b).map_err(|e| format!("send capsule: {e}"))
    }

    pub fn send_capsule(&mut self, sqe: &Sqe, data: &[u8]) {
        let b = self.capsule_pdu(sqe, data);
        self.send(&b);
    }

    /// Reads the next PDU (checking its header digest when it carries one).
    pub fn recv_pdu(&mut self) -> Result<Pdu, RecvError> {
        let mut h = [0u8; CH_LEN];
        read_full(&mut self.s, &mut h)?;
        let ch = CommonHeader::decode(&h).expect("8 bytes");
        let plen = ch.plen as usize;
        assert!(
            (CH_LEN..=(MAX_TRANSFER as usize + 4096)).contains(&plen),
            "target sent a PDU with absurd plen: {ch:?}"
        );
        let mut bytes = vec![0u8; plen];
        bytes[..CH_LEN].copy_from_slice(&h);
        read_full(&mut self.s, &mut bytes[CH_LEN..])?;
        if ch.flags & FLAG_HDGSTF != 0 {
            let hlen = usize::from(ch.hlen);
            assert!(plen >= hlen + 4, "header digest flag without room: {ch:?}");
            let want = crc32c(&bytes[..hlen]);
            let got = u32::from_le_bytes(bytes[hlen..hlen + 4].try_into().expect("4"));
            assert_eq!(got, want, "target's header digest is wrong on {ch:?}");
        }
        Ok(Pdu { ch, bytes })
    }

    pub fn expect_pdu(&mut self, what: &str) -> Pdu {
        match self.recv_pdu() {
            Ok(p) => p,
            Err(e) => panic!("waiting for {what}: {e}"),
        }
    }

    pub fn try_expect_resp(&mut self) -> Result<Cqe, String> {
        let p = self
            .recv_pdu()
            .map_err(|e| format!("waiting for CapsuleResp: {e}"))?;
        pdu_to_cqe(&p)
    }

    /// The next PDU must be a CapsuleResp; returns its CQE.
    pub fn expect_resp(&mut self) -> Cqe {
        match self.try_expect_resp() {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    /// The next PDU must be a CapsuleResp for `cid` with status (sct, sc).
    pub fn expect_status(&mut self, cid: u16, sct: u8, sc: u8) -> Cqe {
        let c = self.expect_resp();
        assert_eq!(c.cid, cid, "CapsuleResp for another command: {c:?}");
        assert_status(&c, sct, sc, "");
        c
    }

    /// The next PDU must be a C2HTermReq with `fes` (and `fei` when given),
    /// then the target must close the connection.
    pub fn expect_term(&mut self, fes: u16, fei: Option<u32>) -> TermReq {
        let p = self.expect_pdu("C2HTermReq");
        assert_eq!(
            p.kind(),
            Some(PduType::C2HTermReq),
            "expected a C2HTermReq, got {:?}",
            p.ch
        );
        assert_eq!(p.ch.hlen, 24, "C2HTermReq hlen");
        assert!(
            (24..=152).contains(&p.ch.plen),
            "C2HTermReq plen {}",
            p.ch.plen
        );
        let t = TermReq::decode(&p.bytes).expect("TermReq decodes");
        assert_eq!(t.fes, fes, "TermReq FES (FEI {})", t.fei);
        if let Some(fei) = fei {
            assert_eq!(t.fei, fei, "TermReq FEI (FES {})", t.fes);
        }
        self.expect_closed();
        t
    }

    /// The target must close the connection (EOF or reset) within the timeout,
    /// sending nothing more.
    pub fn expect_closed(&mut self) {
        let mut b = [0u8; 256];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return,
                Ok(n) => panic!(
                    "expected the connection closed, got {n} more bytes: {:02x?}",
                    &b[..n]
                ),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => match classify(e) {
                    RecvError::Closed => return,
                    RecvError::Timeout => {
                        panic!("the target did not close the connection within {READ_TIMEOUT:?}")
                    }
                    RecvError::Other(e) => panic!("socket error while waiting for close: {e}"),
                },
            }
        }
    }

    /// Whether nothing arrives for `d` and the connection stays open.
    pub fn quiet_for(&mut self, d: Duration) -> bool {
        self.s.set_read_timeout(Some(d)).expect("timeout");
        let mut b = [0u8; 1];
        let r = self.s.peek(&mut b);
        self.s
            .set_read_timeout(Some(READ_TIMEOUT))
            .expect("timeout");
        matches!(r, Err(ref e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
    }

    // ---- Fabrics

    /// A Connect SQE with in-capsule Connect data.
    pub fn connect_sqe(&mut self, qid: u16, sqsize: u16, kato_ms: u32) -> Sqe {
        let cid = self.next_cid();
        let mut s = ConnectCmd {
            recfmt: 0,
            qid,
            sqsize,
            cattr: 0,
            kato_ms,
        }
        .to_sqe(cid);
        s.sgl = SglDesc {
            addr: 0,
            length: 1024,
            type_byte: SGL_DATA_BLOCK_OFFSET,
        };
        s
    }

    pub fn connect_data(cntlid: u16, subnqn: &str, hostnqn: &str) -> [u8; 1024] {
        ConnectData {
            hostid: [0xAB; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .encode()
    }

    /// Admin Connect; returns the CQE whatever its status.
    pub fn connect_admin(&mut self, subnqn: &str, hostnqn: &str, kato_ms: u32) -> Cqe {
        let sqe = self.connect_sqe(0, 31, kato_ms);
        let data = Self::connect_data(CNTLID_DYNAMIC, subnqn, hostnqn);
        self.send_capsule(&sqe, &data);
        let c = self.expect_resp();
        assert_eq!(c.cid, sqe.cid);
        c
    }

    /// Admin Connect that must succeed; remembers the controller ID.
    pub fn connect_admin_ok(&mut self, subnqn: &str, hostnqn: &str, kato_ms: u32) -> u16 {
        let c = self.connect_admin(subnqn, hostnqn, kato_ms);
        assert_status(&c, 0, 0, "admin Connect");
        self.cntlid = c.dw0 as u16;
        self.cntlid
    }

    /// I/O queue Connect; returns the CQE whatever its status.
    pub fn connect_io(&mut self, cntlid: u16, qid: u16, subnqn: &str, hostnqn: &str) -> Cqe {
        let sqe = self.connect_sqe(qid, 31, 0);
        let data = Self::connect_data(cntlid, subnqn, hostnqn);
        self.send_capsule(&sqe, &data);
        let c = self.expect_resp();
        assert_eq!(c.cid, sqe.cid);
        c
    }

    pub fn property_get(&mut self, offset: u32, size8: bool) -> Cqe {
        let cid = self.next_cid();
        let sqe = PropertyCmd {
            size8,
            offset,
            value: 0,
        }
        .to_sqe(fctype::PROPERTY_GET, cid);
        self.send_capsule(&sqe, &[]);
        let c = self.expect_resp();
        assert_eq!(c.cid, cid);
        c
    }

    pub fn property_set(&mut self, offset: u32, size8: bool, value: u64) -> Cqe {
        let cid = self.next_cid();
        let sqe = PropertyCmd {
            size8,
            offset,
            value,
        }
        .to_sqe(fctype::PROPERTY_SET, cid);
        self.send_capsule(&sqe, &[]);
        let c = self.expect_resp();
        assert_eq!(c.cid, cid);
        c
    }

    /// Property Set CC.EN = 1, which must succeed and make CSTS.RDY = 1.
    pub fn enable(&mut self) {
        let c = self.property_set(prop::CC, false, CC_ENABLE);
        assert_status(&c, 0, 0, "Property Set CC.EN");
        let c = self.property_get(prop::CSTS, false);
        assert_status(&c, 0, 0, "Property Get CSTS");
        assert_eq!(
            c.dw0 & prop::CSTS_RDY,
            prop::CSTS_RDY,
            "CSTS.RDY after CC.EN"
        );
    }

    /// Set Features Number of Queues; returns the CQE.
    pub fn set_num_queues(&mut self, n: u16) -> Cqe {
        let cid = self.next_cid();
        let mut sqe = Sqe::new(admin_opc::SET_FEATURES, cid);
        sqe.cdw10 = 0x07;
        let v = u32::from(n - 1);
        sqe.cdw11 = v | (v << 16);
        self.send_capsule(&sqe, &[]);
        let c = self.expect_resp();
        assert_eq!(c.cid, cid);
        c
    }

    // ---- I/O

    pub fn rw_sqe(&mut self, opcode: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
        let cid = self.next_cid();
        let mut s = Sqe::new(opcode, cid);
        s.nsid = nsid;
        s.cdw10 = slba as u32;
        s.cdw11 = (slba >> 32) as u32;
        s.cdw12 = nlb.wrapping_sub(1) & 0xFFFF;
        s
    }

    /// A Write of `data` at `slba`: in-capsule when it fits, else R2T/H2CData.
    pub fn try_write(&mut self, nsid: u32, slba: u64, data: &[u8]) -> Result<Cqe, String> {
        let nlb = (data.len() / BLOCK as usize) as u32;
        let mut sqe = self.rw_sqe(io_opc::WRITE, nsid, slba, nlb);
        if data.len() as u32 <= self.icd {
            sqe.sgl = SglDesc {
                addr: 0,
                length: data.len() as u32,
                type_byte: SGL_DATA_BLOCK_OFFSET,
            };
            self.try_send_capsule(&sqe, data)?;
            return self.try_expect_resp();
        }
        sqe.sgl = SglDesc {
            addr: 0,
            length: data.len() as u32,
            type_byte: SGL_TRANSPORT_DATA_BLOCK,
        };
        self.try_send_capsule(&sqe, &[])?;
        let p = self
            .recv_pdu()
            .map_err(|e| format!("waiting for R2T: {e}"))?;
        if p.kind() != Some(PduType::R2T) {
            // A refusal before any data moved.
            return pdu_to_cqe(&p);
        }
        let r = R2THdr::decode(&p.bytes).map_err(|e| format!("R2T: {e}"))?;
        if r.cccid != sqe.cid || r.r2to != 0 || r.r2tl as usize != data.len() {
            return Err(format!(
                "unexpected R2T {r:?} for cid {} len {}",
                sqe.cid,
                data.len()
            ));
        }
        let chunk = self.maxh2cdata.max(4096) as usize;
        let mut off = 0;
        while off < data.len() {
            let n = chunk.min(data.len() - off);
            let last = off + n == data.len();
            let b = self.h2c_pdu(sqe.cid, r.ttag, off as u32, &data[off..off + n], last);
            self.send_raw(&b)
                .map_err(|e| format!("send H2CData: {e}"))?;
            off += n;
        }
        self.try_expect_resp()
    }

    pub fn write(&mut self, nsid: u32, slba: u64, data: &[u8]) -> Cqe {
        match self.try_write(nsid, slba, data) {
            Ok(c) => c,
            Err(e) => panic!("write: {e}"),
        }
    }

    /// A Read of `nlb` blocks: C2HData PDUs then the CapsuleResp.
    pub fn try_read(&mut self, nsid: u32, slba: u64, nlb: u32) -> Result<(Cqe, Vec<u8>), String> {
        let mut sqe = self.rw_sqe(io_opc::READ, nsid, slba, nlb);
        let len = nlb as usize * BLOCK as usize;
        sqe.sgl = SglDesc {
            addr: 0,
            length: len as u32,
            type_byte: SGL_TRANSPORT_DATA_BLOCK,
        };
        self.try_send_capsule(&sqe, &[])?;
        let mut out = vec![0u8; len];
        let mut got = 0usize;
        loop {
            let p = self
                .recv_pdu()
                .map_err(|e| format!("waiting for read data: {e}"))?;
            match p.kind() {
                Some(PduType::C2HData) => {
                    let h = C2HDataHdr::decode(&p.bytes).map_err(|e| format!("C2HData: {e}"))?;
                    let (o, l) = (h.datao as usize, h.datal as usize);
                    let pdo = usize::from(p.ch.pdo);
                    if h.cccid != sqe.cid || o != got || o + l > len || pdo + l > p.bytes.len() {
                        return Err(format!(
                            "bad C2HData {h:?} pdo {pdo} for cid {} len {len}",
                            sqe.cid
                        ));
                    }
                    let data = &p.bytes[pdo..pdo + l];
                    if p.ch.flags & FLAG_DDGSTF != 0 {
                        let want = data_digest(data);
                        let d = &p.bytes[pdo + l..];
                        if d.len() < 4 || u32::from_le_bytes(d[..4].try_into().expect("4")) != want
                        {
                            return Err("target's data digest is wrong".into());
                        }
                    }
                    out[o..o + l].copy_from_slice(data);
                    got += l;
                }
                _ => {
                    let c = pdu_to_cqe(&p)?;
                    if c.cid != sqe.cid {
                        return Err(format!(
                            "CapsuleResp for cid {} while reading cid {}",
                            c.cid, sqe.cid
                        ));
                    }
                    if c.status.is_success() && got != len {
                        return Err(format!("read completed with {got} of {len} bytes"));
                    }
                    return Ok((c, out));
                }
            }
        }
    }

    pub fn read(&mut self, nsid: u32, slba: u64, nlb: u32) -> (Cqe, Vec<u8>) {
        match self.try_read(nsid, slba, nlb) {
            Ok(r) => r,
            Err(e) => panic!("read: {e}"),
        }
    }

    /// Reads PDUs until the target closes, for `within` at most. Returns the
    /// PDUs seen, or an error if the connection stayed open.
    pub fn drain_until_closed(&mut self, within: Duration) -> Result<Vec<Pdu>, String> {
        let end = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "still open after {within:?}; saw {} PDUs",
                    seen.len()
                ));
            }
            self.s.set_read_timeout(Some(left)).expect("timeout");
            match self.recv_pdu() {
                Ok(p) => seen.push(p),
                Err(RecvError::Closed) => return Ok(seen),
                Err(RecvError::Timeout) => {
                    return Err(format!(
                        "still open after {within:?}; saw {} PDUs",
                        seen.len()
                    ));
                }
                Err(RecvError::Other(e)) => return Err(format!("socket error: {e}")),
            }
        }
    }

    // ---- Host identifiers and commands with data (reservation tests)

    /// Connect data with an explicit 128-bit Host Identifier.
    pub fn connect_data_hostid(
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
        hostid: [u8; 16],
    ) -> [u8; 1024] {
        ConnectData {
            hostid,
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .encode()
    }

    /// Admin Connect with `hostid`; returns the CQE whatever its status.
    pub fn connect_admin_hostid(&mut self, subnqn: &str, hostnqn: &str, hostid: [u8; 16]) -> Cqe {
        let sqe = self.connect_sqe(0, 31, 0);
        let data = Self::connect_data_hostid(CNTLID_DYNAMIC, subnqn, hostnqn, hostid);
        self.send_capsule(&sqe, &data);
        let c = self.expect_resp();
        assert_eq!(c.cid, sqe.cid);
        c
    }

    /// I/O queue Connect with `hostid`; returns the CQE whatever its status.
    pub fn connect_io_hostid(
        &mut self,
        cntlid: u16,
        qid: u16,
        subnqn: &str,
        hostnqn: &str,
        hostid: [u8; 16],
    ) -> Cqe {
        let sqe = self.connect_sqe(qid, 31, 0);
        let data = Self::connect_data_hostid(cntlid, subnqn, hostnqn, hostid);
        self.send_capsule(&sqe, &data);
        let c = self.expect_resp();
        assert_eq!(c.cid, sqe.cid);
        c
    }

    /// Sends `sqe` with `data` for the target: in capsule when `in_capsule`,
    /// else by R2T/H2CData (the SGL is set here to `data.len()`). Returns the
    /// CQE; an R2T that does not ask for exactly `data` is an error.
    pub fn try_data_out(
        &mut self,
        mut sqe: Sqe,
        data: &[u8],
        in_capsule: bool,
    ) -> Result<Cqe, String> {
        sqe.sgl = SglDesc {
            addr: 0,
            length: data.len() as u32,
            type_byte: if in_capsule {
                SGL_DATA_BLOCK_OFFSET
            } else {
                SGL_TRANSPORT_DATA_BLOCK
            },
        };
        if in_capsule {
            self.try_send_capsule(&sqe, data)?;
            return self.try_expect_resp();
        }
        self.try_send_capsule(&sqe, &[])?;
        let p = self
            .recv_pdu()
            .map_err(|e| format!("waiting for R2T: {e}"))?;
        if p.kind() != Some(PduType::R2T) {
            return pdu_to_cqe(&p);
        }
        let r = R2THdr::decode(&p.bytes).map_err(|e| format!("R2T: {e}"))?;
        if r.cccid != sqe.cid || r.r2to != 0 || r.r2tl as usize != data.len() {
            return Err(format!(
                "unexpected R2T {r:?} for cid {} len {}",
                sqe.cid,
                data.len()
            ));
        }
        let b = self.h2c_pdu(sqe.cid, r.ttag, 0, data, true);
        self.send_raw(&b)
            .map_err(|e| format!("send H2CData: {e}"))?;
        self.try_expect_resp()
    }

    pub fn data_out(&mut self, sqe: Sqe, data: &[u8], in_capsule: bool) -> Cqe {
        match self.try_data_out(sqe, data, in_capsule) {
            Ok(c) => c,
            Err(e) => panic!("command 0x{:02x} with data: {e}", sqe.opcode),
        }
    }

    /// Sends `sqe` with a transport SGL of `len` bytes and collects the
    /// C2HData it returns. Returns the CQE and the bytes received (their
    /// count is what the target actually sent, which may be under `len`).
    pub fn try_data_in(&mut self, mut sqe: Sqe, len: u32) -> Result<(Cqe, Vec<u8>), String> {
        sqe.sgl = SglDesc {
            addr: 0,
            length: len,
            type_byte: SGL_TRANSPORT_DATA_BLOCK,
        };
        self.try_send_capsule(&sqe, &[])?;
        let mut out = Vec::new();
        loop {
            let p = self
                .recv_pdu()
                .map_err(|e| format!("waiting for data or a CapsuleResp: {e}"))?;
            if p.kind() != Some(PduType::C2HData) {
                let c = pdu_to_cqe(&p)?;
                if c.cid != sqe.cid {
                    return Err(format!(
                        "CapsuleResp for cid {} while waiting on cid {}",
                        c.cid, sqe.cid
                    ));
                }
                return Ok((c, out));
            }
            let h = C2HDataHdr::decode(&p.bytes).map_err(|e| format!("C2HData: {e}"))?;
            let (o, l) = (h.datao as usize, h.datal as usize);
            let pdo = usize::from(p.ch.pdo);
            if h.cccid != sqe.cid
                || o != out.len()
                || o + l > len as usize
                || pdo + l > p.bytes.len()
            {
                return Err(format!(
                    "bad C2HData {h:?} pdo {pdo} for cid {} len {len}",
                    sqe.cid
                ));
            }
            let data = &p.bytes[pdo..pdo + l];
            if p.ch.flags & FLAG_DDGSTF != 0 {
                let d = &p.bytes[pdo + l..];
                if d.len() < 4
                    || u32::from_le_bytes(d[..4].try_into().expect("4")) != data_digest(data)
                {
                    return Err("target's data digest is wrong".into());
                }
            }
            out.extend_from_slice(data);
        }
    }

    pub fn data_in(&mut self, sqe: Sqe, len: u32) -> (Cqe, Vec<u8>) {
        match self.try_data_in(sqe, len) {
            Ok(r) => r,
            Err(e) => panic!("command 0x{:02x} returning data: {e}", sqe.opcode),
        }
    }

    pub fn half_close(&mut self) {
        let _ = self.s.shutdown(Shutdown::Write);
    }
}

fn read_full(s: &mut TcpStream, b: &mut [u8]) -> Result<(), RecvError> {
    let mut off = 0;
    while off < b.len() {
        match s.read(&mut b[off..]) {
            Ok(0) => return Err(RecvError::Closed),
            Ok(n) => off += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(classify(e)),
        }
    }
    Ok(())
}

/// The CQE of a CapsuleResp PDU, or an error naming what came instead.
pub fn pdu_to_cqe(p: &Pdu) -> Result<Cqe, String> {
    match p.kind() {
        Some(PduType::CapsuleResp) => {
            if p.ch.hlen != 24 {
                return Err(format!("CapsuleResp with hlen {}", p.ch.hlen));
            }
            Cqe::decode(&p.bytes[CH_LEN..]).map_err(|e| format!("CQE: {e}"))
        }
        Some(PduType::C2HTermReq) => {
            let t = TermReq::decode(&p.bytes).map_err(|e| e.to_string())?;
            Err(format!(
                "expected a CapsuleResp, got C2HTermReq FES {} FEI {}",
                t.fes, t.fei
            ))
        }
        _ => Err(format!("expected a CapsuleResp, got {:?}", p.ch)),
    }
}

/// Panics unless the CQE has status (sct, sc).
pub fn assert_status(c: &Cqe, sct: u8, sc: u8, what: &str) {
    assert_eq!(
        (c.status.sct, c.status.sc),
        (sct, sc),
        "{what}: expected SCT {sct:#x} SC {sc:#x}, got {:?} (dw0 {:#x})",
        c.status,
        c.dw0
    );
}

/// The status a test expects: a generic error with DNR set.
pub fn generic_dnr(sc: u8) -> Status {
    Status::generic(sc)
}
