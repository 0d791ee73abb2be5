//! Starting and stopping a cluster node as a new user does: `serve --check`
//! against what `serve` refuses, a start that fails after joining, and a
//! node stopped while it waits for etcd.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cluster::testing::{EtcdServer, etcd_available, keys_under};

mod common;

use common::{BIN, free_port, scratch};

/// A cluster node's TOML: `name` in cluster `cluster`, etcd at `etcd`, its
/// API at `api`, everything else on free loopback ports.
fn node_toml(dir: &Path, cluster: &str, etcd: &str, api: &str) -> PathBuf {
    let path = dir.join("node.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[node]
name = "n1"
reactors = 1
log = "info"

[cluster]
name = "{cluster}"
etcd = ["{etcd}"]
liveness = "127.0.0.1:{live}"

[[listener]]
address = "127.0.0.1"
port = {io}
kind = "io"

[api]
address = "{api}"
"#,
            live = free_port(),
            io = free_port(),
        ),
    )
    .unwrap();
    path
}

/// `flashpool serve -c CONFIG` with its stderr lines sent to the receiver.
fn serve(config: &Path) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(BIN)
        .args(["serve", "-c"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("flashpool serve starts");
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Waits up to `within` for a line containing `what`; returns every line seen.
fn wait_line(rx: &mpsc::Receiver<String>, what: &str, within: Duration) -> Vec<String> {
    let end = Instant::now() + within;
    let mut seen = Vec::new();
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) => {
                let hit = l.contains(what);
                seen.push(l);
                if hit {
                    return seen;
                }
            }
            Err(_) => break,
        }
    }
    panic!(
        "no line with {what:?} within {within:?}; saw:\n{}",
        seen.join("\n")
    )
}

/// The exit status within `within`, or the child is killed and the test fails.
fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("flashpool serve still running {within:?} later");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An API off loopback without TLS: `serve` refuses it, so `--check` does.
#[test]
fn serve_check_refuses_an_api_off_loopback_without_tls() {
    let dir = scratch("cluster-start", "check");
    let etcd = format!("http://127.0.0.1:{}", free_port());
    let config = node_toml(&dir, "c", &etcd, &format!("0.0.0.0:{}", free_port()));
    let out = Command::new(BIN)
        .args(["serve", "--check", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "--check passed: {err}");
    assert!(err.contains("is not a loopback address"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A start that fails after it joined (here: the API's port is taken)
/// leaves nothing of itself in etcd, its home slot included.
#[test]
fn a_start_that_fails_after_joining_leaves_no_slot_home() {
    if !etcd_available() {
        return;
    }
    let etcd = EtcdServer::start().unwrap();
    let dir = scratch("cluster-start", "slot-home");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let api = taken.local_addr().unwrap().to_string();
    let config = node_toml(&dir, "fail", &etcd.endpoint(), &api);
    let (mut child, rx) = serve(&config);
    let st = wait_exit(&mut child, Duration::from_secs(30));
    let lines: Vec<String> = rx.iter().collect();
    assert!(!st.success(), "serve started: {}", lines.join("\n"));
    assert!(
        lines.iter().any(|l| l.contains("joined as n1")),
        "it failed before the join, which this test is not about:\n{}",
        lines.join("\n")
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let left = rt
        .block_on(keys_under(&etcd.endpoint(), "/flashpool/fail/"))
        .unwrap();
    assert_eq!(left, vec![], "what the failed start left in etcd");
    drop(taken);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node that cannot reach etcd waits for it, and a SIGTERM or SIGINT
/// ends the wait: the node stops cleanly (it used to take only SIGKILL).
#[test]
fn a_node_waiting_for_etcd_stops_on_sigterm_and_sigint() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let dir = scratch("cluster-start", &format!("sig{sig}"));
        // Nothing listens there: the join waits.
        let etcd = format!("http://127.0.0.1:{}", free_port());
        let api = format!("127.0.0.1:{}", free_port());
        let config = node_toml(&dir, "c", &etcd, &api);
        let (mut child, rx) = serve(&config);
        wait_line(&rx, "cannot join yet", Duration::from_secs(30));
        let sent = Instant::now();
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        let st = wait_exit(&mut child, Duration::from_secs(10));
        let lines: Vec<String> = rx.iter().collect();
        assert!(st.success(), "signal {sig}: {st}: {}", lines.join("\n"));
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "signal {sig}: took {:?}",
            sent.elapsed()
        );
        let log = lines.join("\n");
        assert!(
            log.contains(&format!(
                "signal {sig}: stopping while waiting to join cluster c"
            )) && log.contains("stopped cleanly"),
            "{log}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// docs/cluster.md's OpenSSL commands make API certificates that work: a
/// node serves HTTPS with one (for its IP address), and its certificate is
/// also a client certificate that `client_ca` accepts (clientAuth).
#[test]
fn the_docs_openssl_commands_make_working_api_certificates() {
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("skipping: no openssl");
        return;
    }
    let doc = include_str!("../../../docs/cluster.md");
    let at = doc
        .find("    # The cluster's CA, once")
        .expect("docs/cluster.md: the certificate commands");
    let script: Vec<&str> = doc[at..]
        .lines()
        .take_while(|l| l.starts_with("    "))
        .map(|l| &l[4..])
        .collect();
    // c1's API address is 10.0.1.11 in the doc, 127.0.0.1 here.
    let script = script.join("\n").replace("10.0.1.11", "127.0.0.1");
    let dir = scratch("cluster-start", "certs");
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the doc's commands failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let api = format!("127.0.0.1:{}", free_port());
    let p = |f: &str| dir.join(f).display().to_string();
    let config = dir.join("c1.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[node]
name = "c1"
reactors = 1
log = "info"
state_dir = "{state}"

[[listener]]
address = "127.0.0.1"
port = {io}

[[subsystem]]
nqn = "nqn.2026-01.io.flashpool:certs"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = "mem"
size = "1MiB"

[api]
address = "{api}"
tls_cert = "{cert}"
tls_key = "{key}"
tls_ca = "{ca}"
client_ca = "{ca}"
"#,
            state = p("state"),
            io = free_port(),
            cert = p("c1.pem"),
            key = p("c1-key.pem"),
            ca = p("ca.pem"),
        ),
    )
    .unwrap();
    let (mut child, rx) = serve(&config);
    let seen = wait_line(&rx, "management API on https://", Duration::from_secs(30));
    assert!(
        !seen
            .iter()
            .any(|l| l.contains("is not a client certificate")),
        "{}",
        seen.join("\n")
    );
    // Another node's certificate as the client's: the credential, no token.
    let list = Command::new(BIN)
        .args(["drive", "list", "--api", &format!("https://{api}")])
        .env("FLASHPOOL_CA_FILE", p("ca.pem"))
        .env("FLASHPOOL_CLIENT_CERT", p("c2.pem"))
        .env("FLASHPOOL_CLIENT_KEY", p("c2-key.pem"))
        .env_remove("FLASHPOOL_TOKEN")
        .env_remove("FLASHPOOL_TOKEN_FILE")
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        list.status.success(),
        "drive list over mutual TLS: {}",
        String::from_utf8_lossy(&list.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
