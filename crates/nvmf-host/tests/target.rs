//! The host against an in-process flashpool target (nvmf_target::Server over
//! 127.0.0.1) with RAM namespaces.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::MemDevice;
use nvmf_host::{Controller, HostError, HostOptions, buf_from, discover_with, zeroed_buf};
use nvmf_target::{
    ListenerConfig, ListenerKind, Namespace, Server, Subsystem, Target, TransportConfig,
};

const OPEN: &str = "nqn.2026-01.io.flashpool:test-open";
const CLOSED: &str = "nqn.2026-01.io.flashpool:test-closed";
const ALLOWED_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa";
const NS1_BYTES: u64 = 64 << 20;
const NS2_BYTES: u64 = 16 << 20;
/// Small on purpose: writes over 4 KiB take the R2T path, and those over 8 KiB
/// are split into several H2CData PDUs.
const IN_CAPSULE: u32 = 4096;
const MAX_H2C: u32 = 8192;

fn transport() -> TransportConfig {
    TransportConfig {
        in_capsule_data: IN_CAPSULE,
        max_h2c_data: MAX_H2C,
        max_transfer: 1 << 20,
        max_queue_depth: 64,
        max_io_queues: 4,
        ..TransportConfig::default()
    }
}

struct Fixture {
    server: Option<Server>,
}

impl Fixture {
    fn start() -> Fixture {
        let ns = |nsid, bytes, bs| {
            let dev = Arc::new(MemDevice::new(bytes, bs).unwrap());
            Namespace::new(nsid, dev, [nsid as u8; 16], [nsid as u8 + 0x10; 16])
        };
        let open = Subsystem::new(
            OPEN.into(),
            "SN-OPEN".into(),
            "flashpool test".into(),
            true,
            Vec::new(),
            vec![ns(1, NS1_BYTES, 512), ns(2, NS2_BYTES, 4096)],
        );
        let closed = Subsystem::new(
            CLOSED.into(),
            "SN-CLOSED".into(),
            "flashpool test".into(),
            false,
            vec![ALLOWED_HOST.into()],
            vec![ns(1, 1 << 20, 512)],
        );
        let target = Arc::new(Target::new(
            transport(),
            vec![Arc::new(open), Arc::new(closed)],
        ));
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let server = Server::start(
            target,
            &[
                ListenerConfig {
                    addr: any,
                    kind: ListenerKind::Io,
                    tls: nvmf_target::TlsMode::None,
                },
                ListenerConfig {
                    addr: any,
                    kind: ListenerKind::Discovery,
                    tls: nvmf_target::TlsMode::None,
                },
            ],
        )
        .unwrap();
        Fixture {
            server: Some(server),
        }
    }

    fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    fn addr(&self, kind: ListenerKind) -> SocketAddr {
        self.server()
            .local_addrs()
            .iter()
            .find(|(_, k)| *k == kind)
            .unwrap()
            .0
    }

    fn io(&self) -> SocketAddr {
        self.addr(ListenerKind::Io)
    }

    fn controllers(&self) -> usize {
        self.server().target().controller_count()
    }

