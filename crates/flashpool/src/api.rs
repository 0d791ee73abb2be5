//! The management API: HTTP + JSON, on 127.0.0.1 by default; HTTPS only
//! off loopback. Every call needs a credential ([`crate::api_auth`]).
//! Every answer is JSON; an error is `{"error": "..."}` with a status code
//! that says whose fault it was (400 bad request, 404 unknown name or call,
//! 405 a method the call does not take, 409 conflicts with the node's
//! state, 413 a body over [`BODY_LIMIT`], 500 the node's own failure).
//! `docs/api.md` lists the calls.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRef, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::agent::{Agent, MoveRequest};
use crate::node::{
    AssembleVolume, CreateVolume, ExportDriveRequest, ExportRequest, Node, NodeError,
};

/// What the handlers reach: the node, and in cluster mode its agent.
#[derive(Clone)]
pub struct App {
    pub node: Arc<Node>,
    pub agent: Option<Arc<Agent>>,
}

impl FromRef<App> for Arc<Node> {
    fn from_ref(a: &App) -> Arc<Node> {
        a.node.clone()
    }
}

impl App {
    fn agent(&self) -> Result<&Arc<Agent>, ApiError> {
        self.agent.as_ref().ok_or_else(|| {
            ApiError(
                StatusCode::CONFLICT,
                "this node is not in a cluster ([cluster] in its TOML)".into(),
            )
        })
    }
}

/// `{"error": "..."}` with its status.
struct ApiError(StatusCode, String);

impl From<NodeError> for ApiError {
    fn from(e: NodeError) -> Self {
        ApiError(e.status(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let msg = crate::echo::bounded(self.1);
        (self.0, axum::Json(serde_json::json!({ "error": msg }))).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

fn ok<T: serde::Serialize>(v: T) -> ApiResult {
    Ok(axum::Json(v).into_response())
}

/// Parses a JSON body ourselves, so that a bad body gets the same error
/// shape as everything else (and clients need not send a Content-Type).
fn body<T: DeserializeOwned>(b: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(b).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("request body is not what this call takes: {e}; see docs/api.md"),
        )
    })
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FailBody {
    /// Fail it even when that takes its volume beyond its redundancy.
    #[serde(default)]
    force: bool,
}

/// `{"force": true}` of the calls that lose data without it (and the
/// assembly by name).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ForceBody {
    #[serde(default)]
    force: bool,
}

/// `?force=true` (for DELETE, whose body some clients cannot send).
#[derive(Deserialize, Default)]
struct ForceQuery {
    #[serde(default)]
    force: bool,
}

fn force_of(b: &Bytes, q: &ForceQuery) -> Result<bool, ApiError> {
    let r: ForceBody = if b.is_empty() {
        ForceBody::default()
    } else {
        body(b)?
    };
    Ok(r.force || q.force)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplaceBody {
    with: String,
}

/// The largest request body the API takes (axum's default, named so that
/// the error can say it).
pub const BODY_LIMIT: usize = 2 << 20;

/// What axum answers by itself is plain text or empty: 405 for a method a
/// route does not take, 413 for a body over the limit, 400/415/422 from an
/// extractor. This rewraps every such answer as `{"error": ...}`, keeping
/// its status and headers (the `Allow` of a 405).
pub(crate) async fn json_errors(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let path = crate::echo::Echo(&path);
    let msg = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            let allow = parts
                .headers
                .get(header::ALLOW)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            format!("{path} does not take {method}; it takes {allow} (see docs/api.md)")
        }
        StatusCode::PAYLOAD_TOO_LARGE => format!(
            "the request body is larger than {} ({BODY_LIMIT} bytes), the most this API takes; \
             bodies are small JSON objects (see docs/api.md)",
            crate::units::human_bytes(BODY_LIMIT as u64)
        ),
        _ if text.trim().is_empty() => format!(
            "{method} {path}: {}",
            status.canonical_reason().unwrap_or("error")
        ),
        _ => format!("{method} {path}: {}; see docs/api.md", text.trim()),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(
        parts,
        Body::from(serde_json::json!({ "error": msg }).to_string()),
    )
}

pub fn router(app: App) -> Router {
    let calls = Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/audit", get(audit))
        .route("/v1/events", get(events))
        .route("/v1/cluster", get(cluster_status))
        .route("/v1/cluster/probe/{name}", post(cluster_probe))
        .route("/v1/volumes/{name}/move", post(move_volume))
        .route("/v1/nodes/{name}/drain", post(drain_node))
        .route("/v1/nodes/{name}/undrain", post(undrain_node))
        .route("/v1/drives", get(drives))
        .route("/v1/drives/{name}", get(drive))
        .route("/v1/drives/{name}/fail", post(fail_drive))
        .route("/v1/drives/{name}/replace", post(replace_drive))
        .route("/v1/drives/{name}/re-add", post(re_add_drive))
        .route("/v1/volumes/{name}/assemble", post(assemble_by_name))
        .route(
            "/v1/drives/{name}/export",
            post(export_drive).delete(unexport_drive),
        )
        .route("/v1/volumes/assemble", post(assemble_volume))
        .route("/v1/volumes", get(volumes).post(create_volume))
        .route("/v1/volumes/{name}", get(volume).delete(delete_volume))
        .route("/v1/volumes/{name}/export", post(export))
        .route("/v1/volumes/{name}/unexport", post(unexport))
        .route("/v1/volumes/{name}/rebuild", get(rebuild_status))
        .route("/v1/volumes/{name}/scrub", post(scrub_volume))
        .route("/v1/volumes/{name}/scrub/stop", post(stop_scrub))
        .route("/v1/jobs", get(jobs))
        .route("/v1/jobs/{id}", get(job))
        .fallback(|| async {
            ApiError(
                StatusCode::NOT_FOUND,
                "no such API call; see docs/api.md".into(),
            )
        })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(app);
    // Around the whole router, not each route: a route's 405 gets its
    // `Allow` header outside the route's own layers.
    Router::new()
        .fallback_service(calls)
        .layer(middleware::from_fn(json_errors))
}

/// Prometheus text (the one answer that is not JSON; its errors still are).
async fn metrics(State(n): State<Arc<Node>>) -> Response {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        n.metrics().await,
    )
        .into_response()
}

