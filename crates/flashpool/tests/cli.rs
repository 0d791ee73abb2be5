//! The `flashpool` binary as a user runs it: against a `flashpool serve` of
//! its own (RAM drives, free loopback ports), with stdout a terminal-less
//! pipe, or a pipe whose reader has gone (`flashpool drive list | head -1`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{BIN, free_port, scratch};

/// A `flashpool serve` with three 16 MiB RAM drives; killed on drop.
struct Server {
    child: Child,
    api: String,
    config: PathBuf,
    dir: PathBuf,
}

impl Server {
    /// `stdout_closed`: serve with a stdout whose reader has already gone.
    ///
    /// Its ports are picked free, then bound by the server: another test
    /// may take one meanwhile. A server that cannot bind is started again
    /// on other ports, and a server counts as up only once its own API
    /// answers (not merely once something accepts on the port).
    fn start(tag: &str, stdout_closed: bool) -> Server {
        let dir = scratch("cli", tag);
        for attempt in 1..=5 {
            if let Some(s) = Self::try_start(&dir, stdout_closed, attempt == 5) {
                return s;
            }
        }
        unreachable!("the last attempt panics")
    }

    /// One start; `None`: a port was taken (start again), unless `last`.
    fn try_start(dir: &std::path::Path, stdout_closed: bool, last: bool) -> Option<Server> {
        let dir = dir.to_path_buf();
        let api = format!("127.0.0.1:{}", free_port());
        let config = dir.join("node.toml");
        std::fs::write(
            &config,
            format!(
                r#"
[node]
reactors = 1
log = "warn"

[api]
address = "{api}"

[[listener]]
address = "127.0.0.1"
port = {io}

[[subsystem]]
nqn = "nqn.2026-01.io.flashpool:clitest"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = "mem"
size = "1MiB"

[[drive]]
name = "d0"
backend = "mem"
size = "16MiB"

[[drive]]
name = "d1"
backend = "mem"
size = "16MiB"

[[drive]]
name = "d2"
backend = "mem"
size = "16MiB"
"#,
                io = free_port()
            ),
        )
        .unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "-c"])
            .arg(&config)
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        if stdout_closed {
            cmd.stdout(closed_pipe());
        } else {
            cmd.stdout(Stdio::null());
        }
        let mut child = cmd.spawn().expect("flashpool serve starts");
        let addr: SocketAddr = api.parse().unwrap();
        let start = Instant::now();
        while !api_answers(&addr) {
            if let Some(st) = child.try_wait().unwrap() {
                let mut err = String::new();
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                if !last && err.contains("in use") {
                    return None;
                }
                panic!("flashpool serve exited ({st}) before its API answered: {err}");
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("flashpool serve: no API on {api} after 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Server {
            child,
            api,
            config,
            dir,
        })
    }

    /// `flashpool ARGS --api <this server>`.
    fn cli(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args).args(["--api", &self.api]).stdin(Stdio::null());
        c
    }

    /// Stops the server and returns what it wrote on stderr.
    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether an HTTP server (the API, which may ask for its token) answers
/// on `addr`: not the NVMe/TCP listener of another test's server.
fn api_answers(addr: &SocketAddr) -> bool {
    let Ok(mut c) = TcpStream::connect_timeout(addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
    let req = "GET /v1/drives HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    let mut head = [0u8; 7];
    c.write_all(req.as_bytes()).is_ok() && c.read_exact(&mut head).is_ok() && &head == b"HTTP/1."
}

/// The write end of a pipe whose read end is already closed: every write
/// to it fails with EPIPE, as `cmd | head -1` does once head has exited.
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer
}

/// Runs `cmd` with a closed stdout and checks that it ends as it would
/// have with a reader: its own exit status, no panic, nothing about the pipe.
fn ends_quietly_without_a_reader(mut cmd: Command, what: &str) -> Output {
    let out = cmd
        .stdout(closed_pipe())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "`{what}` with stdout closed: {} (stderr: {err})",
        out.status
    );
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe") && !err.contains("os error 32"),
        "`{what}` with stdout closed said: {err}"
    );
    out
}

