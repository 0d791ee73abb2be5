//! End-to-end runs of [`crate::run_workload`] against RAM and an in-process
//! NVMe/TCP target: verify, read back, digests, `--engine remote` and its
//! reconnect.

use std::sync::Arc;
use std::time::Duration;

use blockdev::MemDevice;

use super::*;
use nvmf_target::{ListenerConfig, ListenerKind, Namespace, Server, Subsystem, TransportConfig};

fn quick(rw: Rw) -> Workload {
    Workload {
        rw,
        qd: 8,
        runtime: Some(Duration::from_millis(300)),
        verify: true,
        seed: 0xfeed,
        ..Workload::default()
    }
}

#[test]
fn mem_randrw_verifies_and_reads_back() {
    // Long enough that a loaded machine still reads back blocks written
    // in the same run (300 ms once checked none under a load of 8).
    let w = Workload {
        runtime: Some(Duration::from_secs(1)),
        ..quick(Rw::Randrw)
    };
    let s = run_workload(&Target::Mem(8 << 20), &w).unwrap();
    let v = s.verify.as_ref().unwrap();
    assert_eq!(v.mismatches, 0, "{}", s.render());
    assert!(
        v.checked_blocks > 0 && v.readback_blocks > 0,
        "{}",
        s.render()
    );
    assert!(s.read.is_some() && s.write.is_some());
    assert!(s.all.ios > 0 && s.all.lat.p50_us > 0.0);
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["workload"]["rw"], "randrw");
    assert!(
        json["all"]["histogram"]["buckets"]
            .as_array()
            .unwrap()
            .len()
            > 1
    );
}

fn server() -> (Server, Target) {
    let dev = Arc::new(MemDevice::new(16 << 20, 512).unwrap());
    let (s, addr) = server_on(dev, "127.0.0.1:0".parse().unwrap());
    let target =
        Target::parse(&format!("tcp://{addr}/nqn.2026-01.io.flashpool:benchtest")).unwrap();
    (s, target)
}

/// A target serving `dev` on `addr`; the same `dev` again gives the same namespace
/// (data and NGUID), as a restarted node would.
fn server_on(dev: Arc<MemDevice>, addr: std::net::SocketAddr) -> (Server, std::net::SocketAddr) {
    let sub = Subsystem::new(
        "nqn.2026-01.io.flashpool:benchtest".into(),
        "BT1".into(),
        "bench test".into(),
        true,
        Vec::new(),
        vec![Namespace::new(1, dev, [1; 16], [2; 16])],
    );
    let t = Arc::new(nvmf_target::Target::new(
        TransportConfig::default(),
        vec![Arc::new(sub)],
    ));
    let s = Server::start(
        t,
        &[ListenerConfig {
            addr,
            kind: ListenerKind::Io,
            tls: nvmf_target::TlsMode::None,
        }],
    )
    .unwrap();
    let addr = s.local_addrs()[0].0;
    (s, addr)
}

#[test]
fn tcp_write_then_verified_read_and_a_seed_mismatch_fails() {
    let (srv, target) = server();
    // One sequential verified pass over 1 MiB with two jobs (two I/O queues), 8 KiB I/Os (R2T path).
    let write = Workload {
        rw: Rw::Write,
        bs: 8192,
        jobs: 2,
        runtime: None,
        size: Some(1 << 20),
        ..quick(Rw::Write)
    };
    let s = run_workload(&target, &write).unwrap();
    let v = s.verify.as_ref().unwrap();
    assert_eq!(s.all.ios, 128, "{}", s.render());
    assert_eq!(
        (v.readback_blocks, v.mismatches),
        (2048, 0),
        "{}",
        s.render()
    );
    // A later run with the same seed checks every block it reads.
    let read = Workload {
        rw: Rw::Randread,
        seed_given: true,
        size: Some(1 << 20),
        ..quick(Rw::Randread)
    };
    let s = run_workload(&target, &read).unwrap();
    let v = s.verify.as_ref().unwrap();
    assert!(v.checked_blocks > 0 && v.mismatches == 0, "{}", s.render());
    // Another seed: every block is stale, and the run fails.
    let s = run_workload(&target, &Workload { seed: 7, ..read }).unwrap();
    assert!(s.verify_failed(), "{}", s.render());
    assert!(s.render().contains("expected 0x7"), "{}", s.render());
    srv.shutdown();
}

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn refusal(args: &[&str]) -> String {
    use clap::Parser;
    let a = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
        .unwrap()
        .bench;
    match a.workload_for(false) {
        Err(e) => e.to_string(),
        Ok(_) => run(a).unwrap_err().to_string(),
    }
}

