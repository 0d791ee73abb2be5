//! `remote::RemoteDevice` against in-process flashpool targets, some behind
//! a TCP proxy the test can freeze, cut, take down and point elsewhere.
//! Timing margins are generous: the machine is slow and shared.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use blockdev::{
    AlignedBuf, BlockDevice, BlockError, BlockOp, IoDone, IoFuture, IoRequest, MemDevice,
};
use nvmf_host::remote::{LinkState, RemoteDevice, RemoteOptions};
use nvmf_host::{HostOptions, ResvType, zeroed_buf};
use nvmf_target::{
    ListenerConfig, ListenerKind, Namespace, Server, Subsystem, Target, TransportConfig,
};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const NQN: &str = "nqn.2026-01.io.flashpool:remote-test";
const NS_BYTES: u64 = 64 << 20;
const BS: usize = 512;

struct Node {
    server: Option<Server>,
}

impl Node {
    /// A target with one 512 B-block RAM namespace whose NGUID is `[id; 16]`.
    fn start(id: u8, max_transfer: u32) -> Node {
        let dev = Arc::new(MemDevice::new(NS_BYTES, BS as u32).unwrap());
        let ns = Namespace::new(1, dev, [id ^ 0x55; 16], [id; 16]);
        let sub = Subsystem::new(
            NQN.into(),
            format!("SN-{id}"),
            "flashpool remote test".into(),
            true,
            Vec::new(),
            vec![ns],
        );
        let transport = TransportConfig {
            max_transfer,
            max_queue_depth: 64,
            max_io_queues: 4,
            ..TransportConfig::default()
        };
        let target = Arc::new(Target::new(transport, vec![Arc::new(sub)]));
        let listener = ListenerConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            kind: ListenerKind::Io,
            tls: nvmf_target::TlsMode::None,
        };
        Node {
            server: Some(Server::start(target, &[listener]).unwrap()),
        }
    }

    fn addr(&self) -> SocketAddr {
        self.server.as_ref().unwrap().local_addrs()[0].0
    }

    fn controllers(&self) -> usize {
        self.server.as_ref().unwrap().target().controller_count()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

/// A TCP proxy: forwards to `upstream` unless down, frozen (holds the bytes) or cut.
struct Proxy {
    addr: SocketAddr,
    upstream: Arc<Mutex<SocketAddr>>,
    up: Arc<AtomicBool>,
    frozen: Arc<AtomicBool>,
    pumps: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let upstream = Arc::new(Mutex::new(upstream));
        let up = Arc::new(AtomicBool::new(true));
        let frozen = Arc::new(AtomicBool::new(false));
        let pumps = Arc::new(Mutex::new(Vec::new()));
        let (upstream2, up2, frozen2, pumps2) =
            (upstream.clone(), up.clone(), frozen.clone(), pumps.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((a, _)) = l.accept().await else { return };
                if !up.load(Ordering::SeqCst) {
                    continue; // dropped: the host sees the connection closed
                }
                let to = *upstream.lock();
                let Ok(b) = TcpStream::connect(to).await else {
                    continue;
                };
                let (ar, aw) = a.into_split();
                let (br, bw) = b.into_split();
                let mut v = pumps.lock();
                v.push(tokio::spawn(pump(ar, bw, frozen.clone())));
                v.push(tokio::spawn(pump(br, aw, frozen.clone())));
            }
        });
        Proxy {
            addr,
            upstream: upstream2,
            up: up2,
            frozen: frozen2,
            pumps: pumps2,
            accept,
        }
    }

    /// Drops every forwarded connection.
    fn cut(&self) {
        for t in self.pumps.lock().drain(..) {
            t.abort();
        }
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
        if !up {
            self.cut();
        }
    }

    fn freeze(&self, f: bool) {
        self.frozen.store(f, Ordering::SeqCst);
    }

    fn switch(&self, to: SocketAddr) {
        *self.upstream.lock() = to;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn pump(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut b = vec![0u8; 64 * 1024];
    loop {
        while frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let n = match r.read(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if w.write_all(&b[..n]).await.is_err() {
            return;
        }
    }
}

fn url(addr: SocketAddr) -> String {
    format!("tcp://{addr}/{NQN}?nsid=1")
}

fn opts(hostid: u8) -> RemoteOptions {
    RemoteOptions {
        host: HostOptions {
            hostnqn: format!(
                "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000{hostid:02x}"
            ),
            hostid: [hostid; 16],
            queue_depth: 32,
            timeout: Duration::from_secs(5),
            ..HostOptions::default()
        },
        fail_after: Duration::from_secs(10),
        ..RemoteOptions::default()
    }
}

fn pattern(len: usize, seed: u64) -> AlignedBuf {
    let mut b = zeroed_buf(len);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for v in b.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *v = x as u8;
    }
    b
}

async fn io(dev: &dyn BlockDevice, op: BlockOp, lba: u64, blocks: u32, buf: AlignedBuf) -> IoDone {
    dev.submit(IoRequest {
        op,
        lba,
        blocks,
        buf,
    })
    .await
}

async fn write(dev: &dyn BlockDevice, lba: u64, data: AlignedBuf) -> Result<(), BlockError> {
    let blocks = (data.len() / BS) as u32;
    io(dev, BlockOp::Write { fua: false }, lba, blocks, data)
        .await
        .result
}

async fn read(dev: &dyn BlockDevice, lba: u64, blocks: u32) -> Result<AlignedBuf, BlockError> {
    let d = io(
        dev,
        BlockOp::Read,
        lba,
        blocks,
        zeroed_buf(blocks as usize * BS),
    )
    .await;
    d.result.map(|()| d.buf)
}

async fn wait_state(dev: &RemoteDevice, what: &str, f: impl Fn(&LinkState) -> bool) {
    let mut rx = dev.subscribe();
    tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|s| f(s)))
        .await
        .unwrap_or_else(|_| panic!("link never became {what}; it is {:?}", dev.link_state()))
        .unwrap();
}

