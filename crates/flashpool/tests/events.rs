//! Events end to end: a `flashpool serve` with file-backed drives and a
//! raid1 volume (free loopback ports), its `GET /v1/events` stream and a
//! `flashpool events --follow --json` follower; a drive failed and replaced
//! through the API, hosts connecting and refused over NVMe/TCP, a resume with
//! Last-Event-ID, a node restart under the follower, and the JSON log.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::{BIN, free_port, scratch};
const NQN: &str = "nqn.2026-01.io.flashpool:evtest";
const GOOD_HOST: &str = "nqn.2026-01.io.test:good-host";
const BAD_HOST: &str = "nqn.2026-01.io.test:bad-host";
const WAIT: Duration = Duration::from_secs(30);

struct Node {
    child: Child,
    api: String,
    /// Its API token (`[api] token_file`).
    token: String,
    io: SocketAddr,
    /// Its stderr lines (the log), read on a thread.
    log: mpsc::Receiver<String>,
}

fn config(dir: &Path, api: &str, io: u16) -> PathBuf {
    let config = dir.join("node.toml");
    let d = dir.display();
    std::fs::write(
        &config,
        format!(
            r#"
[node]
reactors = 1
log = "info"
log_format = "json"

[api]
address = "{api}"
token_file = "{d}/api-token"

[[listener]]
address = "127.0.0.1"
port = {io}

[[listener]]
address = "127.0.0.1"
port = {disc}
kind = "discovery"

[[drive]]
name = "d0"
backend = "file"
path = "{d}/d0.img"
create = true
size = "32MiB"

[[drive]]
name = "d1"
backend = "file"
path = "{d}/d1.img"
create = true
size = "32MiB"

[[drive]]
name = "s0"
backend = "file"
path = "{d}/s0.img"
create = true
size = "32MiB"

[[volume]]
name = "r1"
layout = "raid1"
drives = ["d0", "d1"]

[[subsystem]]
nqn = "{NQN}"
allow_any_host = false
hosts = ["{GOOD_HOST}"]

[[subsystem.namespace]]
nsid = 1
backend = "volume"
volume = "r1"
"#,
            disc = free_port()
        ),
    )
    .unwrap();
    config
}

