//! The management API's refusals, end to end: a
//! `flashpool serve` of its own on free loopback ports, spoken to in raw
//! HTTP as an attacker (or a browser) would. Each refusal is checked to
//! change nothing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{BIN, free_port, scratch};

struct Server {
    child: Child,
    api: String,
    dir: PathBuf,
    /// HTTPS: how `send` speaks to it (plain HTTP when `None`).
    tls: Option<Arc<rustls::ClientConfig>>,
}

fn config(api: &str, dir: &Path, extra: &str) -> String {
    format!(
        r#"
[node]
reactors = 1
log = "info"
state_dir = "{state}"

[api]
address = "{api}"
{extra}

[[listener]]
address = "127.0.0.1"
port = {io}

[[subsystem]]
nqn = "nqn.2026-01.io.flashpool:authtest"
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
"#,
        state = dir.join("state").display(),
        io = free_port()
    )
}

impl Server {
    fn start(tag: &str, extra: &str) -> Server {
        let dir = scratch("auth", tag);
        let api = format!("127.0.0.1:{}", free_port());
        let cfg = dir.join("node.toml");
        std::fs::write(&cfg, config(&api, &dir, extra)).unwrap();
        let log = std::fs::File::create(dir.join("serve.log")).unwrap();
        let mut child = Command::new(BIN)
            .args(["serve", "-c"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("flashpool serve starts");
        let addr: SocketAddr = api.parse().unwrap();
        let t0 = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(st) = child.try_wait().unwrap() {
                panic!(
                    "flashpool serve exited ({st}): {}",
                    std::fs::read_to_string(dir.join("serve.log")).unwrap()
                );
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "no API on {api}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Server {
            child,
            api,
            dir,
            tls: None,
        }
    }

    fn token_file(&self) -> PathBuf {
        self.dir.join("state/api-token")
    }

    fn token(&self) -> String {
        std::fs::read_to_string(self.token_file())
            .unwrap()
            .trim()
            .to_string()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap()
    }

    /// `METHOD PATH` with these header lines (and the token's, with
    /// `token`) and body, Host the API's address unless `headers` has one;
    /// over TLS with `tls`. `Err`: the TLS layer refused (a client
    /// certificate, or the lack of one).
    fn call(
        &self,
        tls: Option<&Arc<rustls::ClientConfig>>,
        token: bool,
        head: &str,
        headers: &[&str],
        body: &str,
    ) -> Result<Answer, String> {
        let mut req = format!("{head} HTTP/1.1\r\nConnection: close\r\n");
        if !headers
            .iter()
            .any(|h| h.to_ascii_lowercase().starts_with("host:"))
        {
            req += &format!("Host: {}\r\n", self.api);
        }
        if token {
            req += &format!("Authorization: Bearer {}\r\n", self.token());
        }
        for h in headers {
            req += &format!("{h}\r\n");
        }
        req += &format!("Content-Length: {}\r\n\r\n{body}", body.len());
        let mut s = TcpStream::connect(&self.api).unwrap();
        let text = match tls {
            Some(tls) => tls_exchange(tls, s, &req)?,
            None => {
                s.write_all(req.as_bytes()).unwrap();
                let mut text = String::new();
                s.read_to_string(&mut text).unwrap();
                text
            }
        };
        Ok(Answer::parse(&text))
    }

    /// `call` as `self.tls` says, without the token.
    fn send(&self, head: &str, headers: &[&str], body: &str) -> Answer {
        self.call(self.tls.as_ref(), false, head, headers, body)
            .unwrap_or_else(|e| panic!("no answer: {e}"))
    }

    fn with_token(&self, head: &str, extra: &[&str], body: &str) -> Answer {
        self.call(self.tls.as_ref(), true, head, extra, body)
            .unwrap_or_else(|e| panic!("no answer: {e}"))
    }

    /// The volumes and drive states, read with the token: what a refused
    /// request must not have changed.
    fn state(&self) -> String {
        let v = self.with_token("GET /v1/volumes", &[], "");
        let d = self.with_token("GET /v1/drives", &[], "");
        assert_eq!((v.status, d.status), (200, 200), "{} {}", v.body, d.body);
        format!("{}\n{}", v.body, d.body)
    }

    fn cli(&self, args: &[&str]) -> Command {
        let api = match self.tls {
            Some(_) => format!("https://{}", self.api),
            None => self.api.clone(),
        };
        let mut c = Command::new(BIN);
        c.args(args)
            .args(["--api", &api])
            .env_remove("FLASHPOOL_TOKEN")
            .env_remove("FLASHPOOL_TOKEN_FILE")
            .env_remove("FLASHPOOL_CLIENT_CERT")
            .env_remove("FLASHPOOL_CLIENT_KEY")
            .stdin(Stdio::null());
        c
    }
}

/// Runs `flashpool volume list` as `c` says and checks that it lists v1.
fn lists_v1(c: &mut Command) {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("v1"));
}

/// `req` over TLS on `tcp`, and the whole answer.
fn tls_exchange(
    tls: &Arc<rustls::ClientConfig>,
    tcp: TcpStream,
    req: &str,
) -> Result<String, String> {
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(tls.clone(), name).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut text = Vec::new();
    match s.read_to_end(&mut text) {
        Ok(_) if text.is_empty() => Err("closed with no answer".into()),
        Ok(_) => Ok(String::from_utf8_lossy(&text).into_owned()),
        // A server that closed without close_notify after its answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !text.is_empty() => {
            Ok(String::from_utf8_lossy(&text).into_owned())
        }
        Err(e) => Err(e.to_string()),
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Answer {
    status: u16,
    headers: String,
    body: String,
}

impl Answer {
    fn parse(text: &str) -> Answer {
        let (headers, body) = text.split_once("\r\n\r\n").expect("a whole answer");
        Answer {
            status: headers[9..12].parse().unwrap(),
            headers: headers.to_ascii_lowercase(),
            body: body.to_string(),
        }
    }

    fn error(&self) -> String {
        let v: serde_json::Value = serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body));
        v["error"].as_str().expect("an error").to_string()
    }
}