async fn scrub_volume(State(n): State<Arc<Node>>, Path(name): Path<String>, b: Bytes) -> ApiResult {
    let req = if b.is_empty() {
        crate::node::ScrubRequest::default()
    } else {
        body(&b)?
    };
    let info = n.scrub_volume(&name, req).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(info)).into_response())
}

async fn stop_scrub(State(n): State<Arc<Node>>, Path(name): Path<String>) -> ApiResult {
    ok(n.stop_scrub(&name).await?)
}

async fn jobs(State(n): State<Arc<Node>>) -> ApiResult {
    ok(n.jobs().await)
}

async fn job(State(n): State<Arc<Node>>, Path(id): Path<String>) -> ApiResult {
    let id: u64 = id.parse().map_err(|_| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("job id {} is not a number", crate::echo::Echo(&id)),
        )
    })?;
    ok(n.job(id).await?)
}

async fn drives(State(n): State<Arc<Node>>) -> ApiResult {
    ok(n.drives().await)
}
async fn drive(State(n): State<Arc<Node>>, Path(name): Path<String>) -> ApiResult {
    ok(n.drive(&name).await?)
}
async fn fail_drive(State(n): State<Arc<Node>>, Path(name): Path<String>, b: Bytes) -> ApiResult {
    let r: FailBody = if b.is_empty() {
        FailBody::default()
    } else {
        body(&b)?
    };
    ok(n.fail_drive(&name, r.force).await?)
}
async fn replace_drive(
    State(n): State<Arc<Node>>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: ReplaceBody = body(&b)?;
    ok(n.replace_drive(&name, &r.with).await?)
}
async fn re_add_drive(State(n): State<Arc<Node>>, Path(name): Path<String>, b: Bytes) -> ApiResult {
    if !b.is_empty() {
        let _: serde::de::IgnoredAny = body(&b)?;
    }
    ok(n.re_add_drive(&name).await?)
}
async fn assemble_by_name(
    State(n): State<Arc<Node>>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: crate::node::AssembleByName = if b.is_empty() {
        Default::default()
    } else {
        body(&b)?
    };
    ok(n.assemble_by_name(&name, r.force).await?)
}
async fn export_drive(State(n): State<Arc<Node>>, Path(name): Path<String>, b: Bytes) -> ApiResult {
    let r: ExportDriveRequest = if b.is_empty() {
        ExportDriveRequest::default()
    } else {
        body(&b)?
    };
    ok(n.export_drive(&name, r, false).await?)
}
async fn unexport_drive(State(n): State<Arc<Node>>, Path(name): Path<String>) -> ApiResult {
    ok(n.unexport_drive(&name).await?)
}
async fn assemble_volume(State(n): State<Arc<Node>>, b: Bytes) -> ApiResult {
    let r: AssembleVolume = body(&b)?;
    ok(n.assemble_volume(r).await?)
}
async fn volumes(State(a): State<App>) -> ApiResult {
    let mut vs = a.node.volumes().await;
    if let Some(ag) = &a.agent {
        for v in &mut vs {
            ag.annotate(v).await;
        }
    }
    ok(vs)
}
async fn create_volume(State(a): State<App>, b: Bytes) -> ApiResult {
    let req: CreateVolume = body(&b)?;
    let info = match &a.agent {
        Some(ag) if req.pool.is_none() => ag.create(req).await?,
        _ => a.node.create_volume(req).await?,
    };
    Ok((StatusCode::CREATED, axum::Json(info)).into_response())
}
async fn volume(State(a): State<App>, Path(name): Path<String>) -> ApiResult {
    let mut v = a.node.volume(&name).await?;
    if let Some(ag) = &a.agent {
        ag.annotate(&mut v).await;
    }
    ok(v)
}
async fn delete_volume(
    State(a): State<App>,
    Path(name): Path<String>,
    Query(q): Query<ForceQuery>,
    b: Bytes,
) -> ApiResult {
    let force = force_of(&b, &q)?;
    let in_cluster = match &a.agent {
        Some(ag) => ag.delete(&name, force).await?.is_some(),
        None => false,
    };
    if !in_cluster {
        a.node.delete_volume(&name, force).await?;
    }
    ok(serde_json::json!({ "deleted": name }))
}
async fn audit(State(n): State<Arc<Node>>) -> ApiResult {
    ok(serde_json::json!({ "stale_writes": n.stale_write_audit() }))
}
async fn cluster_status(State(a): State<App>) -> ApiResult {
    ok(a.agent()?.status().await?)
}
async fn cluster_probe(State(a): State<App>, Path(name): Path<String>) -> ApiResult {
    a.agent()?.probe(&name).await?;
    ok(serde_json::json!({ "volume": name, "reachable": true }))
}
async fn move_volume(State(a): State<App>, Path(name): Path<String>, b: Bytes) -> ApiResult {
    let r: MoveRequest = body(&b)?;
    ok(a.agent()?.move_volume(&name, &r.to).await?)
}
async fn drain_node(State(a): State<App>, Path(name): Path<String>) -> ApiResult {
    ok(a.agent()?.drain(&name, true).await?)
}
async fn undrain_node(State(a): State<App>, Path(name): Path<String>) -> ApiResult {
    ok(a.agent()?.drain(&name, false).await?)
}
async fn export(State(n): State<Arc<Node>>, Path(name): Path<String>, b: Bytes) -> ApiResult {
    let x: ExportRequest = body(&b)?;
    ok(n.export(&name, x).await?)
}
async fn unexport(
    State(n): State<Arc<Node>>,
    Path(name): Path<String>,
    Query(q): Query<ForceQuery>,
    b: Bytes,
) -> ApiResult {
    ok(n.unexport(&name, force_of(&b, &q)?).await?)
}
async fn rebuild_status(State(n): State<Arc<Node>>, Path(name): Path<String>) -> ApiResult {
    let v = n.volume(&name).await?;
    ok(
        serde_json::json!({ "volume": v.name, "state": v.state, "members": v.members, "rebuild": v.rebuild }),
    )
}

