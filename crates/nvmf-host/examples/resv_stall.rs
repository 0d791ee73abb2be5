//! What a host's reservation commands cost another host on the same target
//! reactor: host B reads 4 KiB at queue depth 1 and records each read's
//! latency, first alone, then while host A registers and unregisters with
//! Persist Through Power Loss on (every command stores the namespace's
//! reservation record: an fsync'd file attribute, or a volume's metadata
//! write to its members). Both hosts use one connection each to the same
//! target; with one reactor they share its thread. docs/performance.md,
//! "Reservation stores off the reactor".
//!
//!     cargo run --release -p nvmf-host --example resv_stall -- \
//!         127.0.0.1:4420 nqn.2026-01.io.flashpool:bench 1 5

use std::time::{Duration, Instant};

use nvmf_host::{Controller, HostOptions, RegisterAction, cptpl};

fn host(n: u8) -> HostOptions {
    HostOptions {
        hostnqn: format!(
            "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000{n:02x}"
        ),
        hostid: [n; 16],
        nr_io_queues: 1,
        queue_depth: 32,
        timeout: Duration::from_secs(30),
        ..HostOptions::default()
    }
}

/// Host B's QD-1 random reads for `secs`: (reads, p50, p99, max) in µs.
async fn reads(b: &Controller, nsid: u32, secs: u64) -> (usize, f64, f64, f64) {
    let ns = b
        .identify_namespace(nsid)
        .await
        .expect("Identify Namespace");
    let (blocks, nlb) = (ns.nsze, 4096 / ns.lba_size);
    let mut lat = Vec::new();
    let mut buf = vec![0u8; 4096];
    let end = Instant::now() + Duration::from_secs(secs);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while Instant::now() < end {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let lba = (x % (blocks / u64::from(nlb))) * u64::from(nlb);
        let t = Instant::now();
        b.read(1, nsid, lba, nlb, &mut buf).await.expect("read");
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    let at = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize];
    (lat.len(), at(0.5), at(0.99), *lat.last().unwrap())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: resv_stall ADDR SUBNQN NSID SECONDS");
        std::process::exit(2);
    }
    let addr = args[1].parse().expect("ADDR: ip:port");
    let (nqn, nsid): (&str, u32) = (&args[2], args[3].parse().expect("NSID"));
    let secs: u64 = args[4].parse().expect("SECONDS");
    let a = Controller::connect(addr, nqn, host(0xA))
        .await
        .expect("connect A");
    let b = Controller::connect(addr, nqn, host(0xB))
        .await
        .expect("connect B");
    let (n, p50, p99, max) = reads(&b, nsid, secs).await;
    println!("alone:            {n} reads, p50 {p50:.1} us, p99 {p99:.1} us, max {max:.1} us");
    let qa = a.io_queue(1).expect("A's I/O queue");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let storer = tokio::spawn(async move {
        let mut ops = 0u64;
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            qa.resv_register(nsid, RegisterAction::Register, 0, 0xA1, false, cptpl::SET)
                .await
                .expect("register");
            qa.resv_register(nsid, RegisterAction::Unregister, 0xA1, 0, false, cptpl::SET)
                .await
                .expect("unregister");
            ops += 2;
        }
        ops
    });
    let t = Instant::now();
    let (n, p50, p99, max) = reads(&b, nsid, secs).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let ops = storer.await.expect("A's task");
    println!(
        "while A stores:   {n} reads, p50 {p50:.1} us, p99 {p99:.1} us, max {max:.1} us; \
         A: {:.0} reservation commands/s",
        ops as f64 / t.elapsed().as_secs_f64()
    );
    let _ = a.disconnect().await;
    let _ = b.disconnect().await;
}