#[tokio::test]
async fn read_write_verify_all_ops() {
    let node = Node::start(1, 1 << 20);
    let dev = RemoteDevice::connect(&url(node.addr()), opts(1))
        .await
        .unwrap();
    let geo = dev.geometry();
    assert_eq!((geo.block_size, geo.num_blocks), (512, NS_BYTES / 512));
    assert_eq!(
        dev.describe(),
        format!("remote {} (2 queues)", url(node.addr()))
    );
    assert!(!dev.keeps_records());
    assert_eq!(dev.link_state(), LinkState::Connected);
    let id = dev.identity().unwrap();
    assert_eq!(
        (id.nguid, id.uuid, id.subnqn.as_str()),
        ([1; 16], Some([0x54; 16]), NQN)
    );
    for (i, blocks) in [1u32, 8, 9, 64, 2048].into_iter().enumerate() {
        let lba = i as u64 * 4096;
        write(&dev, lba, pattern(blocks as usize * BS, lba))
            .await
            .unwrap();
        let back = read(&dev, lba, blocks).await.unwrap();
        assert!(
            back[..] == pattern(blocks as usize * BS, lba)[..],
            "{blocks} blocks"
        );
    }
    // FUA, flush, write zeroes, deallocate.
    let d = io(&dev, BlockOp::Write { fua: true }, 100, 2, pattern(1024, 7)).await;
    d.result.unwrap();
    io(&dev, BlockOp::Flush, 0, 0, AlignedBuf::empty())
        .await
        .result
        .unwrap();
    io(&dev, BlockOp::WriteZeroes, 0, 8, AlignedBuf::empty())
        .await
        .result
        .unwrap();
    assert!(read(&dev, 0, 8).await.unwrap().iter().all(|&b| b == 0));
    io(&dev, BlockOp::Deallocate, 4096, 8, AlignedBuf::empty())
        .await
        .result
        .unwrap();
    if dev.deallocate_reads_zeroes() {
        assert!(read(&dev, 4096, 8).await.unwrap().iter().all(|&b| b == 0));
    }
    // Out of range is refused before it goes out.
    let e = read(&dev, geo.num_blocks - 1, 2).await.unwrap_err();
    assert!(matches!(e, BlockError::OutOfRange { .. }), "{e}");
    // Polled by another executor on another thread (a target reactor would).
    let dev = Arc::new(dev);
    let d2 = dev.clone();
    let back = std::thread::spawn(move || {
        let done = blockdev::block_on(d2.submit(IoRequest {
            op: BlockOp::Read,
            lba: 100,
            blocks: 2,
            buf: zeroed_buf(1024),
        }));
        done.result.unwrap();
        done.buf
    })
    .join()
    .unwrap();
    assert!(back[..] == pattern(1024, 7)[..]);
    assert_eq!(dev.connects(), 1);
}