const CREATE: &str = r#"{"name": "v1", "layout": "raid1", "drives": ["d0", "d1"]}"#;
const JSON: &str = "Content-Type: application/json";

#[test]
fn the_token_file_is_private_and_a_good_token_works() {
    use std::os::unix::fs::MetadataExt;
    let s = Server::start("good", "");
    let m = std::fs::metadata(s.token_file()).unwrap();
    assert_eq!(m.mode() & 0o777, 0o600);
    assert!(s.token().len() >= 64);
    let a = s.with_token("POST /v1/volumes", &[JSON], CREATE);
    assert_eq!(a.status, 201, "{}", a.body);
    // The CLI finds the token by itself (the runtime file for --api).
    lists_v1(&mut s.cli(&["volume", "list"]));
}

#[test]
fn no_credential_or_a_wrong_one_is_401_and_changes_nothing() {
    let s = Server::start("unauth", "");
    let before = s.state();
    let a = s.send("POST /v1/volumes", &[JSON], CREATE);
    assert_eq!(a.status, 401, "{}", a.body);
    assert!(
        a.headers.contains("www-authenticate: bearer"),
        "{}",
        a.headers
    );
    assert!(a.error().contains("credential"), "{}", a.body);
    let a = s.send("POST /v1/drives/d0/fail", &[], "");
    assert_eq!(a.status, 401);
    let a = s.send("GET /v1/volumes", &[], "");
    assert_eq!(a.status, 401, "reads need a credential too");
    let wrong = format!("Authorization: Bearer {}x", s.token());
    let a = s.send("POST /v1/volumes", &[&wrong, JSON], CREATE);
    assert_eq!(a.status, 401);
    assert!(a.error().contains("not valid"), "{}", a.body);
    let a = s.send("DELETE /v1/volumes/v1", &["Authorization: Basic eDp5"], "");
    assert_eq!(a.status, 401);
    assert_eq!(s.state(), before);
    // The refusals are logged with the caller's address, never a token.
    let log = s.log();
    assert!(log.contains("management API call refused"), "{log}");
    assert!(log.contains("127.0.0.1:"), "{log}");
    assert!(!log.contains(&s.token()), "the log holds the secret");
}