fn lines_of(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { return };
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

impl Node {
    fn start(config: &Path, api: &str, io: u16) -> Node {
        let mut child = Command::new(BIN)
            .args(["serve", "-c"])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("flashpool serve starts");
        let err: ChildStderr = child.stderr.take().unwrap();
        let log = lines_of(err);
        let addr: SocketAddr = api.parse().unwrap();
        let start = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(st) = child.try_wait().unwrap() {
                let text: Vec<String> = log.try_iter().collect();
                panic!("flashpool serve exited ({st}): {}", text.join("\n"));
            }
            assert!(start.elapsed() < WAIT, "no API on {api}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let token = std::fs::read_to_string(config.parent().unwrap().join("api-token"))
            .expect("the node wrote its API token")
            .trim()
            .to_string();
        Node {
            child,
            api: api.to_string(),
            token,
            io: format!("127.0.0.1:{io}").parse().unwrap(),
            log,
        }
    }

    fn post(&self, path: &str, body: &str) -> Value {
        self.call("POST", path, body)
    }

    /// Waits until no background job (the volume's initial sync) runs.
    fn wait_jobs(&self) {
        let until = Instant::now() + WAIT;
        while Instant::now() < until {
            let jobs = self.call("GET", "/jobs", "");
            if jobs
                .as_array()
                .unwrap()
                .iter()
                .all(|j| j["state"] != "running")
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("jobs still run");
    }

    fn call(&self, method: &str, path: &str, body: &str) -> Value {
        let mut s = TcpStream::connect(&self.api).unwrap();
        write!(
            s,
            "{method} /v1{path} HTTP/1.0\r\nHost: {}\r\nAuthorization: Bearer {}\r\n{}Content-Length: {}\r\n\r\n{body}",
            self.api,
            self.token,
            if body.is_empty() {
                ""
            } else {
                "Content-Type: application/json\r\n"
            },
            body.len()
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        assert!(
            text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"),
            "{method} {path}: {text}"
        );
        serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap()
    }

    /// Stops the node and returns its log lines.
    fn stop(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut out = Vec::new();
        while let Ok(l) = self.log.recv_timeout(Duration::from_secs(5)) {
            out.push(l);
        }
        out
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A raw `GET /v1/events` reader (HTTP/1.0: the body is not chunked).
struct Sse {
    lines: std::io::Lines<BufReader<TcpStream>>,
}

#[derive(Debug, Clone)]
struct Msg {
    id: Option<u64>,
    event: String,
    data: Value,
}

impl Sse {
    fn open(api: &str, token: &str, extra_headers: &str) -> Sse {
        let mut s = TcpStream::connect(api).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        write!(
            s,
            "GET /v1/events HTTP/1.0\r\nHost: {api}\r\nAuthorization: Bearer {token}\r\n{extra_headers}\r\n"
        )
        .unwrap();
        let mut lines = BufReader::new(s).lines();
        let status = lines.next().unwrap().unwrap();
        assert!(status.contains(" 200 "), "{status}");
        let mut ct = false;
        for l in lines.by_ref() {
            let l = l.unwrap();
            if l.is_empty() {
                break;
            }
            ct |= l.eq_ignore_ascii_case("content-type: text/event-stream");
        }
        assert!(ct, "not an event stream");
        Sse { lines }
    }

    fn next(&mut self) -> Msg {
        let mut m = Msg {
            id: None,
            event: String::new(),
            data: Value::Null,
        };
        let mut any = false;
        loop {
            let l = self.lines.next().expect("the stream goes on").unwrap();
            if l.is_empty() {
                if any {
                    return m;
                }
                continue;
            }
            if l.starts_with(':') {
                continue;
            }
            any = true;
            if let Some(v) = l.strip_prefix("id: ") {
                m.id = Some(v.parse().unwrap());
            } else if let Some(v) = l.strip_prefix("event: ") {
                m.event = v.into();
            } else if let Some(v) = l.strip_prefix("data: ") {
                m.data = serde_json::from_str(v).unwrap();
            }
        }
    }

    /// Reads events until one of `kind` (with `field` = `value` when given)
    /// arrives; returns all read, checking each event's framing and that
    /// sequence numbers follow each other from `after`.
    fn until(&mut self, after: &mut u64, kind: &str, field: Option<(&str, &str)>) -> Vec<Msg> {
        let mut got = Vec::new();
        loop {
            let m = self.next();
            assert_ne!(m.event, "lagged", "{m:?}");
            if m.event == "hello" {
                continue;
            }
            let seq = m.data["seq"].as_u64().unwrap();
            assert_eq!(m.id, Some(seq), "{m:?}");
            assert_eq!(m.event, m.data["kind"].as_str().unwrap(), "{m:?}");
            assert_eq!(seq, *after + 1, "a gap or a repeat: {m:?} after {after}");
            *after = seq;
            got.push(m.clone());
            if m.event == kind && field.is_none_or(|(k, v)| m.data[k] == v) {
                return got;
            }
        }
    }
}

fn kinds(ms: &[Msg]) -> Vec<&str> {
    ms.iter().map(|m| m.event.as_str()).collect()
}

fn host_connect(io: SocketAddr, hostnqn: &str) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let opts = nvmf_host::HostOptions {
            hostnqn: hostnqn.into(),
            hostid: [9; 16],
            timeout: Duration::from_secs(10),
            ..nvmf_host::HostOptions::default()
        };
        let c = nvmf_host::Controller::connect(io, NQN, opts)
            .await
            .map_err(|e| e.to_string())?;
        c.disconnect().await.map_err(|e| e.to_string())
    })
}

#[test]
fn events_end_to_end() {
    let dir = scratch("events", "e2e");
    let api = format!("127.0.0.1:{}", free_port());
    let io = free_port();
    let cfg = config(&dir, &api, io);
    let node = Node::start(&cfg, &api, io);
    // The drives are files, not blank: the raid1 has its initial sync.
    node.wait_jobs();

    let mut sse = Sse::open(&api, &node.token, "");
    let hello = sse.next();
    assert_eq!(hello.event, "hello");
    let mut seen = hello.data["last_seq"].as_u64().unwrap();
    assert_eq!(
        seen, 2,
        "a healthy node starts with its sync's two events only"
    );

    let mut follower = Command::new(BIN)
        .args([
            "events", "--follow", "--json", "--since", "0", "--api", &api,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let follow_out = lines_of(follower.stdout.take().unwrap());
    let follow_err = lines_of(follower.stderr.take().unwrap());

    // Hosts: one allowed, one not.
    host_connect(node.io, GOOD_HOST).expect("the allowed host connects");
    let got = sse.until(&mut seen, "host_connected", Some(("host", GOOD_HOST)));
    assert!(
        got[0].data["message"].as_str().unwrap().contains(NQN),
        "{got:?}"
    );
    let e = host_connect(node.io, BAD_HOST).expect_err("the other host is refused");
    assert!(!e.is_empty());
    let got = sse.until(&mut seen, "host_refused", Some(("host", BAD_HOST)));
    assert_eq!(got.last().unwrap().data["severity"], "warning");

    // A drive fails: the drive, then its volume.
    node.post("/drives/d1/fail", "");
    let got = sse.until(&mut seen, "volume_degraded", None);
    assert_eq!(kinds(&got), ["drive_failed", "volume_degraded"], "{got:?}");
    assert_eq!(got[0].data["drive"], "d1");
    assert_eq!(got[0].data["volume"], "r1");
    assert_eq!(got[1].data["volume"], "r1");
    let mark = seen;

    // Replaced by the spare: the rebuild, then the volume optimal.
    node.post("/drives/d1/replace", r#"{"with": "s0"}"#);
    let got = sse.until(&mut seen, "volume_optimal", None);
    let ks = kinds(&got);
    let pos = |k: &str| {
        ks.iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("no {k}: {ks:?}"))
    };
    assert!(pos("rebuild_started") < pos("rebuild_finished"), "{ks:?}");
    assert!(pos("rebuild_finished") < pos("volume_optimal"), "{ks:?}");
    let started = &got[pos("rebuild_started")];
    assert_eq!(started.data["drive"], "s0", "{started:?}");

    // Resuming after `mark` with Last-Event-ID: exactly what came after it.
    let mut again = Sse::open(&api, &node.token, &format!("Last-Event-ID: {mark}\r\n"));
    let mut resumed = mark;
    let replay = again.until(&mut resumed, "volume_optimal", None);
    assert_eq!(resumed, seen);
    assert_eq!(
        replay.iter().map(|m| m.id).collect::<Vec<_>>(),
        got.iter().map(|m| m.id).collect::<Vec<_>>()
    );

    // The follower printed every event, in order, as JSON lines.
    let mut printed = Vec::new();
    let until = Instant::now() + WAIT;
    while printed.len() < seen as usize && Instant::now() < until {
        if let Ok(l) = follow_out.recv_timeout(Duration::from_millis(200)) {
            let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
            printed.push(v);
        }
    }
    let seqs: Vec<u64> = printed.iter().map(|v| v["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seen).collect::<Vec<_>>());

    // The log: JSON lines, events with their fields as keys.
    let log = node.stop();
    let mut events_logged = Vec::new();
    for l in &log {
        let v: Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("log line is not JSON ({e}): {l}"));
        assert!(v["timestamp"].is_string() && v["level"].is_string(), "{l}");
        if v["target"] == "flashpool::event" {
            events_logged.push(v);
        }
    }
    assert_eq!(events_logged.len(), seen as usize, "{log:#?}");
    let failed = events_logged
        .iter()
        .find(|v| v["kind"] == "drive_failed")
        .expect("drive_failed logged");
    assert_eq!(failed["drive"], "d1");
    assert_eq!(failed["volume"], "r1");
    assert_eq!(failed["level"], "WARN");
    assert!(failed["seq"].as_u64().is_some());
    assert!(failed["message"].as_str().unwrap().contains("d1"));

    // The node restarts under the follower: it says so, reconnects, and
    // gets the new run's events.
    let node = Node::start(&cfg, &api, io);
    host_connect(node.io, GOOD_HOST).expect("the allowed host connects again");
    let until = Instant::now() + WAIT;
    let mut after_restart = None;
    while after_restart.is_none() && Instant::now() < until {
        if let Ok(l) = follow_out.recv_timeout(Duration::from_millis(200)) {
            let v: Value = serde_json::from_str(&l).unwrap();
            if v["kind"] == "host_connected" && v["seq"].as_u64() <= Some(5) {
                after_restart = Some(v);
            }
        }
    }
    let v = after_restart.expect("the follower got the new run's host_connected");
    assert_eq!(v["host"], GOOD_HOST);
    // What it said on stderr (read on another thread: it may come in later
    // than the event on stdout it preceded).
    let mut notes = String::new();
    let until = Instant::now() + WAIT;
    while !["lost", "reconnected", "restarted"]
        .iter()
        .all(|w| notes.contains(w))
        && Instant::now() < until
    {
        if let Ok(l) = follow_err.recv_timeout(Duration::from_millis(200)) {
            notes += &l;
            notes.push('\n');
        }
    }
    assert!(notes.contains("lost"), "{notes}");
    assert!(notes.contains("reconnected"), "{notes}");
    assert!(notes.contains("restarted"), "{notes}");

    let _ = follower.kill();
    let _ = follower.wait();
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}