/// `GET /v1/events` parameters.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    /// Events after this sequence number (`Last-Event-ID` wins over it).
    since: Option<u64>,
    /// The run of the node `since` counts in (the stream's `hello` tells
    /// it); from another run, every kept event is new to the client.
    boot: Option<String>,
    /// false: the kept events as one JSON array, at once.
    follow: Option<bool>,
}

/// How often an idle event stream gets a comment line, so that proxies
/// keep it open and a vanished client is noticed.
pub const EVENTS_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(15);

/// `GET /v1/events`: a server-sent event stream (or, with `follow=false`,
/// the kept events as a JSON array). See docs/api.md.
async fn events(
    State(n): State<Arc<Node>>,
    headers: axum::http::HeaderMap,
    q: Result<axum::extract::Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let axum::extract::Query(q) = q.map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!(
                "{}; /v1/events takes since=N, boot=ID and follow=true|false",
                e.body_text()
            ),
        )
    })?;
    // An empty one is what a client that saw no event may send: none.
    let last_event_id = match headers
        .get("last-event-id")
        .filter(|v| !v.as_bytes().trim_ascii().is_empty())
    {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "Last-Event-ID {} is not an event sequence number (the id: of an event)",
                            crate::echo::Echo(&String::from_utf8_lossy(v.as_bytes()))
                        ),
                    )
                })?,
        ),
    };
    let mut since = last_event_id.or(q.since);
    if q.boot.as_deref().is_some_and(|b| b != n.events.boot()) {
        // Numbers from an earlier run of the node.
        since = Some(0);
    }
    if q.follow == Some(false) {
        let sub = n.events.subscribe_after(since.unwrap_or(0));
        let past: Vec<&crate::events::Event> = sub.past.iter().map(|e| &**e).collect();
        return ok(past);
    }
    let sub = match since {
        Some(s) => n.events.subscribe_after(s),
        // A plain follow starts from now, as `mdadm --monitor` does.
        None => {
            let mut s = n.events.subscribe_after(u64::MAX);
            s.past.clear();
            s.missed = None;
            s
        }
    };
    let stream = event_stream(n.events.clone(), sub);
    Ok(axum::response::sse::Sse::new(stream)
        .keep_alive(
            axum::response::sse::KeepAlive::new()
                .interval(EVENTS_KEEP_ALIVE)
                .text("keep-alive"),
        )
        .into_response())
}