#[test]
fn the_browser_request_of_the_issue_is_refused_and_changes_nothing() {
    let s = Server::start("browser", "");
    let before = s.state();
    let port = s.api.rsplit_once(':').unwrap().1;
    let evil_host = format!("Host: evil.example:{port}");
    // Exactly the request that used to get 201 Created (what a web page can make a browser send): text/plain, a foreign Origin and
    // Host, no credential.
    let a = s.send(
        "POST /v1/volumes",
        &[
            "Content-Type: text/plain",
            "Origin: http://evil.example",
            &evil_host,
        ],
        CREATE,
    );
    assert!(a.status == 403 || a.status == 401, "{}", a.body);
    let a = s.send(
        "POST /v1/drives/d0/fail",
        &["Origin: http://evil.example"],
        "",
    );
    assert_eq!(a.status, 403, "{}", a.body);
    // Each check alone refuses it, even with the right token.
    let a = s.with_token(
        "POST /v1/volumes",
        &[JSON, "Origin: http://evil.example"],
        CREATE,
    );
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.error().contains("cross-origin"), "{}", a.body);
    let a = s.with_token("POST /v1/volumes", &[JSON, "Origin: null"], CREATE);
    assert_eq!(a.status, 403, "{}", a.body);
    let a = s.with_token(
        "POST /v1/volumes",
        &[JSON, "Sec-Fetch-Site: cross-site"],
        CREATE,
    );
    assert_eq!(a.status, 403, "{}", a.body);
    let a = s.with_token("POST /v1/volumes", &[JSON, &evil_host], CREATE);
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.error().contains("Host"), "{}", a.body);
    let a = s.with_token("GET /v1/volumes", &[&evil_host], "");
    assert_eq!(a.status, 403, "DNS rebinding reads are refused too");
    let a = s.with_token("POST /v1/volumes", &["Content-Type: text/plain"], CREATE);
    assert_eq!(a.status, 415, "{}", a.body);
    assert!(a.error().contains("application/json"), "{}", a.body);
    let a = s.with_token(
        "POST /v1/drives/d0/fail",
        &["Content-Type: application/x-www-form-urlencoded"],
        "",
    );
    assert_eq!(a.status, 415, "{}", a.body);
    let a = s.with_token("POST /v1/volumes", &[], CREATE);
    assert_eq!(a.status, 415, "a body without a Content-Type: {}", a.body);
    assert_eq!(s.state(), before);
    // Same origin, localhost, and a charset parameter are fine.
    let origin = format!("Origin: http://{}", s.api);
    let a = s.with_token(
        "POST /v1/volumes",
        &["Content-Type: application/json; charset=utf-8", &origin],
        CREATE,
    );
    assert_eq!(a.status, 201, "{}", a.body);
    let lh = format!("Host: localhost:{port}");
    let a = s.with_token("GET /v1/volumes/v1", &[&lh], "");
    assert_eq!(a.status, 200, "{}", a.body);
}

#[test]
fn wrong_tokens_are_rate_limited_with_retry_after() {
    let s = Server::start("ratelimit", "");
    let before = s.state();
    let wrong = "Authorization: Bearer 00000000.not-the-token-of-this-node-at-all";
    for i in 0..10 {
        let a = s.send("POST /v1/volumes", &[wrong, JSON], CREATE);
        assert_eq!(a.status, 401, "attempt {i}: {}", a.body);
    }
    let a = s.send("POST /v1/volumes", &[wrong, JSON], CREATE);
    assert_eq!(a.status, 429, "{}", a.body);
    let retry: u64 = a
        .headers
        .lines()
        .find_map(|l| l.strip_prefix("retry-after: "))
        .expect("Retry-After")
        .trim()
        .parse()
        .unwrap();
    assert!((1..=61).contains(&retry), "{retry}");
    // While refused, even the right token is answered 429: guessing on
    // cannot tell a hit.
    let a = s.with_token("POST /v1/volumes", &[JSON], CREATE);
    assert_eq!(a.status, 429, "{}", a.body);
    // A request without a credential is not counted (a web page must not
    // be able to lock the operator out) and still gets 401.
    let a = s.send("GET /v1/volumes", &[], "");
    assert_eq!(a.status, 401);
    // The Unix socket is not limited; see unix_socket_calls_need_no_token.
    let _ = before;
}

