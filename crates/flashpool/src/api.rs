//! The management API: HTTP + JSON, on 127.0.0.1 by default (it has no
//! authentication, so it belongs on a local or management address only).
//! Every answer is JSON; an error is `{"error": "..."}` with a status code
//! that says whose fault it was (400 bad request, 404 unknown name, 409
//! conflicts with the node's state, 500 the node's own failure).
//! `docs/api.md` lists the calls.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRef, Path, State};
use axum::http::StatusCode;
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
        let code = match &e {
            NodeError::BadRequest(_) => StatusCode::BAD_REQUEST,
            NodeError::NotFound(_) => StatusCode::NOT_FOUND,
            NodeError::Conflict(_) => StatusCode::CONFLICT,
            NodeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, axum::Json(serde_json::json!({ "error": self.1 }))).into_response()
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplaceBody {
    with: String,
}

pub fn router(app: App) -> Router {
    Router::new()
        .route("/v1/audit", get(audit))
        .route("/v1/cluster", get(cluster_status))
        .route("/v1/cluster/probe/{name}", post(cluster_probe))
        .route("/v1/volumes/{name}/move", post(move_volume))
        .route("/v1/nodes/{name}/drain", post(drain_node))
        .route("/v1/nodes/{name}/undrain", post(undrain_node))
        .route("/v1/drives", get(drives))
        .route("/v1/drives/{name}", get(drive))
        .route("/v1/drives/{name}/fail", post(fail_drive))
        .route("/v1/drives/{name}/replace", post(replace_drive))
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
        .fallback(|| async {
            ApiError(
                StatusCode::NOT_FOUND,
                "no such API call; see docs/api.md".into(),
            )
        })
        .with_state(app)
}

async fn drives(State(n): State<Arc<Node>>) -> ApiResult {
    ok(n.drives().await)
}
async fn drive(State(n): State<Arc<Node>>, Path(name): Path<String>) -> ApiResult {
    ok(n.drive(&name).await?)
}
async fn fail_drive(State(n): State<Arc<Node>>, Path(name): Path<String>) -> ApiResult {
    ok(n.fail_drive(&name).await?)
}
async fn replace_drive(
    State(n): State<Arc<Node>>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: ReplaceBody = body(&b)?;
    ok(n.replace_drive(&name, &r.with).await?)
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
async fn delete_volume(State(a): State<App>, Path(name): Path<String>) -> ApiResult {
    let in_cluster = match &a.agent {
        Some(ag) => ag.delete(&name).await?.is_some(),
        None => false,
    };
    if !in_cluster {
        a.node.delete_volume(&name).await?;
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
async fn unexport(State(n): State<Arc<Node>>, Path(name): Path<String>) -> ApiResult {
    ok(n.unexport(&name).await?)
}
async fn rebuild_status(State(n): State<Arc<Node>>, Path(name): Path<String>) -> ApiResult {
    let v = n.volume(&name).await?;
    ok(
        serde_json::json!({ "volume": v.name, "state": v.state, "members": v.members, "rebuild": v.rebuild }),
    )
}

/// Binds the API on `addr` and serves it on `rt` until the process ends.
pub fn start(rt: &tokio::runtime::Runtime, app: App, addr: &str) -> Result<SocketAddr> {
    let sa: SocketAddr = addr.parse().with_context(|| {
        format!("config: api.address = {addr:?} is not ADDR:PORT; use e.g. \"127.0.0.1:9410\"")
    })?;
    if !sa.ip().is_loopback() {
        tracing::warn!(
            "management API on {sa}: it has no authentication; keep it on a management network"
        );
    }
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(sa))
        .with_context(|| {
            format!(
                "management API: cannot listen on {sa}; set [api] address to a free port, or enabled = false"
            )
        })?;
    let bound = listener.local_addr()?;
    let app = router(app);
    rt.spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("management API stopped: {e}");
        }
    });
    tracing::info!("management API on http://{bound}/v1/");
    Ok(bound)
}