/// One event as SSE: `id: <seq>`, `event: <kind>`, `data: <JSON>`.
fn sse_event(e: &crate::events::Event) -> axum::response::sse::Event {
    axum::response::sse::Event::default()
        .id(e.seq.to_string())
        .event(e.kind.name())
        .data(serde_json::to_string(e).unwrap_or_default())
}

/// `event: lagged`: events `from..=to` are lost to this client.
fn lagged_event(from: u64, to: u64) -> axum::response::sse::Event {
    axum::response::sse::Event::default().event("lagged").data(
        serde_json::json!({
            "missed_from": from,
            "missed_to": to,
            "message": format!(
                "events {from} to {to} are no longer kept (the node keeps the last {}); \
                 check the volumes' state: flashpool volume list",
                crate::events::RING
            ),
        })
        .to_string(),
    )
}

/// The stream: `hello` (the node's run and newest number), a `lagged`
/// when events after the asked number were dropped, the kept events, then
/// live ones. A subscriber that falls behind the broadcast picks up again
/// from the ring, with a `lagged` for what the ring no longer has. Ends when
/// the client goes (the body is dropped) or the node stops.
fn event_stream(
    events: Arc<crate::events::Events>,
    sub: crate::events::Subscription,
) -> impl futures_util::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>
+ Send
+ 'static {
    use std::collections::VecDeque;
    use tokio::sync::broadcast::error::RecvError;

    let mut pending: VecDeque<axum::response::sse::Event> = VecDeque::new();
    pending.push_back(
        axum::response::sse::Event::default().event("hello").data(
            serde_json::json!({ "boot": events.boot(), "last_seq": sub.last_seq }).to_string(),
        ),
    );
    if let Some((from, to)) = sub.missed {
        pending.push_back(lagged_event(from, to));
    }
    let last = sub.past.last().map_or(sub.last_seq, |e| e.seq);
    pending.extend(sub.past.iter().map(|e| sse_event(e)));
    let state = (events, sub.rx, pending, last);
    futures_util::stream::unfold(
        state,
        |(events, mut rx, mut pending, mut last)| async move {
            loop {
                if let Some(e) = pending.pop_front() {
                    return Some((Ok(e), (events, rx, pending, last)));
                }
                match rx.recv().await {
                    Ok(e) if e.seq <= last => continue,
                    Ok(e) => {
                        last = e.seq;
                        pending.push_back(sse_event(&e));
                    }
                    Err(RecvError::Lagged(_)) => {
                        let sub = events.subscribe_after(last);
                        if let Some((from, to)) = sub.missed {
                            pending.push_back(lagged_event(from, to));
                        }
                        if let Some(e) = sub.past.last() {
                            last = e.seq;
                        }
                        pending.extend(sub.past.iter().map(|e| sse_event(e)));
                        rx = sub.rx;
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        },
    )
}

/// What [`start`] serves on.
pub struct Started {
    /// The TCP address bound (with its scheme: `http://` on loopback only,
    /// else `https://`).
    pub addr: SocketAddr,
    pub url: String,
    pub auth: Arc<crate::api_auth::ApiAuth>,
}

/// Binds the API as `[api]` says (HTTPS with `tls_cert`, required off
/// loopback; the Unix socket with `unix_socket`) behind the checks of
/// [`crate::api_auth`], and serves it on `rt` until the process ends.
pub fn start(
    rt: &tokio::runtime::Runtime,
    app: App,
    cfg: &crate::config::ApiSection,
    state_dir: Option<&std::path::Path>,
) -> Result<Started> {
    use crate::api_auth::{ApiAuth, PeerInfo, listen};
    let addr = &cfg.address;
    let sa: SocketAddr = addr.parse().with_context(|| {
        format!("config: api.address = {addr:?} is not ADDR:PORT; use e.g. \"127.0.0.1:9410\"")
    })?;
    let tls = crate::api_auth::tls::server_config(cfg)?;
    if tls.is_none() && !sa.ip().is_loopback() {
        anyhow::bail!(
            "config: api.address = {sa} is not a loopback address, and off loopback the management \
             API is served over HTTPS only: set [api] tls_cert and tls_key (PEM files), or bind it \
             to 127.0.0.1 (see docs/config.md, [api])"
        );
    }
    // The token files are written before the port opens: a client that
    // sees the port open finds the token already there.
    let auth = match sa.port() {
        0 => None,
        _ => Some(Arc::new(ApiAuth::load(cfg, state_dir, &sa.to_string())?)),
    };
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(sa))
        .with_context(|| {
            format!(
                "management API: cannot listen on {sa}; set [api] address to a free port, or enabled = false"
            )
        })?;
    let bound = listener.local_addr()?;
    let auth = match auth {
        Some(a) => a,
        None => Arc::new(ApiAuth::load(cfg, state_dir, &bound.to_string())?),
    };
    let app = crate::api_auth::secure(router(app), auth.clone());
    let scheme = if tls.is_some() { "https" } else { "http" };
    if let Some(path) = &cfg.unix_socket {
        let mode = match &cfg.unix_socket_mode {
            None => 0o600,
            Some(m) => u32::from_str_radix(m.trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m & !0o777 == 0 && *m & 0o007 == 0)
                .with_context(|| {
                    format!(
                        "config: api.unix_socket_mode = {m:?} is not an octal mode without \
                         permissions for others, e.g. \"0600\" or \"0660\""
                    )
                })?,
        };
        let _in_rt = rt.enter();
        let l = listen::bind_unix(path, mode)?;
        let svc = app
            .clone()
            .into_make_service_with_connect_info::<PeerInfo>();
        tracing::info!("management API on unix:{} (mode {mode:o})", path.display());
        rt.spawn(async move {
            if let Err(e) = axum::serve(l, svc).await {
                tracing::error!("management API socket stopped: {e}");
            }
        });
    }
    let svc = app.into_make_service_with_connect_info::<PeerInfo>();
    match tls {
        Some(c) => {
            let _in_rt = rt.enter();
            let l = listen::Tls::new(listener, c)?;
            rt.spawn(async move {
                if let Err(e) = axum::serve(l, svc).await {
                    tracing::error!("management API stopped: {e}");
                }
            });
        }
        None => {
            rt.spawn(async move {
                if let Err(e) = axum::serve(listen::Plain(listener), svc).await {
                    tracing::error!("management API stopped: {e}");
                }
            });
        }
    }
    let url = format!("{scheme}://{bound}");
    tracing::info!("management API on {url}/v1/");
    Ok(Started {
        addr: bound,
        url,
        auth,
    })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};

    use axum::Json;

    use super::*;
    use crate::node::NodeState;

    /// Serves `r` on a free loopback port, on its own runtime thread.
    fn serve(r: Router) -> SocketAddr {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(std_listener).unwrap();
                axum::serve(l, r).await.unwrap();
            });
        });
        addr
    }

    fn node_api() -> SocketAddr {
        let node = Node::with_state_dir(NodeState::default(), None);
        serve(router(App { node, agent: None }))
    }

    struct Answer {
        status: u16,
        headers: String,
        json: serde_json::Value,
    }

    /// One HTTP/1.1 request, as a client that speaks raw HTTP sends it; the
    /// body is written on another thread while the answer is read, as the
    /// server may answer before it has read the body.
    fn http(addr: SocketAddr, head: &str, body: Vec<u8>) -> Answer {
        let mut s = TcpStream::connect(addr).unwrap();
        let req = format!(
            "{head} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut w = s.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            let _ = w.write_all(&body);
        });
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
                // The server may close while the body is still coming:
                // what it answered was read first.
                Err(_) if !raw.is_empty() => break,
                Err(e) => panic!("{head}: {e}"),
            }
        }
        let _ = s.shutdown(std::net::Shutdown::Both);
        writer.join().unwrap();
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (headers, body) = text.split_once("\r\n\r\n").expect("a whole answer");
        let status = headers[9..12].parse().unwrap();
        let json = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("{head}: answer is not JSON ({e}): {text}"));
        Answer {
            status,
            headers: headers.to_ascii_lowercase(),
            json,
        }
    }

    fn error_of(a: &Answer) -> &str {
        let obj = a.json.as_object().expect("an object");
        assert_eq!(obj.len(), 1, "only \"error\": {}", a.json);
        a.json["error"].as_str().expect("error is a string")
    }

    #[test]
    fn an_unknown_method_is_405_json_with_allow() {
        let api = node_api();
        let a = http(api, "PUT /v1/volumes/v1", b"{}".to_vec());
        assert_eq!(a.status, 405);
        assert!(
            a.headers.contains("content-type: application/json"),
            "{}",
            a.headers
        );
        let allow = a
            .headers
            .lines()
            .find_map(|l| l.strip_prefix("allow: "))
            .expect("an Allow header");
        assert!(allow.contains("get") && allow.contains("delete"), "{allow}");
        let e = error_of(&a);
        assert!(e.contains("does not take PUT") && e.contains("GET"), "{e}");
        let a = http(api, "PATCH /v1/volumes", Vec::new());
        assert_eq!(a.status, 405);
        assert!(error_of(&a).contains("POST"), "{}", a.json);
    }

    #[test]
    fn metrics_are_prometheus_text_and_refuse_post_in_json() {
        let api = node_api();
        let mut s = TcpStream::connect(api).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert!(
            body.contains("# TYPE flashpool_build_info gauge\n"),
            "{body}"
        );
        let a = http(api, "POST /metrics", Vec::new());
        assert_eq!(a.status, 405);
        assert!(error_of(&a).contains("GET"), "{}", a.json);
    }

    #[test]
    fn an_unknown_call_is_404_json() {
        let a = http(node_api(), "GET /v1/nothing/here", Vec::new());
        assert_eq!(a.status, 404);
        assert!(error_of(&a).contains("no such API call"), "{}", a.json);
    }

    #[test]
    fn a_body_over_the_limit_is_413_json() {
        let api = node_api();
        let body = format!("{{\"name\": \"{}\"}}", "x".repeat(3 << 20)).into_bytes();
        let a = http(api, "POST /v1/volumes", body);
        assert_eq!(a.status, 413);
        assert!(error_of(&a).contains("2.0 MiB"), "{}", a.json);
    }

    #[test]
    fn a_bad_path_is_400_json() {
        // Not UTF-8 once percent-decoded: the Path extractor refuses it.
        let a = http(node_api(), "GET /v1/volumes/%FF", Vec::new());
        assert_eq!(a.status, 400);
        error_of(&a);
    }

    /// The same layer turns the `Json` extractor's own answers into JSON
    /// (the node's calls parse bodies themselves, so any future route that
    /// uses the extractor is covered too).
    #[test]
    fn json_extractor_rejections_are_json() {
        let r = Router::new()
            .route(
                "/v1/echo",
                post(|Json(v): Json<serde_json::Value>| async move { Json(v) }),
            )
            .layer(middleware::from_fn(json_errors));
        let api = serve(r);
        // No Content-Type: 415.
        let a = http(api, "POST /v1/echo", b"{}".to_vec());
        assert_eq!(a.status, 415);
        assert!(error_of(&a).contains("Content-Type"), "{}", a.json);
        // Broken JSON: 400.
        let mut s = TcpStream::connect(api).unwrap();
        let body = "{not json";
        write!(
            s,
            "POST /v1/echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        assert!(text.starts_with("HTTP/1.1 400"), "{text}");
        let v: serde_json::Value =
            serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
        assert!(v["error"].as_str().unwrap().contains("JSON"), "{v}");
    }

    #[test]
    fn a_huge_name_is_not_echoed_whole() {
        let api = node_api();
        let huge = "n".repeat(1_500_000);
        let body = format!(r#"{{"name": "{huge}", "layout": "raid1", "drives": ["a", "b"]}}"#);
        let a = http(api, "POST /v1/volumes", body.into_bytes());
        assert_eq!(a.status, 400);
        let e = error_of(&a);
        assert!(e.len() < 400, "{} bytes", e.len());
        assert!(e.contains("… (1500000 bytes)"), "{e}");
        // A value quoted by the JSON parser itself is cut too.
        let body = format!(r#"{{"name": "v", "block_size": "{huge}"}}"#);
        let a = http(api, "POST /v1/volumes", body.into_bytes());
        assert_eq!(a.status, 400);
        let e = error_of(&a);
        assert!(e.len() < 5000, "{} bytes", e.len());
        assert!(e.contains("message cut"), "{e}");
    }

    #[test]
    fn a_bad_body_on_a_node_call_is_400_json() {
        let a = http(node_api(), "POST /v1/volumes", b"{not json".to_vec());
        assert_eq!(a.status, 400);
        assert!(error_of(&a).contains("request body"), "{}", a.json);
    }

    fn node_and_api() -> (Arc<Node>, SocketAddr) {
        let node = Node::with_state_dir(NodeState::default(), None);
        let api = serve(router(App {
            node: node.clone(),
            agent: None,
        }));
        (node, api)
    }

    /// One SSE message: its id, event name and data.
    #[derive(Debug, PartialEq)]
    struct Msg {
        id: Option<String>,
        event: String,
        data: String,
    }

    /// An open event stream (HTTP/1.0, so the body is not chunked).
    struct Stream {
        s: TcpStream,
        buf: String,
        head_done: bool,
    }

    impl Stream {
        fn open(addr: SocketAddr, query: &str, headers: &str) -> Stream {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
                .unwrap();
            write!(
                s,
                "GET /v1/events{query} HTTP/1.0\r\nHost: x\r\n{headers}\r\n"
            )
            .unwrap();
            Stream {
                s,
                buf: String::new(),
                head_done: false,
            }
        }

        /// The next message (comments skipped).
        fn next(&mut self) -> Msg {
            loop {
                if !self.head_done
                    && let Some((head, rest)) = self.buf.split_once("\r\n\r\n")
                {
                    assert!(
                        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
                        "{head}"
                    );
                    assert!(
                        head.to_ascii_lowercase()
                            .contains("content-type: text/event-stream"),
                        "{head}"
                    );
                    self.buf = rest.to_string();
                    self.head_done = true;
                }
                if self.head_done
                    && let Some((block, rest)) = self.buf.split_once("\n\n")
                {
                    let block = block.to_string();
                    self.buf = rest.to_string();
                    let mut m = Msg {
                        id: None,
                        event: String::new(),
                        data: String::new(),
                    };
                    for l in block.lines() {
                        if let Some(v) = l.strip_prefix("id: ") {
                            m.id = Some(v.into());
                        } else if let Some(v) = l.strip_prefix("event: ") {
                            m.event = v.into();
                        } else if let Some(v) = l.strip_prefix("data: ") {
                            m.data = v.into();
                        }
                    }
                    if m.event.is_empty() && m.data.is_empty() {
                        continue; // a keep-alive comment
                    }
                    return m;
                }
                let mut b = [0u8; 4096];
                let n = self.s.read(&mut b).expect("the stream goes on");
                assert!(n > 0, "the stream ended: {}", self.buf);
                self.buf.push_str(&String::from_utf8_lossy(&b[..n]));
            }
        }

        /// The next event's sequence number, checking its framing.
        fn next_seq(&mut self) -> u64 {
            let m = self.next();
            let v: serde_json::Value = serde_json::from_str(&m.data).unwrap();
            let seq = v["seq"].as_u64().unwrap();
            assert_eq!(m.id.as_deref(), Some(seq.to_string().as_str()), "{m:?}");
            assert_eq!(m.event, v["kind"].as_str().unwrap(), "{m:?}");
            seq
        }
    }

    fn emit(node: &Node, i: usize) {
        use crate::events::{EventKind, NewEvent};
        node.events.emit(
            NewEvent::new(EventKind::DriveFailed, format!("event {i}"))
                .drive(format!("d{i}"))
                .volume("v"),
        );
    }

    #[test]
    fn events_stream_replays_after_since_then_goes_live() {
        let (node, api) = node_and_api();
        for i in 1..=3 {
            emit(&node, i);
        }
        let mut s = Stream::open(api, "?since=1", "");
        let hello = s.next();
        assert_eq!(hello.event, "hello");
        assert!(hello.id.is_none());
        let h: serde_json::Value = serde_json::from_str(&hello.data).unwrap();
        assert_eq!(h["last_seq"], 3);
        assert_eq!(h["boot"], node.events.boot());
        let m = s.next();
        assert_eq!(m.id.as_deref(), Some("2"));
        assert_eq!(m.event, "drive_failed");
        let v: serde_json::Value = serde_json::from_str(&m.data).unwrap();
        assert_eq!(v["drive"], "d2");
        assert_eq!(v["severity"], "warning");
        assert_eq!(v["message"], "event 2");
        assert_eq!(s.next_seq(), 3);
        emit(&node, 4);
        assert_eq!(s.next_seq(), 4);
    }

    #[test]
    fn a_plain_follow_starts_from_now() {
        let (node, api) = node_and_api();
        emit(&node, 1);
        let mut s = Stream::open(api, "", "");
        assert_eq!(s.next().event, "hello");
        emit(&node, 2);
        assert_eq!(s.next_seq(), 2);
    }

    #[test]
    fn last_event_id_resumes_with_no_gap_and_no_repeat() {
        let (node, api) = node_and_api();
        for i in 1..=5 {
            emit(&node, i);
        }
        // An empty header is none: since= counts.
        let mut s = Stream::open(api, "?since=4", "Last-Event-ID: \r\n");
        assert_eq!(s.next().event, "hello");
        assert_eq!(s.next_seq(), 5);
        // The header wins over since=.
        let mut s = Stream::open(api, "?since=0", "Last-Event-ID: 3\r\n");
        assert_eq!(s.next().event, "hello");
        assert_eq!(s.next_seq(), 4);
        assert_eq!(s.next_seq(), 5);
        emit(&node, 6);
        assert_eq!(s.next_seq(), 6);
        // A number from another run of the node: everything kept.
        let mut s = Stream::open(api, "?since=4&boot=other", "");
        assert_eq!(s.next().event, "hello");
        assert_eq!(s.next_seq(), 1);
        let a = http(api, "GET /v1/events?since=x", Vec::new());
        assert_eq!(a.status, 400, "{}", a.json);
        let mut bad = TcpStream::connect(api).unwrap();
        write!(bad, "GET /v1/events HTTP/1.0\r\nLast-Event-ID: abc\r\n\r\n").unwrap();
        let mut text = String::new();
        bad.read_to_string(&mut text).unwrap();
        assert!(
            text.contains(" 400 ") && text.contains("Last-Event-ID"),
            "{text}"
        );
    }

    #[test]
    fn events_dropped_from_the_ring_are_reported_as_lagged() {
        let (node, api) = node_and_api();
        for i in 0..crate::events::RING + 2 {
            emit(&node, i);
        }
        let mut s = Stream::open(api, "?since=0", "");
        assert_eq!(s.next().event, "hello");
        let m = s.next();
        assert_eq!(m.event, "lagged");
        let v: serde_json::Value = serde_json::from_str(&m.data).unwrap();
        assert_eq!(
            (v["missed_from"].as_u64(), v["missed_to"].as_u64()),
            (Some(1), Some(2))
        );
        assert_eq!(s.next_seq(), 3);
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_resyncs_from_the_ring() {
        use futures_util::StreamExt;
        let ev = Arc::new(crate::events::Events::default());
        let sub = ev.subscribe_after(0);
        let mut st = Box::pin(event_stream(ev.clone(), sub));
        let text = |e: axum::response::sse::Event| format!("{e:?}");
        assert!(text(st.next().await.unwrap().unwrap()).contains("event: hello"));
        // More than the broadcast holds, while the client reads nothing.
        let n = crate::events::RING + 5;
        for i in 0..n {
            ev.emit(crate::events::NewEvent::new(
                crate::events::EventKind::HostConnected,
                format!("{i}"),
            ));
        }
        let lagged = text(st.next().await.unwrap().unwrap());
        assert!(lagged.contains("event: lagged"), "{lagged}");
        assert!(
            lagged.contains("events 1 to 5 are no longer kept"),
            "{lagged}"
        );
        for seq in 6..=n as u64 {
            let e = text(st.next().await.unwrap().unwrap());
            assert!(e.contains(&format!("id: {seq}\\n")), "{seq}: {e}");
        }
        ev.emit(crate::events::NewEvent::new(
            crate::events::EventKind::HostConnected,
            "live",
        ));
        let e = text(st.next().await.unwrap().unwrap());
        assert!(e.contains(&format!("id: {}\\n", n + 1)), "{e}");
    }

    #[test]
    fn follow_false_answers_the_kept_events_as_json() {
        let (node, api) = node_and_api();
        for i in 1..=3 {
            emit(&node, i);
        }
        let a = http(api, "GET /v1/events?follow=false&since=1", Vec::new());
        assert_eq!(a.status, 200);
        let seqs: Vec<u64> = a
            .json
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, [2, 3]);
    }
}
