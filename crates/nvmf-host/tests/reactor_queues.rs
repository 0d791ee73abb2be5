//! Queues bound to reactors (`remote::bind_reactors`): I/O that a reactor
//! submits from async code goes to that reactor's own queue, and comes back
//! intact; I/O it submits inside `blockdev::block_on` (which runs none of
//! the reactor's tasks until it returns) goes to the shared queues and does
//! not hang; a queue is bound only once its reactor sends a steady load,
//! and again after a reconnect; none with `reactor_queues` off. Its own test
//! binary: the reactor registry is process-wide.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest, MemDevice};
use nvmf_host::HostOptions;
use nvmf_host::remote::{RemoteDevice, RemoteOptions, bind_reactors};
use nvmf_target::{
    FreeReason, ListenerConfig, ListenerKind, Namespace, Server, Subsystem, Target, TransportConfig,
};

const NQN: &str = "nqn.2026-01.io.flashpool:reactor-queues";

fn target() -> Server {
    let dev = Arc::new(MemDevice::new(16 << 20, 512).unwrap());
    let ns = Namespace::new(1, dev, [0x55; 16], [7; 16]);
    let sub = Subsystem::new(
        NQN.into(),
        "SN-RQ".into(),
        "reactor queue test".into(),
        true,
        Vec::new(),
        vec![ns],
    );
    let transport = TransportConfig {
        max_queue_depth: 64,
        max_io_queues: 4,
        ..TransportConfig::default()
    };
    let target = Arc::new(Target::new(transport, vec![Arc::new(sub)]));
    let l = ListenerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        kind: ListenerKind::Io,
        tls: nvmf_target::TlsMode::None,
    };
    Server::start(target, &[l]).unwrap()
}

fn pattern(len: usize, seed: u8) -> AlignedBuf {
    let mut b = AlignedBuf::new(len);
    b.set_len(len);
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    b
}

fn req(op: BlockOp, lba: u64, buf: AlignedBuf) -> IoRequest {
    IoRequest {
        op,
        lba,
        blocks: (buf.len() / 512) as u32,
        buf,
    }
}

/// `n` reads of block 0, 16 at a time.
async fn reads(dev: &RemoteDevice, n: usize) {
    for c in (0..n).collect::<Vec<_>>().chunks(16) {
        let all = c
            .iter()
            .map(|_| dev.submit(req(BlockOp::Read, 0, nvmf_host::zeroed_buf(4096))));
        for d in futures_util::future::join_all(all).await {
            d.result.unwrap();
        }
    }
}

async fn wait_bound(dev: &RemoteDevice) {
    let end = Instant::now() + Duration::from_secs(10);
    while dev.reactor_queues().0 == 0 {
        assert!(Instant::now() < end, "no reactor queue was bound in 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn a_reactor_uses_its_own_queue_and_block_on_the_shared_ones() {
    // A hang here is the bug this guards against: fail instead of waiting for CI's limit.
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(120));
        if !d.load(Ordering::Acquire) {
            eprintln!("reactor queue test hung for 120 s");
            std::process::abort();
        }
    });
    let server = target();
    let url = format!("tcp://{}/{NQN}?nsid=1", server.local_addrs()[0].0);
    // The reactor: a current-thread runtime driven by this test's thread.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    bind_reactors(&[rt.handle().clone()]);
    rt.block_on(async {
        let opts = RemoteOptions {
            host: HostOptions {
                queue_depth: 32,
                ..RemoteOptions::default().host
            },
            ..RemoteOptions::default()
        };
        let dev = RemoteDevice::connect(&url, opts).await.unwrap();
        // None until the reactor sends a steady load: a few requests (a
        // takeover's checks) open no more connections.
        reads(&dev, 8).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(dev.reactor_queues(), (0, 0));
        reads(&dev, 300).await;
        wait_bound(&dev).await;
        assert_eq!(dev.reactor_queues(), (1, 0));
        // The reactor's queue is one more queue of the same controller.
        assert_eq!(server.target().controller_count(), 1);

        // Many at once from the reactor: all on its queue, all intact.
        let writes = (0..64u64).map(|i| {
            dev.submit(req(
                BlockOp::Write { fua: false },
                i * 8,
                pattern(4096, i as u8),
            ))
        });
        for d in futures_util::future::join_all(writes).await {
            d.result.unwrap();
        }
        let reading =
            (0..64u64).map(|i| dev.submit(req(BlockOp::Read, i * 8, nvmf_host::zeroed_buf(4096))));
        for (i, mut d) in futures_util::future::join_all(reading)
            .await
            .into_iter()
            .enumerate()
        {
            d.result.unwrap();
            d.buf.set_len(4096);
            assert_eq!(&d.buf[..], &pattern(4096, i as u8)[..], "block {i}");
        }
        assert_eq!(dev.reactor_queues(), (1, 128));

        // A synchronous call on the reactor's thread: its I/O must not go to
        // the queue that only this (now blocked) thread drives.
        let d = blockdev::block_on(dev.submit(req(BlockOp::Read, 8, nvmf_host::zeroed_buf(4096))));
        d.result.unwrap();
        assert_eq!(
            dev.reactor_queues(),
            (1, 128),
            "block_on used the shared queues"
        );

        // I/O from another runtime's thread uses the shared queues.
        let other = std::thread::spawn({
            let dev = Arc::new(dev);
            move || {
                let d = blockdev::block_on(dev.submit(req(
                    BlockOp::Read,
                    0,
                    nvmf_host::zeroed_buf(4096),
                )));
                d.result.unwrap();
                Arc::try_unwrap(dev).ok().expect("the only user")
            }
        });
        let dev = tokio::task::spawn_blocking(move || other.join().unwrap())
            .await
            .unwrap();
        assert_eq!(dev.reactor_queues(), (1, 128));

        // The target drops every connection: the next connection binds the
        // reactor's queue again, and the reactor's I/O goes there.
        let gen0 = dev.connects();
        server.target().kill_all(FreeReason::ConnectionError);
        let end = Instant::now() + Duration::from_secs(10);
        while dev.connects() <= gen0 {
            assert!(Instant::now() < end, "not reconnected in 10 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        reads(&dev, 300).await;
        wait_bound(&dev).await;
        assert_eq!(dev.reactor_queues(), (1, 0));
        let d = dev
            .submit(req(BlockOp::Read, 16, nvmf_host::zeroed_buf(4096)))
            .await;
        d.result.unwrap();
        assert_eq!(dev.reactor_queues(), (1, 1));

        // A drive opened with reactor queues off asks for none, so even a
        // steady load from a registered reactor binds nothing.
        let opts = RemoteOptions {
            reactor_queues: false,
            ..RemoteOptions::default()
        };
        let off = RemoteDevice::connect(&url, opts).await.unwrap();
        reads(&off, 600).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(off.reactor_queues(), (0, 0));
        assert_eq!(off.io_queues(), 2);
    });
    done.store(true, Ordering::Release);
    server.shutdown();
}
