//! Who may call the management API, and from where.
//!
//! Every request passes [`guard`] before any handler sees it:
//! 1. `Host` must name the address the client connected to (or
//!    `localhost` on loopback, or one of `[api] host_names`): a DNS
//!    rebinding page cannot reach the API under its own name.
//! 2. An `Origin` (or `Sec-Fetch-Site`) of another site is refused: a
//!    browser's cross-site request never gets through.
//! 3. A write (any method but GET/HEAD) with a body must say
//!    `Content-Type: application/json`, and no write may say another type:
//!    the POSTs a browser sends without asking first are all refused.
//! 4. A credential: `Authorization: Bearer <token>` (compared in constant
//!    time), a connection on the Unix socket, whose file permissions
//!    decide who may connect, or an HTTPS connection with a client
//!    certificate that `[api] client_ca` verified ([`super::tls`]); with
//!    `require_client_cert`, the certificate and the token. An address
//!    that presents wrong tokens [`MAX_FAILURES`](super::limiter::MAX_FAILURES) times within
//!    [`FAILURE_WINDOW`](super::limiter::FAILURE_WINDOW) is answered 429 with `Retry-After` until the
//!    window ends.
//!
//! A refused request reaches no handler, so it changes nothing. Every call
//! that may change something (all but GET/HEAD) is logged after it is
//! answered, with the caller's address and credential (a token's public id,
//! a socket peer's uid, a client certificate's name), never the secret.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use parking_lot::{Mutex, RwLock};

use super::limiter::{FAILURE_WINDOW, FailureLimiter, MAX_FAILURES, limiter_key_eq};
use super::token::{Token, private_dir, read_secret_file, write_secret_file};
use crate::api_types::{ErrorBody, TokenRotated};
use crate::client::runtime_token_path;
use crate::config::ApiSection;

/// Where a connection came from.
#[derive(Clone, Debug)]
pub enum PeerInfo {
    Tcp {
        peer: SocketAddr,
        local: SocketAddr,
        /// The client certificate `[api] client_ca` verified, by
        /// [`tls::identity`] (none without HTTPS and `client_ca`).
        cert: Option<String>,
    },
    Unix {
        uid: Option<u32>,
        pid: Option<i32>,
    },
}

impl std::fmt::Display for PeerInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerInfo::Tcp { peer, .. } => write!(f, "{peer}"),
            PeerInfo::Unix { uid, pid } => {
                write!(f, "unix socket")?;
                if let Some(p) = pid {
                    write!(f, " pid {p}")?;
                }
                if let Some(u) = uid {
                    write!(f, " uid {u}")?;
                }
                Ok(())
            }
        }
    }
}

/// The API's credentials and checks (one per node).
pub struct ApiAuth {
    token: RwLock<Token>,
    /// `[api] token_file` or `<state_dir>/api-token`: kept across restarts.
    persistent: Option<PathBuf>,
    /// The CLI's copy, by address and network namespace
    /// ([`runtime_token_path`]): `None` once the node stopped (or where it
    /// could not be written). A rotation holds this lock while it writes
    /// the files, so a stop never races it into leaving a file behind.
    runtime: Mutex<Option<PathBuf>>,
    /// Host names besides the connection's own address.
    host_names: Vec<String>,
    tls: bool,
    /// `[api] require_client_cert`: a verified client certificate and the
    /// token, both (else either one).
    pub(super) cert_and_token: bool,
    failures: Mutex<FailureLimiter>,
}

/// Who made a call, for the log.
#[derive(Clone, Debug)]
pub enum Caller {
    Token(String),
    Unix(Option<u32>),
    /// A verified client certificate's name, and the token's id where the
    /// token was required too.
    Cert {
        name: String,
        token: Option<String>,
    },
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Caller::Token(id) => write!(f, "token {id}"),
            Caller::Unix(Some(uid)) => write!(f, "unix socket uid {uid}"),
            Caller::Unix(None) => write!(f, "unix socket, uid unknown"),
            Caller::Cert { name, token: None } => write!(f, "{name}"),
            Caller::Cert {
                name,
                token: Some(id),
            } => write!(f, "{name} and token {id}"),
        }
    }
}

