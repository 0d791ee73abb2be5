//! The liveness signal against a real peer process (python3).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cluster::{LivenessListener, watch_peer_death};

const PEER: &str = r#"
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
held = []
while True:
    c, _ = s.accept(); held.append(c)
"#;

struct Peer(Child, String);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn peer() -> Peer {
    let mut child = Command::new("python3")
        .args(["-c", PEER])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 is needed for the liveness tests (apt-get install python3)");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = format!("127.0.0.1:{}", line.trim());
    Peer(child, addr)
}

fn signal(p: &Peer, sig: &str) {
    assert!(
        Command::new("kill")
            .args([sig, &p.0.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_peer_is_reported_within_a_second() {
    let mut p = peer();
    let addr = p.1.clone();
    let w = tokio::spawn(async move { watch_peer_death(&addr).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!w.is_finished());
    let t = Instant::now();
    p.0.kill().unwrap();
    p.0.wait().unwrap();
    let gone = tokio::time::timeout(Duration::from_secs(1), w)
        .await
        .expect("death not seen within 1 s")
        .unwrap();
    assert_eq!(gone.addr, p.1);
    eprintln!("peer death seen after {:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_peer_is_not_reported() {
    let p = peer();
    let addr = p.1.clone();
    let w = tokio::spawn(async move { watch_peer_death(&addr).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(&p, "-STOP");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!w.is_finished(), "a frozen peer was reported dead");
    signal(&p, "-CONT");
    w.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_listener_holds_until_dropped() {
    let l = LivenessListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().to_string();
    let a2 = addr.clone();
    let w = tokio::spawn(async move { watch_peer_death(&a2).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!w.is_finished());
    drop(l);
    let gone = tokio::time::timeout(Duration::from_secs(1), w)
        .await
        .expect("not seen")
        .unwrap();
    assert_eq!(gone.addr, addr);
}