    async fn wait_controllers(&self, n: usize) {
        let start = Instant::now();
        while self.controllers() != n {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "target still has {} controllers",
                self.controllers()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

fn opts() -> HostOptions {
    HostOptions {
        timeout: Duration::from_secs(5),
        nr_io_queues: 2,
        queue_depth: 32,
        ..HostOptions::default()
    }
}

/// Bytes that differ per LBA and per call.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test]
async fn connect_identify_disconnect() {
    let f = Fixture::start();
    let ctrl = Controller::connect(f.io(), OPEN, opts()).await.unwrap();
    assert!(ctrl.cntlid() >= 1);
    let info = ctrl.info();
    assert_eq!(info.serial, "SN-OPEN");
    assert_eq!(info.model, "flashpool test");
    assert_eq!(info.subnqn, OPEN);
    assert_eq!(info.cntrltype, 1);
    assert_eq!(info.in_capsule_data(), IN_CAPSULE);
    assert_eq!(info.max_transfer(), Some(1 << 20));
    assert_eq!(ctrl.version(), 0x0001_0400);
    assert_eq!(
        (ctrl.cap() & 0xFFFF) + 1,
        64,
        "CAP.MQES + 1 is the target's max queue depth"
    );
    assert_eq!(ctrl.max_h2c_data(), MAX_H2C);
    assert_eq!(ctrl.granted_io_queues(), 2);
    assert_eq!(ctrl.io_queue_depth(), 32);
    assert_eq!(ctrl.active_namespaces().await.unwrap(), vec![1, 2]);
    let ns1 = ctrl.identify_namespace(1).await.unwrap();
    assert_eq!((ns1.nsze, ns1.lba_size), (NS1_BYTES / 512, 512));
    let ns2 = ctrl.identify_namespace(2).await.unwrap();
    assert_eq!((ns2.nsze, ns2.lba_size), (NS2_BYTES / 4096, 4096));
    let e = ctrl.identify_namespace(3).await.unwrap_err();
    assert!(e.to_string().contains("namespace 3 is not active"), "{e}");
    ctrl.keep_alive().await.unwrap();
    assert_eq!(f.controllers(), 1);
    ctrl.disconnect().await.unwrap();
    f.wait_controllers(0).await;
}

/// Writes then reads back several sizes: in-capsule, one R2T with one
/// H2CData, one R2T split into many H2CData PDUs; 512 B and 4 KiB LBAs.
async fn write_read_sizes(f: &Fixture, o: HostOptions) {
    let ctrl = Controller::connect(f.io(), OPEN, o.clone()).await.unwrap();
    assert_eq!(ctrl.digests(), (o.hdr_digest, o.data_digest));
    let q = ctrl.io_queue(1).unwrap();
    assert_eq!(q.in_capsule_limit(), IN_CAPSULE);
    let mut lba = 0u64;
    for (nsid, bs) in [(1u32, 512usize), (2, 4096)] {
        for bytes in [512usize, 4096, 4608, 8192, 12288, 65536, 1 << 20] {
            if bytes % bs != 0 {
                continue;
            }
            let nlb = (bytes / bs) as u32;
            let data = pattern(bytes, lba * 31 + bytes as u64);
            ctrl.write(1, nsid, lba, nlb, &data).await.unwrap();
            let mut back = vec![0u8; bytes];
            ctrl.read(2, nsid, lba, nlb, &mut back).await.unwrap();
            assert!(
                back == data,
                "nsid {nsid}: {bytes} bytes at LBA {lba} read back differently"
            );
            lba += u64::from(nlb) + 3;
        }
    }
    ctrl.disconnect().await.unwrap();
}

#[tokio::test]
async fn verified_write_read_without_digests() {
    let f = Fixture::start();
    write_read_sizes(&f, opts()).await;
}

#[tokio::test]
async fn verified_write_read_with_digests() {
    let f = Fixture::start();
    for (hd, dd) in [(true, false), (false, true), (true, true)] {
        write_read_sizes(
            &f,
            HostOptions {
                hdr_digest: hd,
                data_digest: dd,
                ..opts()
            },
        )
        .await;
    }
    f.wait_controllers(0).await;
}

#[tokio::test]
async fn verified_write_read_with_sq_flow_control() {
    // Reads then end with a CapsuleResp after the C2HData, not a SUCCESS flag.
    let f = Fixture::start();
    write_read_sizes(
        &f,
        HostOptions {
            disable_sqflow: false,
            hdr_digest: true,
            data_digest: true,
            ..opts()
        },
    )
    .await;
}

#[tokio::test]
async fn verified_write_read_with_adaptive_polling() {
    let f = Fixture::start();
    write_read_sizes(
        &f,
        HostOptions {
            poll_us: 100,
            ..opts()
        },
    )
    .await;
}

#[tokio::test]
async fn many_commands_in_flight_on_one_queue() {
    let f = Fixture::start();
    let ctrl = Controller::connect(
        f.io(),
        OPEN,
        HostOptions {
            nr_io_queues: 1,
            queue_depth: 8,
            ..opts()
        },
    )
    .await
    .unwrap();
    let q = ctrl.io_queue(1).unwrap();
    assert_eq!(q.depth(), 8);
    // 100 writes of mixed sizes at once: more than the depth, so some wait for a command id.
    let sizes = [1u32, 8, 9, 24, 128];
    let writes = (0..100u64).map(|i| {
        let q = q.clone();
        async move {
            let nlb = sizes[i as usize % sizes.len()];
            let data = pattern(nlb as usize * 512, i);
            let (_, r) = q.write_buf(1, i * 256, nlb, buf_from(&data)).await;
            r.unwrap();
        }
    });
    join_all(writes).await;
    let reads = (0..100u64).map(|i| {
        let q = q.clone();
        async move {
            let nlb = sizes[i as usize % sizes.len()];
            let (back, r) = q
                .read_buf(1, i * 256, nlb, zeroed_buf(nlb as usize * 512))
                .await;
            r.unwrap();
            assert!(back[..] == pattern(nlb as usize * 512, i), "command {i}");
        }
    });
    join_all(reads).await;
    ctrl.disconnect().await.unwrap();
}

#[tokio::test]
async fn flush_write_zeroes_deallocate() {
    let f = Fixture::start();
    let ctrl = Controller::connect(f.io(), OPEN, opts()).await.unwrap();
    let data = pattern(64 * 512, 5);
    let zeros = vec![0u8; 64 * 512];
    let mut back = vec![0u8; 64 * 512];
    ctrl.write(1, 1, 1000, 64, &data).await.unwrap();
    ctrl.flush(1, 1).await.unwrap();
    ctrl.write_zeroes(1, 1, 1000, 64).await.unwrap();
    ctrl.read(1, 1, 1000, 64, &mut back).await.unwrap();
    assert!(back == zeros, "Write Zeroes left data behind");
    ctrl.write(1, 1, 1000, 64, &data).await.unwrap();
    ctrl.write(1, 1, 5000, 64, &data).await.unwrap();
    ctrl.deallocate(1, 1, &[(1000, 64), (5000, 32)])
        .await
        .unwrap();
    ctrl.read(1, 1, 1000, 64, &mut back).await.unwrap();
    assert!(
        back == zeros,
        "deallocated blocks must read as zeroes (DLFEAT)"
    );
    ctrl.read(1, 1, 5000, 64, &mut back).await.unwrap();
    assert!(back[..32 * 512].iter().all(|&b| b == 0));
    assert_eq!(&back[32 * 512..], &data[32 * 512..]);
    ctrl.disconnect().await.unwrap();
}

#[tokio::test]
async fn command_errors_show_status() {
    let f = Fixture::start();
    let ctrl = Controller::connect(f.io(), OPEN, opts()).await.unwrap();
    let nsze = NS1_BYTES / 512;
    let mut buf = vec![0u8; 8 * 512];
    let e = ctrl.read(1, 1, nsze - 4, 8, &mut buf).await.unwrap_err();
    assert_eq!(e.status().map(|s| (s.sct, s.sc)), Some((0, 0x80)), "{e}");
    assert!(e.to_string().contains("LBA Out of Range"), "{e}");
    assert!(
        e.to_string()
            .contains(&format!("Read nsid 1 LBA {}+8", nsze - 4)),
        "{e}"
    );
    let e = ctrl.write(1, 9, 0, 8, &buf).await.unwrap_err();
    assert_eq!(e.status().map(|s| s.sc), Some(0x0B), "{e}");
    assert!(e.to_string().contains("Invalid Namespace or Format"), "{e}");
    // A length that disagrees with NLB: the target rejects the SGL.
    let e = ctrl.read(1, 1, 0, 4, &mut buf).await.unwrap_err();
    assert!(e.status().is_some(), "{e}");
    // The queue still works after failed commands.
    ctrl.read(1, 1, 0, 8, &mut buf).await.unwrap();
    assert!(matches!(
        ctrl.read(7, 1, 0, 8, &mut buf).await,
        Err(HostError::Invalid(_))
    ));
    ctrl.disconnect().await.unwrap();
}

#[tokio::test]
async fn unknown_subsystem_is_named() {
    let f = Fixture::start();
    let e = Controller::connect(f.io(), "nqn.2026-01.io.flashpool:nope", opts())
        .await
        .err()
        .unwrap();
    assert!(matches!(e, HostError::UnknownSubsystem { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("no subsystem nqn.2026-01.io.flashpool:nope"),
        "{e}"
    );
    f.wait_controllers(0).await;
}

#[tokio::test]
async fn host_not_allowed_then_allowed() {
    let f = Fixture::start();
    let stranger = HostOptions {
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000bb".into(),
        ..opts()
    };
    let e = Controller::connect(f.io(), CLOSED, stranger)
        .await
        .err()
        .unwrap();
    assert!(matches!(e, HostError::HostNotAllowed { .. }), "{e}");
    assert!(
        e.to_string().contains("0000000000bb is not allowed on"),
        "{e}"
    );
    let friend = HostOptions {
        hostnqn: ALLOWED_HOST.into(),
        ..opts()
    };
    let ctrl = Controller::connect(f.io(), CLOSED, friend).await.unwrap();
    ctrl.disconnect().await.unwrap();
}

#[tokio::test]
async fn connection_refused_is_named() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let e = Controller::connect(port, OPEN, opts()).await.err().unwrap();
    assert!(matches!(e, HostError::Refused { .. }), "{e}");
    assert!(e.to_string().contains("connection refused"), "{e}");
}

#[tokio::test]
async fn discovery_lists_what_the_host_may_see() {
    let f = Fixture::start();
    let disc = f.addr(ListenerKind::Discovery);
    let entries = discover_with(disc, opts()).await.unwrap();
    let nqns: Vec<_> = entries.iter().map(|e| e.subnqn.as_str()).collect();
    assert!(nqns.contains(&OPEN), "{nqns:?}");
    assert!(
        !nqns.contains(&CLOSED),
        "a host that is not allowed must not see {CLOSED}: {nqns:?}"
    );
    let open = entries.iter().find(|e| e.subnqn == OPEN).unwrap();
    assert_eq!(open.trsvcid, f.io().port().to_string());
    assert_eq!(open.traddr, "127.0.0.1");
    let friend = HostOptions {
        hostnqn: ALLOWED_HOST.into(),
        ..opts()
    };
    let entries = discover_with(disc, friend).await.unwrap();
    assert!(entries.iter().any(|e| e.subnqn == CLOSED));
    f.wait_controllers(0).await;
}

#[tokio::test]
async fn keep_alive_keeps_an_idle_controller() {
    let f = Fixture::start();
    let ctrl = Controller::connect(
        f.io(),
        OPEN,
        HostOptions {
            kato_ms: 1000,
            ..opts()
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        f.controllers(),
        1,
        "the target dropped a controller that sent Keep Alives"
    );
    let mut buf = vec![0u8; 512];
    ctrl.read(1, 1, 0, 1, &mut buf).await.unwrap();
    ctrl.disconnect().await.unwrap();
}

#[tokio::test]
async fn queues_on_other_threads() {
    // The bench's shape: admin on one runtime, each I/O queue on its own thread's runtime.
    let f = Fixture::start();
    let ctrl = Arc::new(
        Controller::connect(
            f.io(),
            OPEN,
            HostOptions {
                lazy_io_queues: true,
                ..opts()
            },
        )
        .await
        .unwrap(),
    );
    assert!(ctrl.io_queue(1).is_err());
    let threads: Vec<_> = (1..=2u16)
        .map(|qid| {
            let ctrl = ctrl.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let q = ctrl.add_io_queue(qid).await.unwrap();
                    for i in 0..50u64 {
                        let lba = u64::from(qid) * 10_000 + i * 8;
                        let (_, r) = q.write_buf(1, lba, 8, buf_from(&pattern(4096, lba))).await;
                        r.unwrap();
                        let (b, r) = q.read_buf(1, lba, 8, zeroed_buf(4096)).await;
                        r.unwrap();
                        assert!(b[..] == pattern(4096, lba));
                    }
                })
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let ctrl = Arc::into_inner(ctrl).unwrap();
    ctrl.disconnect().await.unwrap();
    f.wait_controllers(0).await;
}

/// Runs futures concurrently on the current task.
async fn join_all<F: std::future::Future<Output = ()>>(futs: impl IntoIterator<Item = F>) {
    let mut futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        futs.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if futs.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

/// A namespace added while the host is connected is usable on the queues
/// that were already open; one removed answers Invalid Namespace, and the
/// queue goes on serving the others.
#[tokio::test]
async fn namespaces_added_and_removed_while_connected() {
    let f = Fixture::start();
    let ctrl = Controller::connect(f.io(), OPEN, opts()).await.unwrap();
    let mut buf = vec![0u8; 8 * 512];
    let e = ctrl.write(1, 5, 0, 8, &buf).await.unwrap_err();
    assert_eq!(e.status().map(|s| s.sc), Some(0x0B), "{e}");
    let dev = Arc::new(MemDevice::new(4 << 20, 512).unwrap());
    let target = f.server().target();
    target
        .add_namespace(OPEN, Namespace::new(5, dev, [5; 16], [6; 16]))
        .unwrap();
    assert_eq!(ctrl.active_namespaces().await.unwrap(), vec![1, 2, 5]);
    let data = pattern(8 * 512, 55);
    for q in 1..=2 {
        ctrl.write(q, 5, 8 * u64::from(q), 8, &data).await.unwrap();
        ctrl.read(q, 5, 8 * u64::from(q), 8, &mut buf)
            .await
            .unwrap();
        assert!(buf == data, "queue {q}: nsid 5 reads back what was written");
    }
    let gone = target.remove_namespace(OPEN, 5).unwrap();
    assert_eq!(gone.nsid, 5);
    for q in 1..=2 {
        let e = ctrl.read(q, 5, 0, 8, &mut buf).await.unwrap_err();
        assert_eq!(e.status().map(|s| s.sc), Some(0x0B), "queue {q}: {e}");
        ctrl.read(q, 1, 0, 8, &mut buf).await.unwrap();
    }
    assert_eq!(ctrl.active_namespaces().await.unwrap(), vec![1, 2]);
    ctrl.disconnect().await.unwrap();
}

#[tokio::test]
async fn reservations_register_acquire_conflict_report_preempt() {
    use nvmf_host::{AcquireAction, RegisterAction, ReleaseAction, ResvType, cptpl};
    let f = Fixture::start();
    let host = |n: u8| HostOptions {
        hostnqn: format!(
            "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000{n:02x}"
        ),
        hostid: [n; 16],
        ..opts()
    };
    let a = Controller::connect(f.io(), OPEN, host(1)).await.unwrap();
    let b = Controller::connect(f.io(), OPEN, host(2)).await.unwrap();
    let (qa, qb) = (a.io_queue(1).unwrap(), b.io_queue(1).unwrap());
    qa.resv_register(2, RegisterAction::Register, 0, 0xA, false, cptpl::NO_CHANGE)
        .await
        .unwrap();
    qb.resv_register(2, RegisterAction::Register, 0, 0xB, false, cptpl::NO_CHANGE)
        .await
        .unwrap();
    let wx = ResvType::WriteExclusive;
    qa.resv_acquire(2, AcquireAction::Acquire, wx, 0xA, 0, false)
        .await
        .unwrap();
    let st = qa.resv_report(2).await.unwrap();
    assert_eq!(st.rtype, Some(wx));
    assert_eq!(st.registrants.len(), 2);
    assert_eq!(st.holder().unwrap().hostid, [1; 16]);
    assert_eq!(st.key_of(&[2; 16]), Some(0xB));
    // B may read but not write.
    b.read(1, 2, 0, 1, &mut vec![0u8; 4096]).await.unwrap();
    let e = b.write(1, 2, 0, 1, &[1u8; 4096]).await.unwrap_err();
    assert!(e.is_reservation_conflict(), "{e}");
    assert!(e.to_string().contains("Reservation Conflict"), "{e}");
    // B preempts A and takes over; A is now the one refused.
    qb.resv_acquire(2, AcquireAction::PreemptAndAbort, wx, 0xB, 0xA, false)
        .await
        .unwrap();
    b.write(1, 2, 0, 1, &[1u8; 4096]).await.unwrap();
    let e = a.write(1, 2, 0, 1, &[2u8; 4096]).await.unwrap_err();
    assert!(e.is_reservation_conflict(), "{e}");
    let st = qb.resv_report(2).await.unwrap();
    assert_eq!((st.registrants.len(), st.holder().unwrap().rkey), (1, 0xB));
    qb.resv_release(2, ReleaseAction::Clear, wx, 0xB, false)
        .await
        .unwrap();
    let st = qa.resv_report(2).await.unwrap();
    assert_eq!((st.rtype, st.registrants.len()), (None, 0));
    a.write(1, 2, 0, 1, &[2u8; 4096]).await.unwrap();
    a.disconnect().await.unwrap();
    b.disconnect().await.unwrap();
}