impl ApiAuth {
    /// An `ApiAuth` that accepts `token` only, writing nowhere (tests).
    #[cfg(test)]
    pub fn with_token(token: Token, tls: bool) -> ApiAuth {
        ApiAuth {
            token: RwLock::new(token),
            persistent: None,
            runtime: Mutex::new(None),
            host_names: Vec::new(),
            tls,
            cert_and_token: false,
            failures: Mutex::default(),
        }
    }

    /// Loads the node's token from `[api] token_file` (default
    /// `<state_dir>/api-token`), generating it there (mode 0600) if it is
    /// not there yet, and writes it to the runtime file for `bound` in this
    /// network namespace, which goes when the `ApiAuth` does (or at
    /// [`remove_runtime_token`](Self::remove_runtime_token)).
    pub fn load(cfg: &ApiSection, state_dir: Option<&Path>, bound: &str) -> Result<ApiAuth> {
        Self::load_at(cfg, state_dir, runtime_token_path(bound))
    }

    /// [`load`](Self::load), with the runtime file at `runtime`.
    fn load_at(cfg: &ApiSection, state_dir: Option<&Path>, runtime: PathBuf) -> Result<ApiAuth> {
        let persistent = cfg
            .token_file
            .clone()
            .or_else(|| state_dir.map(|d| d.join("api-token")));
        let token = match &persistent {
            Some(p) if p.exists() => read_secret_file(p).context("config: [api] token_file")?,
            Some(p) => {
                let t = Token::generate()?;
                write_secret_file(p, t.secret())?;
                tracing::info!("management API: new token {} in {}", t.id(), p.display());
                t
            }
            None => Token::generate()?,
        };
        let rt = runtime
            .parent()
            .map(private_dir)
            .unwrap_or(Ok(()))
            .and_then(|()| write_secret_file(&runtime, token.secret()));
        let runtime = match rt {
            Ok(()) => Some(runtime),
            Err(e) if let Some(p) = &persistent => {
                tracing::warn!(
                    "management API: {e:#}; the CLI finds the token in {} only with --token-file",
                    p.display()
                );
                None
            }
            Err(e) => {
                return Err(e).context(
                    "management API: nowhere to keep its token; set [api] token_file or [node] state_dir",
                );
            }
        };
        let auth = ApiAuth {
            token: RwLock::new(token),
            persistent,
            runtime: Mutex::new(runtime),
            host_names: cfg
                .host_names
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
            tls: cfg.tls_cert.is_some(),
            cert_and_token: cfg.require_client_cert,
            failures: Mutex::default(),
        };
        tracing::info!(
            "management API token {} in {}",
            auth.token.read().id(),
            auth.token_files()
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" and ")
        );
        Ok(auth)
    }

    /// The node's current token (for its calls to other nodes).
    pub fn token(&self) -> Token {
        self.token.read().clone()
    }

    /// A new token, written (atomically) to every token file before it
    /// takes effect; the old one stops working at once.
    pub fn rotate(&self) -> Result<Token> {
        let t = Token::generate()?;
        let runtime = self.runtime.lock();
        let files: Vec<&PathBuf> = self.persistent.iter().chain(runtime.iter()).collect();
        if let Some((first, rest)) = files.split_first() {
            write_secret_file(first, t.secret())?;
            for p in rest {
                if let Err(e) = write_secret_file(p, t.secret()) {
                    tracing::warn!("management API: {e:#}");
                }
            }
        }
        *self.token.write() = t.clone();
        Ok(t)
    }

    /// Where the token is written: the persistent file first (if any),
    /// then the runtime file for the CLI (until the node stops).
    pub fn token_files(&self) -> Vec<PathBuf> {
        self.persistent
            .iter()
            .chain(self.runtime.lock().iter())
            .cloned()
            .collect()
    }

    /// Removes the CLI's runtime copy of the token, as the node stops, if
    /// it still holds this node's token: a node started since on the same
    /// address may have written its own there. Once; a rotation after it
    /// writes the persistent file only.
    pub fn remove_runtime_token(&self) {
        let mut runtime = self.runtime.lock();
        let Some(p) = runtime.take() else {
            return;
        };
        let ours = self.token.read().secret().to_string();
        match std::fs::read_to_string(&p) {
            Ok(t) if t.trim() == ours => {
                if let Err(e) = std::fs::remove_file(&p) {
                    tracing::warn!("management API: cannot remove {}: {e}", p.display());
                }
            }
            Ok(_) => tracing::info!(
                "management API: {} holds another node's token now; left in place",
                p.display()
            ),
            Err(_) => {} // gone already
        }
    }

    /// Whether `host` (a `Host` header or an origin's authority) names this
    /// API as reached over `local`.
    fn host_ok(&self, host: &str, local: Option<SocketAddr>) -> bool {
        let host = host.trim().to_ascii_lowercase();
        let (name, port) = match host.strip_prefix('[') {
            Some(rest) => match rest.split_once(']') {
                Some((n, p)) => (n.to_string(), p.strip_prefix(':')),
                None => return false,
            },
            None => match host.rsplit_once(':') {
                Some((n, p)) => (n.to_string(), Some(p)),
                None => (host.clone(), None),
            },
        };
        let default_port = if self.tls { 443 } else { 80 };
        let port: u16 = match port {
            None => default_port,
            Some(p) => match p.parse() {
                Ok(p) => p,
                Err(_) => return false,
            },
        };
        let Some(local) = local else {
            return false;
        };
        if port != local.port() {
            return false;
        }
        if let Ok(ip) = name.parse::<IpAddr>() {
            return limiter_key_eq(ip, local.ip());
        }
        (name == "localhost" && local.ip().is_loopback()) || self.host_names.contains(&name)
    }

    /// Checks 1 to 3 of the module doc: `Err` is the refusal.
    fn check_request(&self, req: &Request, peer: Option<&PeerInfo>) -> Result<(), Refusal> {
        let h = req.headers();
        let local = match peer {
            Some(PeerInfo::Tcp { local, .. }) => Some(*local),
            _ => None,
        };
        let on_socket = matches!(peer, Some(PeerInfo::Unix { .. }));
        if !on_socket && let Some(host) = h.get(header::HOST) {
            let s = host.to_str().unwrap_or("");
            if !self.host_ok(s, local) {
                return Err(refusal(
                    StatusCode::FORBIDDEN,
                    format!(
                        "Host {} is not this API's address{}; call it by its address, \
                         or list the name in [api] host_names",
                        crate::echo::Echo(&String::from_utf8_lossy(host.as_bytes())),
                        local.map(|l| format!(" ({l})")).unwrap_or_default()
                    ),
                ));
            }
        }
        if let Some(o) = h.get(header::ORIGIN) {
            let s = o.to_str().unwrap_or("");
            let authority = s
                .strip_prefix(if self.tls { "https://" } else { "http://" })
                .filter(|a| !a.contains('/'));
            let same = match authority {
                Some(a) if on_socket => a == "localhost" || a.starts_with("localhost:"),
                Some(a) => self.host_ok(a, local),
                None => false,
            };
            if !same {
                return Err(refusal(
                    StatusCode::FORBIDDEN,
                    format!(
                        "cross-origin request from {} refused: the API takes no calls from web pages",
                        crate::echo::Echo(&String::from_utf8_lossy(o.as_bytes()))
                    ),
                ));
            }
        }
        if let Some(site) = h.get("sec-fetch-site")
            && !matches!(site.as_bytes(), b"same-origin" | b"none")
        {
            return Err(refusal(
                StatusCode::FORBIDDEN,
                "cross-site request refused (Sec-Fetch-Site): the API takes no calls from web pages"
                    .into(),
            ));
        }
        let read = matches!(*req.method(), Method::GET | Method::HEAD);
        if !read {
            let ct = h.get(header::CONTENT_TYPE);
            let json = ct.map(|v| {
                let s = v.to_str().unwrap_or("");
                let essence = s.split(';').next().unwrap_or("").trim();
                essence.eq_ignore_ascii_case("application/json")
            });
            let has_body = h.contains_key(header::TRANSFER_ENCODING)
                || h.get(header::CONTENT_LENGTH)
                    .is_some_and(|v| v.as_bytes() != b"0");
            if json == Some(false) || (json.is_none() && has_body) {
                return Err(refusal(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!(
                        "{} {}: a request body must be JSON, sent with Content-Type: application/json{}",
                        req.method(),
                        crate::echo::Echo(req.uri().path()),
                        ct.map(|v| format!(
                            " (this one is {})",
                            crate::echo::Echo(&String::from_utf8_lossy(v.as_bytes()))
                        ))
                        .unwrap_or_default()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Check 4: who calls.
    fn authenticate(&self, h: &HeaderMap, peer: Option<&PeerInfo>) -> Result<Caller, Refusal> {
        let (ip, cert) = match peer {
            Some(PeerInfo::Unix { uid, .. }) => return Ok(Caller::Unix(*uid)),
            Some(PeerInfo::Tcp { peer, cert, .. }) => (Some(peer.ip()), cert.clone()),
            None => (None, None),
        };
        match cert {
            // A certificate alone is enough: a token sent along is not
            // looked at (a node sends its own, which this node need not
            // share).
            Some(name) if !self.cert_and_token => return Ok(Caller::Cert { name, token: None }),
            // The handshake refuses a connection without one; this is in
            // case a listener lets one through.
            None if self.cert_and_token => {
                return Err(unauthorized(
                    "this API takes calls with a client certificate only \
                     ([api] require_client_cert), and the token as well"
                        .into(),
                ));
            }
            _ => {}
        }
        let Some(auth) = h.get(header::AUTHORIZATION) else {
            let what = match cert {
                Some(_) => "the token as well as a client certificate ([api] require_client_cert)",
                None => "a credential",
            };
            return Err(unauthorized(format!(
                "this call needs {what}: Authorization: Bearer <token>; the CLI reads the \
                 node's token file by itself (see docs/api.md, Authentication)"
            )));
        };
        let now = Instant::now();
        if let Some(ip) = ip
            && let Some(wait) = self.failures.lock().blocked(ip, now)
        {
            let secs = wait.as_secs() + 1;
            let r = Refusal {
                status: StatusCode::TOO_MANY_REQUESTS,
                msg: format!(
                    "too many wrong tokens from {ip}: refused for another {secs} s \
                     (more than {MAX_FAILURES} in {} s)",
                    FAILURE_WINDOW.as_secs()
                ),
                retry_after: Some(secs),
            };
            return Err(r);
        }
        let presented = auth
            .as_bytes()
            .split_at_checked(7)
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case(b"bearer "))
            .map(|(_, t)| t.trim_ascii());
        let token = self.token.read().clone();
        match presented {
            Some(p) if token.matches(p) => Ok(match cert {
                Some(name) => Caller::Cert {
                    name,
                    token: Some(token.id),
                },
                None => Caller::Token(token.id),
            }),
            _ => {
                if let Some(ip) = ip {
                    self.failures.lock().fail(ip, now);
                }
                Err(unauthorized(
                    "the API token is not valid (was it rotated? the CLI reads the current one \
                     from the node's token file; see docs/api.md, Authentication)"
                        .into(),
                ))
            }
        }
    }
}

/// A refused request's answer: `{"error": ...}` with its status.
struct Refusal {
    status: StatusCode,
    msg: String,
    retry_after: Option<u64>,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let msg = crate::echo::bounded(self.msg);
        let mut r = (self.status, axum::Json(ErrorBody { error: msg })).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"flashpool\""),
            );
        }
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

fn refusal(status: StatusCode, msg: String) -> Refusal {
    Refusal {
        status,
        msg,
        retry_after: None,
    }
}

fn unauthorized(msg: String) -> Refusal {
    refusal(StatusCode::UNAUTHORIZED, msg)
}

/// The middleware: checks, authenticates, then logs each call that may
/// change something.
async fn guard(State(auth): State<Arc<ApiAuth>>, req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<PeerInfo>>()
        .map(|c| c.0.clone());
    let who = peer
        .as_ref()
        .map_or_else(|| "unknown".to_string(), |p| p.to_string());
    let method = req.method().clone();
    let path = crate::echo::Echo(req.uri().path()).to_string();
    let caller = match auth
        .check_request(&req, peer.as_ref())
        .and_then(|()| auth.authenticate(req.headers(), peer.as_ref()))
    {
        Ok(c) => c,
        Err(r) => {
            tracing::warn!(
                target: "flashpool::api::audit",
                %method, path, status = r.status.as_u16(), peer = %who,
                "management API call refused"
            );
            return r.into_response();
        }
    };
    let read = matches!(method, Method::GET | Method::HEAD);
    let resp = next.run(req).await;
    if !read {
        tracing::info!(
            target: "flashpool::api::audit",
            %method, path, status = resp.status().as_u16(), peer = %who, caller = %caller,
            "management API call"
        );
    }
    resp
}

/// `POST /v1/api/token/rotate`: a new token; the old one stops working.
async fn rotate(State(auth): State<Arc<ApiAuth>>) -> Response {
    match auth.rotate() {
        Ok(t) => axum::Json(TokenRotated {
            files: auth.token_files(),
            token: t.secret().to_string(),
            token_id: t.id().to_string(),
        })
        .into_response(),
        Err(e) => refusal(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{e:#}; the old token still works"),
        )
        .into_response(),
    }
}

/// `router` with the token rotation call, behind [`guard`].
pub fn secure(router: Router, auth: Arc<ApiAuth>) -> Router {
    let calls = Router::new()
        .route("/v1/api/token/rotate", post(rotate))
        .with_state(auth.clone())
        .merge(router);
    // As in `api::router`: around the whole router, so that the rotation
    // call's 405 is JSON with its `Allow` header.
    Router::new()
        .fallback_service(calls)
        .layer(middleware::from_fn(super::errors::json_errors))
        .layer(middleware::from_fn_with_state(auth, guard))
}

/// The runtime file goes with the node, also when its start fails after
/// the token was written (the port taken, a bad socket path).
impl Drop for ApiAuth {
    fn drop(&mut self) {
        self.remove_runtime_token();
    }
}

/// The node's own token is what it sends when it calls other nodes.
impl crate::client::BearerToken for ApiAuth {
    fn bearer(&self) -> String {
        self.token().secret().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_the_connection_address() {
        let a = ApiAuth::with_token(Token::generate().unwrap(), false);
        let lo: SocketAddr = "127.0.0.1:9410".parse().unwrap();
        assert!(a.host_ok("127.0.0.1:9410", Some(lo)));
        assert!(a.host_ok("localhost:9410", Some(lo)));
        assert!(a.host_ok("LOCALHOST:9410", Some(lo)));
        assert!(!a.host_ok("127.0.0.1:9411", Some(lo)));
        assert!(!a.host_ok("evil.example:9410", Some(lo)));
        assert!(!a.host_ok("127.0.0.1", Some(lo)));
        assert!(!a.host_ok("127.0.0.2:9410", Some(lo)));
        let v6: SocketAddr = "[::1]:9410".parse().unwrap();
        assert!(a.host_ok("[::1]:9410", Some(v6)));
        assert!(!a.host_ok("[::1:9410", Some(v6)));
        let off: SocketAddr = "10.1.1.1:9410".parse().unwrap();
        assert!(!a.host_ok("localhost:9410", Some(off)));
    }

    /// Two nodes on one loopback address in two network namespaces (the
    /// namespace given, as `net_ns` would find it) and a third that
    /// replaces the second's file.
    #[test]
    fn runtime_token_files_are_per_namespace_and_go_with_their_node() {
        use crate::client::runtime_token_name;
        let dir = std::env::temp_dir().join(format!("flashpool-rtoken-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let run = dir.join("run");
        let at = |ns| run.join(runtime_token_name("127.0.0.1:9410", Some(ns)));
        let node = |name: &str, ns| {
            let state = dir.join(name);
            std::fs::create_dir_all(&state).unwrap();
            ApiAuth::load_at(&ApiSection::default(), Some(&state), at(ns)).unwrap()
        };
        let held = |ns| std::fs::read_to_string(at(ns)).unwrap().trim().to_string();
        let a = node("a", 1);
        let b = node("b", 2);
        assert_eq!(held(1), a.token().secret());
        assert_eq!(held(2), b.token().secret());
        assert_ne!(held(1), held(2));
        assert_eq!(a.token_files(), [dir.join("a/api-token"), at(1)]);
        // A rotation rewrites its own namespace's file only.
        let t = a.rotate().unwrap();
        assert_eq!(held(1), t.secret());
        assert_eq!(held(2), b.token().secret());
        // A stop removes the node's own file, not the other namespace's.
        drop(a);
        assert!(!at(1).exists());
        assert_eq!(held(2), b.token().secret());
        // A node that took over the file since: the stop leaves it be.
        let c = node("c", 2);
        b.remove_runtime_token();
        assert_eq!(held(2), c.token().secret());
        assert_eq!(b.token_files(), [dir.join("b/api-token")]);
        // Once stopped, a rotation writes the persistent file only.
        b.rotate().unwrap();
        assert_eq!(held(2), c.token().secret());
        drop(c);
        assert!(!at(2).exists());
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