#[tokio::test]
async fn requests_over_mdts_are_split() {
    // MDTS 64 KiB: 128 blocks of 512 B per command.
    let node = Node::start(2, 64 << 10);
    let dev = RemoteDevice::connect(&url(node.addr()), opts(2))
        .await
        .unwrap();
    let blocks = 128 * 5 + 3;
    write(&dev, 10, pattern(blocks * BS, 1)).await.unwrap();
    let back = read(&dev, 10, blocks as u32).await.unwrap();
    assert!(back[..] == pattern(blocks * BS, 1)[..]);
    // Pieces read through single commands agree.
    let piece = read(&dev, 10 + 128, 128).await.unwrap();
    assert!(piece[..] == pattern(blocks * BS, 1)[128 * BS..256 * BS]);
    // Write Zeroes over more than 65536 blocks.
    io(&dev, BlockOp::WriteZeroes, 0, 70_000, AlignedBuf::empty())
        .await
        .result
        .unwrap();
    assert!(read(&dev, 10, 128).await.unwrap().iter().all(|&b| b == 0));
}

#[tokio::test]
async fn keep_alive_holds_an_idle_link() {
    let node = Node::start(3, 1 << 20);
    let o = RemoteOptions {
        kato: Duration::from_secs(1),
        ..opts(3)
    };
    let dev = RemoteDevice::connect(&url(node.addr()), o).await.unwrap();
    // Idle for three keep-alive timeouts: the target would drop a silent host.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(dev.link_state(), LinkState::Connected);
    assert_eq!(dev.connects(), 1, "no reconnect was needed");
    assert_eq!(node.controllers(), 1);
    write(&dev, 0, pattern(4096, 3)).await.unwrap();
}

