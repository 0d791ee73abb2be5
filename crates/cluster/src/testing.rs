//! Real etcd servers for tests: one member ([`EtcdServer`]) or three
//! ([`EtcdCluster`]), on free 127.0.0.1 ports with data in a temp dir
//! (tmpfs `/dev/shm` where there is one), fast elections
//! (`--heartbeat-interval 50 --election-timeout 500`).

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The etcd binary: `$FLASHPOOL_ETCD` or `/usr/bin/etcd`.
pub fn etcd_binary() -> PathBuf {
    std::env::var_os("FLASHPOOL_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"))
}

/// For tests: `true` if etcd is installed; `false` (skip) if it is not and
/// `FLASHPOOL_SKIP_ETCD=1`; panics with what to install otherwise.
pub fn etcd_available() -> bool {
    if etcd_binary().exists() {
        return true;
    }
    if std::env::var("FLASHPOOL_SKIP_ETCD").as_deref() == Ok("1") {
        eprintln!(
            "skipping: {} missing and FLASHPOOL_SKIP_ETCD=1",
            etcd_binary().display()
        );
        return false;
    }
    panic!(
        "{} not found: these tests need a real etcd; run `apt-get install etcd-server` \
         (or set FLASHPOOL_ETCD=/path/to/etcd, or FLASHPOOL_SKIP_ETCD=1 to skip them)",
        etcd_binary().display()
    );
}

fn tempdir() -> io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::Builder::new()
            .prefix("flashpool-etcd-")
            .tempdir_in(shm)
    {
        return Ok(d);
    }
    tempfile::Builder::new().prefix("flashpool-etcd-").tempdir()
}

fn free_ports(n: usize) -> io::Result<Vec<u16>> {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<io::Result<_>>()?;
    ls.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// A one-shot HTTP/1.0 request to etcd's HTTP gateway; returns the body.
fn http(port: u16, method: &str, path: &str, body: &str) -> io::Result<String> {
    let mut s =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(300))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}

fn healthy(client_port: u16) -> bool {
    http(client_port, "GET", "/health", "")
        .is_ok_and(|b| b.replace(' ', "").contains("\"health\":\"true\""))
}

struct Member {
    name: String,
    client: u16,
    peer: u16,
    dir: PathBuf,
    initial_cluster: String,
    election_ms: u32,
    child: Option<Child>,
}

impl Member {
    fn spawn(&mut self) -> io::Result<()> {
        let bin = etcd_binary();
        if !bin.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} not found: apt-get install etcd-server", bin.display()),
            ));
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", self.name)))?;
        let client = format!("http://127.0.0.1:{}", self.client);
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let child = Command::new(bin)
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(self.dir.join(&self.name))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args([
                "--initial-cluster",
                &self.initial_cluster,
                "--initial-cluster-state",
                "new",
            ])
            .args(["--initial-cluster-token", "flashpool-test"])
            .args([
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                &self.election_ms.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }

    fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(self.dir.join(format!("{}.log", self.name)))
            .unwrap_or_default();
        s.lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn wait_healthy(members: &mut [Member], which: &[usize], timeout: Duration) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    for &i in which {
        loop {
            if healthy(members[i].client) {
                break;
            }
            if members[i].exited() || Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "etcd member {} (client port {}) did not become healthy: {}",
                    members[i].name,
                    members[i].client,
                    members[i].log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

fn start_members(n: usize, election_ms: u32) -> io::Result<(tempfile::TempDir, Vec<Member>)> {
    let mut last = None;
    // free ports can be taken by someone else before etcd binds them: retry
    for _ in 0..3 {
        let dir = tempdir()?;
        let ports = free_ports(2 * n)?;
        let initial: Vec<String> = (0..n)
            .map(|i| format!("m{i}=http://127.0.0.1:{}", ports[2 * i + 1]))
            .collect();
        let mut members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client: ports[2 * i],
                peer: ports[2 * i + 1],
                dir: dir.path().to_path_buf(),
                initial_cluster: initial.join(","),
                election_ms,
                child: None,
            })
            .collect();
        let started = members
            .iter_mut()
            .try_for_each(Member::spawn)
            .and_then(|_| {
                let all: Vec<usize> = (0..n).collect();
                wait_healthy(&mut members, &all, Duration::from_secs(15))
            });
        match started {
            Ok(()) => return Ok((dir, members)),
            Err(e) => {
                members.iter_mut().for_each(Member::kill);
                if e.kind() == io::ErrorKind::NotFound {
                    return Err(e);
                }
                last = Some(e);
            }
        }
    }
    Err(last.unwrap())
}

/// One etcd member. Killed and its data removed on drop.
pub struct EtcdServer {
    member: Member,
    _dir: tempfile::TempDir,
}

impl EtcdServer {
    pub fn start() -> io::Result<Self> {
        let (dir, mut m) = start_members(1, 500)?;
        Ok(EtcdServer {
            member: m.remove(0),
            _dir: dir,
        })
    }

    /// `http://127.0.0.1:<port>`
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.member.client)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.member.kill();
    }
}