#[test]
fn remote_engine_options_are_checked() {
    let tcp = ["--target", "tcp://127.0.0.1:9/nqn.2026-01.io.flashpool:x"];
    let with = |extra: &[&str]| refusal(&[&tcp[..], extra].concat());
    let e = with(&["--engine", "remote", "--poll-us", "50"]);
    assert!(
        e.contains("--poll-us 50") && e.contains("--engine remote"),
        "{e}"
    );
    for opt in [["--pdu-per-write"].as_slice(), &["--in-capsule", "0"]] {
        let e = with(&[&["--engine", "remote"], opt].concat());
        assert!(e.contains(opt[0]) && e.contains("--engine remote"), "{e}");
    }
    for opt in [["--queues", "2"], ["--fail-after", "5s"]] {
        let e = with(&opt);
        assert!(e.contains(opt[0]) && e.contains("--engine remote"), "{e}");
    }
    let e = with(&["--engine", "remote", "--queues", "0"]);
    assert!(e.contains("--queues 0"), "{e}");
    let e = with(&["--engine", "remote", "--fail-after", "0s"]);
    assert!(e.contains("--fail-after"), "{e}");
    let e = refusal(&["--target", "mem:1M", "--engine", "remote"]);
    assert!(e.contains("tcp://") && e.contains("mem:1 MiB"), "{e}");
    // The default engine and its workload are what they were.
    let w = {
        use clap::Parser;
        Cli::try_parse_from(["bench", tcp[0], tcp[1]])
            .unwrap()
            .bench
    }
    .workload_for(false)
    .unwrap();
    assert_eq!(
        (w.engine, w.queues, w.fail_after, w.poll_us),
        (Engine::Queue, None, None, 0)
    );
}

#[test]
fn remote_engine_writes_what_the_queue_engine_reads() {
    let (srv, target) = server();
    // Three jobs share one RemoteDevice with two queues; 8 KiB I/Os (R2T path).
    let write = Workload {
        rw: Rw::Write,
        bs: 8192,
        jobs: 3,
        engine: Engine::Remote,
        queues: Some(2),
        runtime: None,
        size: Some(3 << 20),
        ..quick(Rw::Write)
    };
    let s = run_workload(&target, &write).unwrap();
    let v = s.verify.as_ref().unwrap();
    assert_eq!(s.all.ios, 384, "{}", s.render());
    assert_eq!(
        (v.readback_blocks, v.mismatches),
        (6144, 0),
        "{}",
        s.render()
    );
    assert!(
        s.target_detail.contains("2 queues shared by 3 jobs")
            && s.target_detail.contains("reservations supported")
            && s.target_detail.ends_with("1 connection made"),
        "{}",
        s.target_detail
    );
    assert!(s.render().contains("(engine remote)"), "{}", s.render());
    // The per-job queue engine reads the same blocks back, and the other way round.
    let read = Workload {
        rw: Rw::Read,
        seed_given: true,
        jobs: 3,
        runtime: None,
        size: Some(3 << 20),
        ..quick(Rw::Read)
    };
    let s = run_workload(&target, &read).unwrap();
    let v = s.verify.as_ref().unwrap();
    assert_eq!(
        (v.checked_blocks, v.mismatches),
        (6144, 0),
        "{}",
        s.render()
    );
    assert!(!s.render().contains("engine"), "{}", s.render());
    let s = run_workload(
        &target,
        &Workload {
            engine: Engine::Remote,
            ..read
        },
    )
    .unwrap();
    let v = s.verify.as_ref().unwrap();
    assert_eq!(
        (v.checked_blocks, v.mismatches),
        (6144, 0),
        "{}",
        s.render()
    );
    srv.shutdown();
}

#[test]
fn remote_engine_rides_out_a_target_restart() {
    let dev = Arc::new(MemDevice::new(16 << 20, 512).unwrap());
    let (srv, addr) = server_on(dev.clone(), "127.0.0.1:0".parse().unwrap());
    let target =
        Target::parse(&format!("tcp://{addr}/nqn.2026-01.io.flashpool:benchtest")).unwrap();
    let w = Workload {
        rw: Rw::Randrw,
        jobs: 2,
        engine: Engine::Remote,
        fail_after: Some(Duration::from_secs(20)),
        runtime: Some(Duration::from_secs(3)),
        size: Some(4 << 20),
        ..quick(Rw::Randrw)
    };
    let run = std::thread::spawn(move || run_workload(&target, &w));
    // The target goes away for a moment in the middle of the run, and comes back
    // on the same address with the same namespace.
    std::thread::sleep(Duration::from_millis(1000));
    srv.shutdown();
    std::thread::sleep(Duration::from_millis(300));
    let (srv, _) = server_on(dev, addr);
    let s = run.join().unwrap().unwrap();
    let v = s.verify.as_ref().unwrap();
    assert!(
        v.mismatches == 0 && v.checked_blocks > 0 && v.readback_blocks > 0,
        "{}",
        s.render()
    );
    assert!(
        !s.target_detail.ends_with(" 1 connection made"),
        "no reconnect: {}",
        s.target_detail
    );
    srv.shutdown();
}