#[tokio::test]
async fn in_flight_io_is_retried_on_a_new_connection() {
    let node = Node::start(4, 1 << 20);
    let proxy = Proxy::start(node.addr()).await;
    let dev = Arc::new(
        RemoteDevice::connect(&url(proxy.addr), opts(4))
            .await
            .unwrap(),
    );
    proxy.freeze(true);
    let writes: Vec<_> = (0..8u64)
        .map(|i| {
            let d = dev.clone();
            tokio::spawn(async move { write(&*d, i * 64, pattern(8 * BS, i)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.cut();
    proxy.freeze(false);
    for w in writes {
        w.await.unwrap().unwrap();
    }
    assert!(
        dev.connects() >= 2,
        "the writes went out again on a new connection"
    );
    for i in 0..8u64 {
        let back = read(&*dev, i * 64, 8).await.unwrap();
        assert!(back[..] == pattern(8 * BS, i)[..]);
    }
    assert_eq!(dev.link_state(), LinkState::Connected);
}

#[tokio::test]
async fn unreachable_past_fail_after_then_back() {
    let node = Node::start(5, 1 << 20);
    let proxy = Proxy::start(node.addr()).await;
    let o = RemoteOptions {
        fail_after: Duration::from_millis(1000),
        io_timeout: Duration::from_secs(2),
        ..opts(5)
    };
    let dev = RemoteDevice::connect(&url(proxy.addr), o).await.unwrap();
    let mut rx = dev.subscribe();
    write(&dev, 0, pattern(4096, 5)).await.unwrap();
    proxy.set_up(false);
    // Waits through the reconnect attempts, then fails as unreachable.
    let start = Instant::now();
    let e = read(&dev, 0, 8).await.unwrap_err();
    assert!(matches!(e, BlockError::Unreachable { .. }), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert!(e.to_string().contains(&url(proxy.addr)), "{e}");
    assert!(matches!(dev.link_state(), LinkState::Down { .. }));
    // While down, new I/O fails without waiting.
    let f = dev.submit(IoRequest {
        op: BlockOp::Read,
        lba: 0,
        blocks: 1,
        buf: zeroed_buf(512),
    });
    assert!(matches!(f, IoFuture::Ready(_)));
    assert!(matches!(
        f.await.result,
        Err(BlockError::Unreachable { .. })
    ));
    assert!(rx.has_changed().unwrap());
    proxy.set_up(true);
    wait_state(&dev, "connected", |s| *s == LinkState::Connected).await;
    let back = read(&dev, 0, 8).await.unwrap();
    assert!(back[..] == pattern(4096, 5)[..]);
    assert!(rx.borrow_and_update().clone() == LinkState::Connected);
}

#[tokio::test]
async fn another_namespace_behind_the_url_is_refused() {
    let a = Node::start(6, 1 << 20);
    let b = Node::start(7, 1 << 20);
    let proxy = Proxy::start(a.addr()).await;
    let dev = RemoteDevice::connect(&url(proxy.addr), opts(6))
        .await
        .unwrap();
    write(&dev, 0, pattern(4096, 6)).await.unwrap();
    proxy.switch(b.addr());
    proxy.cut();
    let e = write(&dev, 0, pattern(4096, 7)).await.unwrap_err();
    let BlockError::IdentityChanged(msg) = &e else {
        panic!("expected IdentityChanged, got {e}")
    };
    assert!(msg.contains(&url(proxy.addr)), "{msg}");
    assert!(msg.contains(&format!("nguid {}", "06".repeat(16))), "{msg}");
    assert!(msg.contains(&format!("nguid {}", "07".repeat(16))), "{msg}");
    assert!(matches!(
        dev.link_state(),
        LinkState::IdentityChanged { .. }
    ));
    let e = read(&dev, 0, 1).await.unwrap_err();
    assert!(matches!(e, BlockError::IdentityChanged(_)), "{e}");
}

#[tokio::test]
async fn preempted_owner_gets_reservation_conflict() {
    let node = Node::start(8, 1 << 20);
    let old = RemoteDevice::connect(&url(node.addr()), opts(0xA))
        .await
        .unwrap();
    let new = RemoteDevice::connect(&url(node.addr()), opts(0xB))
        .await
        .unwrap();
    let we = ResvType::WriteExclusive;
    old.register(0xA).await.unwrap();
    old.register(0xA).await.unwrap(); // again: still fine
    old.acquire(0xA, we).await.unwrap();
    write(&old, 0, pattern(4096, 8)).await.unwrap();
    new.register(0xB).await.unwrap();
    let e = write(&new, 0, pattern(4096, 9)).await.unwrap_err();
    assert!(matches!(e, BlockError::ReservationConflict(_)), "{e}");
    new.preempt_abort(0xB, 0xA, we).await.unwrap();
    let e = write(&old, 0, pattern(4096, 10)).await.unwrap_err();
    let BlockError::ReservationConflict(msg) = &e else {
        panic!("expected ReservationConflict, got {e}")
    };
    assert!(msg.contains("Reservation Conflict"), "{msg}");
    assert_eq!(old.connects(), 1, "a conflict is not a transport error");
    write(&new, 0, pattern(4096, 11)).await.unwrap();
    let st = new.report().await.unwrap();
    assert_eq!(st.rtype, Some(we));
    assert_eq!(st.holder().unwrap().hostid, [0xB; 16]);
    assert_eq!(st.key_of(&[0xA; 16]), None);
    new.release(0xB, we).await.unwrap();
    new.unregister(0xB).await.unwrap();
    assert!(old.report().await.unwrap().registrants.is_empty());
}

#[tokio::test]
async fn a_timed_out_command_reconnects_and_retries() {
    let node = Node::start(9, 1 << 20);
    let proxy = Proxy::start(node.addr()).await;
    let o = RemoteOptions {
        io_timeout: Duration::from_millis(1000),
        ..opts(9)
    };
    let dev = Arc::new(RemoteDevice::connect(&url(proxy.addr), o).await.unwrap());
    // A silent target: the write gets no answer and times out.
    proxy.freeze(true);
    let d = dev.clone();
    let w = tokio::spawn(async move { write(&*d, 64, pattern(4096, 9)).await });
    wait_state(&dev, "reconnecting", |s| {
        matches!(s, LinkState::Reconnecting { .. })
    })
    .await;
    proxy.freeze(false);
    w.await.unwrap().unwrap();
    assert!(dev.connects() >= 2);
    let back = read(&*dev, 64, 8).await.unwrap();
    assert!(back[..] == pattern(4096, 9)[..]);
}