/// Election timeout of [`EtcdCluster`]: after the leader dies, the members
/// notice within one to two of these and may need a second round after a
/// split vote; with 500 ms that sometimes exceeds the 1.5 s a 2 s lease
/// (minus its 0.5 s fencing margin) leaves, so the cluster elects faster.
pub const CLUSTER_ELECTION_MS: u32 = 300;

/// Three etcd members (`--heartbeat-interval 50 --election-timeout 300`). All killed and their data removed on drop.
pub struct EtcdCluster {
    members: Vec<Member>,
    _dir: tempfile::TempDir,
}

impl EtcdCluster {
    pub fn start() -> io::Result<Self> {
        let (dir, members) = start_members(3, CLUSTER_ELECTION_MS)?;
        Ok(EtcdCluster { members, _dir: dir })
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client))
            .collect()
    }

    /// Index of the member that is leader, as the running members report it.
    pub fn leader_index(&self) -> Option<usize> {
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            let Ok(body) = http(m.client, "POST", "/v3/maintenance/status", "{}") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else {
                continue;
            };
            let leader = v["leader"].as_str().unwrap_or_default().to_string();
            if leader.is_empty() || leader == "0" {
                continue;
            }
            // ask each member its own ID to map the leader's ID to an index
            for (i, o) in self
                .members
                .iter()
                .enumerate()
                .filter(|(_, o)| o.child.is_some())
            {
                let Ok(b) = http(o.client, "POST", "/v3/maintenance/status", "{}") else {
                    continue;
                };
                let Ok(ov) = serde_json::from_str::<serde_json::Value>(&b) else {
                    continue;
                };
                if ov["header"]["member_id"].as_str() == Some(leader.as_str()) {
                    return Some(i);
                }
            }
        }
        None
    }

    /// SIGKILL member `i`.
    pub fn kill(&mut self, i: usize) {
        self.members[i].kill();
    }

    /// Starts member `i` again on its data and waits until it is healthy.
    pub fn restart(&mut self, i: usize) -> io::Result<()> {
        self.members[i].kill();
        self.members[i].spawn()?;
        wait_healthy(&mut self.members, &[i], Duration::from_secs(15))
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.members.iter_mut().for_each(Member::kill);
    }
}

/// The keys under `prefix` with their values, read straight from etcd at
/// `endpoint`: for tests that check what a node left behind.
pub async fn keys_under(endpoint: &str, prefix: &str) -> io::Result<Vec<(String, String)>> {
    let mut c = etcd_client::Client::connect([endpoint], None)
        .await
        .map_err(io::Error::other)?;
    let r = c
        .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .map_err(io::Error::other)?;
    Ok(r.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap_or_default().to_string(),
                kv.value_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

/// Writes `value` at `key` straight into etcd at `endpoint`: for tests
/// that stand in for what another version of flashpool wrote.
pub async fn put_raw(endpoint: &str, key: &str, value: &str) -> io::Result<()> {
    let mut c = etcd_client::Client::connect([endpoint], None)
        .await
        .map_err(io::Error::other)?;
    c.put(key, value, None).await.map_err(io::Error::other)?;
    Ok(())
}