#[test]
fn rotation_invalidates_the_old_token_and_the_cli_follows() {
    let s = Server::start("rotate", "");
    let old = s.token();
    let out = s.cli(&["api", "rotate-token"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("rotated"), "{text}");
    assert!(!text.contains(&s.token()), "the secret is printed: {text}");
    let new = s.token();
    assert_ne!(old, new);
    let a = s.with_token("GET /v1/api/token/rotate", &[], "");
    assert_eq!(a.status, 405);
    assert!(a.error().contains("POST"), "{}", a.body);
    assert_eq!(s.token(), new, "a refused rotation changes nothing");
    let a = s.send(
        "GET /v1/volumes",
        &[&format!("Authorization: Bearer {old}")],
        "",
    );
    assert_eq!(a.status, 401);
    assert_eq!(s.with_token("GET /v1/volumes", &[], "").status, 200);
    let out = s.cli(&["drive", "list"]).output().unwrap();
    assert!(out.status.success());
    // FLASHPOOL_TOKEN wins over the files; a wrong one says where it came from.
    let out = s
        .cli(&["drive", "list"])
        .env("FLASHPOOL_TOKEN", &old)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FLASHPOOL_TOKEN"), "{err}");
    // The change is logged with the caller's credential id, not the secret.
    let log = s.log();
    let id = new.split('.').next().unwrap();
    let old_id = old.split('.').next().unwrap();
    assert!(
        log.lines().any(|l| l.contains("management API call")
            && l.contains("/v1/api/token/rotate")
            && l.contains(&format!("token {old_id}"))
            && l.contains("127.0.0.1:")),
        "{log}"
    );
    assert!(!log.contains(&old) && !log.contains(&new));
    let _ = id;
}

#[test]
fn a_token_file_others_may_read_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("auth", "mode");
    let tf = dir.join("token");
    std::fs::write(&tf, "0123456789abcdef0123456789abcdef0123\n").unwrap();
    std::fs::set_permissions(&tf, std::fs::Permissions::from_mode(0o644)).unwrap();
    let api = format!("127.0.0.1:{}", free_port());
    let cfg = dir.join("node.toml");
    std::fs::write(
        &cfg,
        config(&api, &dir, &format!("token_file = \"{}\"", tf.display())),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["serve", "-c"])
        .arg(&cfg)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("chmod 600"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn off_loopback_without_tls_is_refused_at_start() {
    let dir = scratch("auth", "offloop");
    let cfg = dir.join("node.toml");
    let api = format!("0.0.0.0:{}", free_port());
    std::fs::write(&cfg, config(&api, &dir, "")).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "-c"])
        .arg(&cfg)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("HTTPS only") && err.contains("tls_cert"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unix_socket_calls_need_no_token_and_are_logged_with_the_uid() {
    let dir = scratch("auth", "unix");
    let sock = dir.join("api.sock");
    let s = Server::start("unix-srv", &format!("unix_socket = \"{}\"", sock.display()));
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    write!(
        c,
        "POST /v1/volumes HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{JSON}\r\n\
         Content-Length: {}\r\n\r\n{CREATE}",
        CREATE.len()
    )
    .unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    let a = Answer::parse(&text);
    assert_eq!(a.status, 201, "{}", a.body);
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let log = s.log();
    assert!(
        log.lines()
            .any(|l| l.contains("management API call") && l.contains(&format!("uid {uid}"))),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A self-signed CA and a certificate for 127.0.0.1 made by openssl
/// (skipped where there is no openssl).
fn make_certs(dir: &Path) -> bool {
    let run = |args: &[&str]| {
        Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    std::fs::write(
        dir.join("leaf.ext"),
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=flashpool test CA",
    ]) && run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "node.key",
        "-out",
        "node.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]) && run(&[
        "x509",
        "-req",
        "-in",
        "node.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "node.pem",
        "-days",
        "2",
        "-extfile",
        "leaf.ext",
    ])
}

#[test]
fn https_with_a_configured_certificate() {
    let dir = scratch("auth", "tls");
    if !make_certs(&dir) {
        eprintln!("no openssl: skipped");
        return;
    }
    let s = Server::start(
        "tls-srv",
        &format!(
            "tls_cert = \"{}\"\ntls_key = \"{}\"",
            dir.join("node.pem").display(),
            dir.join("node.key").display()
        ),
    );
    let url = format!("https://{}", s.api);
    let ca = dir.join("ca.pem");
    let out = Command::new(BIN)
        .args([
            "volume", "create", "v1", "--layout", "raid1", "--drives", "d0,d1",
        ])
        .args(["--api", &url, "--ca-file"])
        .arg(&ca)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Without the CA the certificate is not trusted.
    let out = Command::new(BIN)
        .args(["volume", "list", "--api", &url])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    // Plain HTTP to the HTTPS port gets no answer.
    let mut c = TcpStream::connect(&s.api).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = write!(c, "GET /v1/volumes HTTP/1.1\r\nHost: {}\r\n\r\n", s.api);
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    assert!(!String::from_utf8_lossy(&buf).contains("200 OK"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// PEM files for HTTPS with client certificates, made with rcgen in `dir`:
/// a CA (`ca.pem`), the node's certificate for 127.0.0.1 (`node.pem`,
/// `node.key`), a client certificate the CA signed (`good.pem`,
/// `good.key`) and one it did not (`bad.pem`, `bad.key`: self-signed),
/// both for CN node-b.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair,
        };
        let dir = scratch("auth", tag);
        let params = |cn: &str, sans: &[&str], usage: Vec<ExtendedKeyUsagePurpose>| {
            let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
            let mut p = CertificateParams::new(sans).unwrap();
            p.distinguished_name = rcgen::DistinguishedName::new();
            p.distinguished_name.push(DnType::CommonName, cn);
            p.extended_key_usages = usage;
            p
        };
        let write = |name: &str, cert: String, key: &KeyPair| {
            std::fs::write(dir.join(format!("{name}.pem")), cert).unwrap();
            std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
        };
        let mut ca = params("flashpool test CA", &[], Vec::new());
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        let client = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let node = params(
            "node-a",
            &["127.0.0.1"],
            vec![ExtendedKeyUsagePurpose::ServerAuth],
        );
        write("node", node.signed_by(&key, &ca).unwrap().pem(), &key);
        let key = KeyPair::generate().unwrap();
        let good = params("node-b", &["node-b.example"], client.clone());
        write("good", good.signed_by(&key, &ca).unwrap().pem(), &key);
        let key = KeyPair::generate().unwrap();
        let bad = params("node-b", &["node-b.example"], client);
        write("bad", bad.self_signed(&key).unwrap().pem(), &key);
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// `[api]` lines: HTTPS with `node.pem`, client certificates from
    /// `ca.pem`, and `extra`.
    fn api_config(&self, extra: &str) -> String {
        format!(
            "tls_cert = \"{}\"\ntls_key = \"{}\"\nclient_ca = \"{}\"\n{extra}",
            self.path("node.pem"),
            self.path("node.key"),
            self.path("ca.pem")
        )
    }

    /// A client that trusts `ca.pem` and presents `<who>.pem` if given.
    fn client(&self, who: Option<&str>) -> Arc<rustls::ClientConfig> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(self.dir.join("ca.pem")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let b = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        Arc::new(match who {
            None => b.with_no_client_auth(),
            Some(w) => {
                let certs = CertificateDer::pem_file_iter(self.dir.join(format!("{w}.pem")))
                    .unwrap()
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap();
                let key = PrivateKeyDer::from_pem_file(self.dir.join(format!("{w}.key"))).unwrap();
                b.with_client_auth_cert(certs, key).unwrap()
            }
        })
    }

    /// The CLI on `s`'s HTTPS API, trusting `ca.pem`.
    fn cli(&self, s: &Server, args: &[&str]) -> Command {
        let mut c = s.cli(args);
        c.arg("--ca-file").arg(self.dir.join("ca.pem"));
        c
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const FAIL_D1: &str = "POST /v1/drives/d1/fail";

#[test]
fn a_client_certificate_from_client_ca_opens_the_api_without_a_token() {
    let pki = Pki::new("mtls-pki");
    let mut s = Server::start("mtls", &pki.api_config(""));
    let (good, bad) = (pki.client(Some("good")), pki.client(Some("bad")));
    // A certificate the CA signed is the credential: no token.
    let a = s
        .call(Some(&good), false, "POST /v1/volumes", &[JSON], CREATE)
        .expect("an answer");
    assert_eq!(a.status, 201, "{}", a.body);
    // Without a certificate the token still opens it (the CLI, Prometheus).
    s.tls = Some(pki.client(None));
    let before = s.state();
    lists_v1(&mut pki.cli(&s, &["volume", "list"]));
    // One the CA did not sign is refused in the handshake, token or not.
    for token in [false, true] {
        let r = s.call(Some(&bad), token, FAIL_D1, &[], "");
        assert!(
            r.is_err(),
            "a self-signed certificate got {:?}",
            r.map(|a| a.body)
        );
    }
    // Neither certificate nor token: 401.
    assert_eq!(s.send(FAIL_D1, &[], "").status, 401);
    assert_eq!(s.state(), before);
    let log = s.log();
    assert!(
        log.lines().any(|l| l.contains("management API call")
            && l.contains("/v1/volumes")
            && l.contains("cert:CN=node-b")
            && l.contains("127.0.0.1:")),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("management API connection refused") && l.contains("127.0.0.1:")),
        "{log}"
    );
    // node.pem is for serverAuth only: other nodes with this client_ca
    // would refuse this node's calls, and it says so at start.
    assert!(
        log.contains("tls_cert is not a client certificate that [api] client_ca accepts"),
        "{log}"
    );
}

#[test]
fn require_client_cert_needs_the_certificate_and_the_token() {
    let pki = Pki::new("mtls-req-pki");
    let mut s = Server::start("mtls-req", &pki.api_config("require_client_cert = true"));
    let (good, bad, none) = (
        pki.client(Some("good")),
        pki.client(Some("bad")),
        pki.client(None),
    );
    s.tls = Some(good.clone());
    let before = s.state();
    // The token alone, or with a certificate the CA did not sign: refused
    // in the handshake.
    for tls in [&none, &bad] {
        let r = s.call(Some(tls), true, "POST /v1/volumes", &[JSON], CREATE);
        assert!(r.is_err(), "{:?}", r.map(|a| a.body));
    }
    // The certificate alone: 401.
    let a = s
        .call(Some(&good), false, "POST /v1/volumes", &[JSON], CREATE)
        .expect("an answer");
    assert_eq!(a.status, 401, "{}", a.body);
    assert!(a.error().contains("require_client_cert"), "{}", a.body);
    assert_eq!(s.state(), before);
    // Both: done, and logged with both.
    let a = s.with_token("POST /v1/volumes", &[JSON], CREATE);
    assert_eq!(a.status, 201, "{}", a.body);
    let id = s.token().split('.').next().unwrap().to_string();
    let log = s.log();
    assert!(
        log.lines().any(|l| l.contains("management API call")
            && l.contains(&format!("cert:CN=node-b and token {id}"))),
        "{log}"
    );
    assert!(!log.contains(&s.token()), "the log holds the secret");
    // The CLI: with --client-cert and --client-key only.
    let out = pki.cli(&s, &["volume", "list"]).output().unwrap();
    assert!(!out.status.success());
    let (cert, key) = (pki.path("good.pem"), pki.path("good.key"));
    let args = [
        "volume",
        "list",
        "--client-cert",
        &cert,
        "--client-key",
        &key,
    ];
    lists_v1(&mut pki.cli(&s, &args));
}

#[test]
fn client_certificate_settings_that_cannot_work_are_refused_at_start() {
    let pki = Pki::new("mtls-cfg-pki");
    let dir = scratch("auth", "mtls-cfg");
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let ca = pki.path("ca.pem");
    let https = format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"",
        pki.path("node.pem"),
        pki.path("node.key")
    );
    let cases = [
        (format!("client_ca = \"{ca}\""), "api.client_ca".to_string()),
        (
            "require_client_cert = true".into(),
            "require_client_cert".into(),
        ),
        (
            format!("{https}\nrequire_client_cert = true"),
            "needs api.client_ca".into(),
        ),
        (
            format!("{https}\nclient_ca = \"{}\"", empty.display()),
            format!("api.client_ca = {}: no CERTIFICATE", empty.display()),
        ),
    ];
    for (extra, want) in cases {
        let cfg = dir.join("node.toml");
        let api = format!("127.0.0.1:{}", free_port());
        std::fs::write(&cfg, config(&api, &dir, &extra)).unwrap();
        // `serve --check` says so, and so does `serve`.
        for check in [true, false] {
            let out = Command::new(BIN)
                .arg("serve")
                .args(check.then_some("--check"))
                .arg("-c")
                .arg(&cfg)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{extra}: started");
            assert!(err.contains(&want), "{extra}: {err}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
