//! The CLI's runtime copy of the API token, end to end: named by the API
//! address and the network namespace (two nodes on one loopback address in
//! two namespaces keep their own), and gone when the node stops or fails to
//! start, unless another node has written its own there since.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{BIN, free_port, scratch};

fn config(api: &str, dir: &Path) -> String {
    format!(
        r#"
[node]
reactors = 1
log = "info"
state_dir = "{state}"

[api]
address = "{api}"

[[listener]]
address = "127.0.0.1"
port = {io}

[[subsystem]]
nqn = "nqn.2026-01.io.flashpool:tokentest"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = "mem"
size = "1MiB"

[[drive]]
name = "d0"
backend = "mem"
size = "16MiB"
"#,
        state = dir.join("state").display(),
        io = free_port()
    )
}

/// The runtime file a node's log names: the last of the files in
/// "management API token ID in A and B".
fn runtime_file_in(log: &str) -> Option<PathBuf> {
    let line = log.lines().find(|l| l.contains("management API token "))?;
    let (_, files) = line.split_once(" in ")?;
    Some(PathBuf::from(files.rsplit(" and ").next()?.trim()))
}

/// This process's network namespace, as the node names it.
fn net_ns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net").unwrap().ino()
}

/// A `flashpool serve`, started through `wrap` (e.g. `unshare --net`);
/// killed on drop.
struct Node {
    child: Child,
    api: String,
    dir: PathBuf,
}

impl Node {
    fn start(tag: &str, api: &str, wrap: &[&str]) -> Node {
        let dir = scratch("token", tag);
        let cfg = dir.join("node.toml");
        std::fs::write(&cfg, config(api, &dir)).unwrap();
        let log = std::fs::File::create(dir.join("serve.log")).unwrap();
        let mut cmd = match wrap.split_first() {
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let child = cmd
            .args(["serve", "-c"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("flashpool serve starts");
        let mut n = Node {
            child,
            api: api.to_string(),
            dir,
        };
        // The log, not a connection: a node in another namespace cannot be
        // reached from here.
        let t0 = Instant::now();
        while !n.log().contains("management API on http") {
            if let Some(st) = n.child.try_wait().unwrap() {
                panic!("flashpool serve exited ({st}): {}", n.log());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "no API: {}",
                n.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        n
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    fn runtime_file(&self) -> PathBuf {
        runtime_file_in(&self.log()).unwrap_or_else(|| panic!("no token files: {}", self.log()))
    }

    /// `flashpool volume list` with nothing but `--api`, in this node's
    /// network namespace.
    fn cli(&self) -> Output {
        let ns = format!("--net=/proc/{}/ns/net", self.child.id());
        let mut c = Command::new("nsenter");
        c.arg(ns).arg(BIN);
        c.args(["volume", "list", "--api", &self.api])
            .env_remove("FLASHPOOL_TOKEN")
            .env_remove("FLASHPOOL_TOKEN_FILE")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// SIGTERM, and a clean exit within 30 s.
    fn stop(&mut self) {
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        let rc = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(rc, 0);
        let t0 = Instant::now();
        let st = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "no stop: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(st.success(), "{st}: {}", self.log());
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ok(out: &Output) -> bool {
    out.status.success()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_runtime_token_is_named_by_the_namespace_and_goes_at_stop() {
    let api = format!("127.0.0.1:{}", free_port());
    let mut n = Node::start("stop", &api, &[]);
    let f = n.runtime_file();
    let name = f.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(
        name,
        format!("api-{}-net{}.token", api.replace(':', "_"), net_ns())
    );
    assert!(f.exists());
    let out = Command::new(BIN)
        .args(["volume", "list", "--api", &api])
        .env_remove("FLASHPOOL_TOKEN")
        .env_remove("FLASHPOOL_TOKEN_FILE")
        .output()
        .unwrap();
    assert!(ok(&out), "the CLI finds the token: {}", stderr(&out));
    n.stop();
    assert!(!f.exists(), "{} outlived its node", f.display());
}

#[test]
fn a_stop_leaves_the_runtime_file_another_node_wrote() {
    let api = format!("127.0.0.1:{}", free_port());
    let mut n = Node::start("other", &api, &[]);
    let f = n.runtime_file();
    let other = format!("0badc0de.{}\n", "ab".repeat(32));
    std::fs::write(&f, &other).unwrap();
    n.stop();
    let left = std::fs::read_to_string(&f);
    let _ = std::fs::remove_file(&f);
    assert_eq!(left.unwrap(), other, "another node's token was removed");
}

#[test]
fn a_failed_start_leaves_no_runtime_file() {
    // The API's port is taken: the token is written, then the bind fails.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let api = taken.local_addr().unwrap().to_string();
    let dir = scratch("token", "failed");
    let cfg = dir.join("node.toml");
    std::fs::write(&cfg, config(&api, &dir)).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "-c"])
        .arg(&cfg)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let log = stderr(&out);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok(&out), "serve started on a taken port: {log}");
    assert!(log.contains("cannot listen"), "{log}");
    let f = runtime_file_in(&log).unwrap_or_else(|| panic!("no token files: {log}"));
    assert!(!f.exists(), "{} outlived a failed start", f.display());
}

/// Two nodes on the same loopback address, one in a network namespace of
/// its own: the CLI in each namespace reaches its node with its token.
/// Needs root and `unshare`/`nsenter` (util-linux); skipped without.
#[test]
fn nodes_on_one_address_in_two_namespaces_keep_their_own_tokens() {
    let can = Command::new("unshare")
        .args(["--net", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !can {
        eprintln!("skipped: cannot make a network namespace (needs root and unshare)");
        return;
    }
    let api = format!("127.0.0.1:{}", free_port());
    let mut a = Node::start("ns-a", &api, &[]);
    let up = "ip link set lo up && exec \"$@\"";
    let mut b = Node::start("ns-b", &api, &["unshare", "--net", "sh", "-c", up, "sh"]);
    let (fa, fb) = (a.runtime_file(), b.runtime_file());
    assert_ne!(fa, fb);
    for n in [&a, &b] {
        let out = n.cli();
        assert!(ok(&out), "{}: {}", n.dir.display(), stderr(&out));
    }
    b.stop();
    assert!(!fb.exists(), "{} outlived its node", fb.display());
    assert!(
        fa.exists(),
        "a stop in one namespace removed the other's file"
    );
    let out = a.cli();
    assert!(ok(&out), "{}", stderr(&out));
    a.stop();
    assert!(!fa.exists());
}