fn run(mut cmd: Command) -> (String, String) {
    let out = cmd.stderr(Stdio::piped()).output().unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{:?}: {} {e}", cmd, out.status);
    (o, e)
}

#[test]
fn every_client_command_ends_quietly_when_stdout_is_closed() {
    let s = Server::start("epipe", false);
    let commands: &[&[&str]] = &[
        &["drive", "list"],
        &["drive", "list", "--json"],
        &[
            "volume", "create", "v1", "--layout", "raid1", "--drives", "d0,d1",
        ],
        &["volume", "list"],
        &["volume", "list", "--json"],
        &["volume", "show", "v1"],
        &["volume", "rebuild-status", "v1", "--wait"],
        &["drive", "fail", "d1"],
        &["drive", "replace", "d1", "--with", "d2"],
        &["volume", "rebuild-status", "v1", "--wait", "--json"],
    ];
    for args in commands {
        ends_quietly_without_a_reader(s.cli(args), &args.join(" "));
    }
    // A rebuilding volume cannot be deleted: wait with a reader.
    let mut wait = s.cli(&["volume", "rebuild-status", "v1", "--wait"]);
    run({
        wait.stdout(Stdio::null());
        wait
    });
    ends_quietly_without_a_reader(
        s.cli(&["volume", "delete", "v1", "--force"]),
        "volume delete v1",
    );
    // What it did, it did: the volume was made and deleted.
    let (o, _) = run(s.cli(&["volume", "list", "--json"]));
    assert_eq!(o.trim(), "[]", "{o}");
    // The failed and replaced drive left events (the node samples its
    // state every 250 ms): a follow that replays them sees its reader gone
    // and ends, as a plain listing does.
    let start = Instant::now();
    while run(s.cli(&["events", "--json"])).0.trim().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10), "no events");
        std::thread::sleep(Duration::from_millis(100));
    }
    for args in [
        &["events"][..],
        &["events", "--json"],
        &["events", "--follow", "--since", "0"],
    ] {
        ends_quietly_without_a_reader(s.cli(args), &args.join(" "));
    }
    let check = {
        let mut c = Command::new(BIN);
        c.args(["serve", "--check", "-c"]).arg(&s.config);
        c
    };
    ends_quietly_without_a_reader(check, "serve --check");
    let err = s.stop();
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bench_finishes_its_work_when_stdout_is_closed() {
    let dir = scratch("cli", "bench");
    let json = dir.join("summary.json");
    let mut c = Command::new(BIN);
    c.args([
        "bench",
        "--target",
        "mem:4MiB",
        "--runtime",
        "200ms",
        "--qd",
        "2",
        "--quiet",
        "--json",
    ])
    .arg(&json);
    ends_quietly_without_a_reader(c, "bench");
    let text = std::fs::read_to_string(&json).expect("the --json file is written all the same");
    assert!(text.trim_start().starts_with('{'), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_keeps_serving_when_stdout_is_closed() {
    let s = Server::start("serve-epipe", true);
    // The banner is printed after the API comes up: give it time to fail.
    std::thread::sleep(Duration::from_millis(500));
    let (o, _) = run(s.cli(&["drive", "list", "--json"]));
    assert!(o.contains("\"d0\""), "{o}");
    let err = s.stop();
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn volume_delete_prints_a_line_and_json_only_with_json() {
    let s = Server::start("delete", false);
    run(s.cli(&[
        "volume", "create", "v1", "--layout", "raid1", "--drives", "d0,d1",
    ]));
    let (o, _) = run(s.cli(&["volume", "delete", "v1", "--force"]));
    assert_eq!(o, "volume v1: deleted\n");
    run(s.cli(&[
        "volume", "create", "v2", "--layout", "raid1", "--drives", "d1,d2",
    ]));
    let (o, _) = run(s.cli(&["volume", "delete", "v2", "--force", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&o).expect("--json prints JSON");
    assert_eq!(v["deleted"], "v2", "{o}");
}
