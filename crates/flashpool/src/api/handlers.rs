//! The calls' handlers: each parses its body, calls the node (or, in
//! cluster mode, its agent) and answers JSON.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::FromRef;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::errors::{ApiError, ApiResult, body, ok};
use crate::agent::Agent;
use crate::api_types::{
    AssembleByName, AssembleVolume, CreateVolume, ExportDriveRequest, ExportRequest, FailRequest,
    ForceQuery, ForceRequest, GrowRequest, MoveRequest, ProbeResult, QosRequest, RebuildStatus,
    ReplaceRequest, ScrubRequest, VolumeDeleted,
};
use crate::node::Node;

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

/// Whether `{"force": true}` (or `?force=true`) came with a call that
/// loses data without it.
fn force_of(b: &Bytes, q: &ForceQuery) -> Result<bool, ApiError> {
    let r: ForceRequest = if b.is_empty() {
        ForceRequest::default()
    } else {
        body(b)?
    };
    Ok(r.force || q.force)
}

/// Prometheus text (the one answer that is not JSON; its errors still are).
pub(super) async fn metrics(State(a): State<App>) -> Response {
    let cluster = a.agent.as_ref().map(|ag| ag.metrics_page());
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        a.node.metrics_with(cluster.as_ref()).await,
    )
        .into_response()
}

pub(super) async fn scrub_volume(
    State(n): State<Arc<Node>>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let req = if b.is_empty() {
        ScrubRequest::default()
    } else {
        body(&b)?
    };
    let info = n.scrub_volume(&name, req).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(info)).into_response())
}

pub(super) async fn stop_scrub(State(n): State<Arc<Node>>, Path(name): Path<String>) -> ApiResult {
    ok(n.stop_scrub(&name).await?)
}

pub(super) async fn jobs(State(n): State<Arc<Node>>) -> ApiResult {
    ok(n.jobs().await)
}

pub(super) async fn job(State(n): State<Arc<Node>>, Path(id): Path<String>) -> ApiResult {
    let id: u64 = id.parse().map_err(|_| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("job id {} is not a number", crate::echo::Echo(&id)),
        )
    })?;
    ok(n.job(id).await?)
}

pub(super) async fn drives(State(n): State<Arc<Node>>) -> ApiResult {
    ok(n.drives().await)
}
pub(super) async fn drive(State(n): State<Arc<Node>>, Path(name): Path<String>) -> ApiResult {
    ok(n.drive(&name).await?)
}
pub(super) async fn fail_drive(
    State(n): State<Arc<Node>>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: FailRequest = if b.is_empty() {
        FailRequest::default()
    } else {
        body(&b)?
    };
    ok(n.fail_drive(&name, r.force).await?)
}
/// In cluster mode a cluster volume's member is replaced by the volume's
/// owner, which records the new drive in the volume's spec first.
pub(super) async fn replace_drive(
    State(a): State<App>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: ReplaceRequest = body(&b)?;
    if let Some(ag) = &a.agent
        && let Some(v) = ag.replace_drive(&name, &r.with).await?
    {
        return ok(v);
    }
    ok(a.node.replace_drive(&name, &r.with).await?)
}
pub(super) async fn re_add_drive(
    State(n): State<Arc<Node>>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    if !b.is_empty() {
        let _: serde::de::IgnoredAny = body(&b)?;
    }
    ok(n.re_add_drive(&name).await?)
}
pub(super) async fn assemble_by_name(
    State(n): State<Arc<Node>>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: AssembleByName = if b.is_empty() {
        Default::default()
    } else {
        body(&b)?
    };
    ok(n.assemble_by_name(&name, r.force).await?)
}
pub(super) async fn export_drive(
    State(n): State<Arc<Node>>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: ExportDriveRequest = if b.is_empty() {
        ExportDriveRequest::default()
    } else {
        body(&b)?
    };
    ok(n.export_drive(&name, r, false).await?)
}
pub(super) async fn unexport_drive(
    State(n): State<Arc<Node>>,
    Path(name): Path<String>,
) -> ApiResult {
    ok(n.unexport_drive(&name).await?)
}
pub(super) async fn assemble_volume(State(n): State<Arc<Node>>, b: Bytes) -> ApiResult {
    let r: AssembleVolume = body(&b)?;
    ok(n.assemble_volume(r).await?)
}
pub(super) async fn volumes(State(a): State<App>) -> ApiResult {
    let mut vs = a.node.volumes().await;
    if let Some(ag) = &a.agent {
        for v in &mut vs {
            ag.annotate(v).await;
        }
        ag.list_cluster(&mut vs).await;
    }
    ok(vs)
}
pub(super) async fn create_volume(State(a): State<App>, b: Bytes) -> ApiResult {
    // `qos` is taken out before the rest is read as a `CreateVolume`.
    let mut v: serde_json::Value = body(&b)?;
    let qos = match v.as_object_mut().and_then(|m| m.remove("qos")) {
        None | Some(serde_json::Value::Null) => None,
        Some(q) => Some(value::<QosRequest>(q, "qos")?),
    };
    let req: CreateVolume = value(v, "request body")?;
    let info = match &a.agent {
        Some(ag) => ag.create_qos(req, qos).await?,
        _ => a.node.create_volume_qos(req, qos).await?,
    };
    Ok((StatusCode::CREATED, axum::Json(info)).into_response())
}
pub(super) async fn volume(State(a): State<App>, Path(name): Path<String>) -> ApiResult {
    let mut v = match (a.node.volume(&name).await, &a.agent) {
        (Ok(v), _) => v,
        // A cluster volume served here on standby: as `volume list` shows it.
        (Err(e), Some(ag)) => {
            let mut vs = Vec::new();
            ag.list_cluster(&mut vs).await;
            vs.into_iter().find(|v| v.name == name).ok_or(e)?
        }
        (Err(e), None) => return Err(e.into()),
    };
    if let Some(ag) = &a.agent {
        ag.annotate(&mut v).await;
    }
    ok(v)
}
pub(super) async fn delete_volume(
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
    ok(VolumeDeleted { deleted: name })
}
pub(super) async fn grow_volume(
    State(a): State<App>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: GrowRequest = body(&b)?;
    let grown = match &a.agent {
        Some(ag) => ag.resize(&name, &r.size, r.force).await?,
        None => None,
    };
    let mut v = match grown {
        Some(v) => v,
        None => a.node.resize_volume(&name, &r.size, r.force).await?,
    };
    if let Some(ag) = &a.agent {
        ag.annotate(&mut v).await;
    }
    ok(v)
}

/// A JSON value as `T`, with the same error shape as a bad body.
fn value<T: serde::de::DeserializeOwned>(v: serde_json::Value, what: &str) -> Result<T, ApiError> {
    serde_json::from_value(v).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("{what} is not what this call takes: {e}; see docs/api.md"),
        )
    })
}

/// In cluster mode the agent answers for cluster volumes and thin volumes
/// of cluster pools (limits kept in etcd, applied by every node); the node
/// for its own volumes.
pub(super) async fn volume_qos(State(a): State<App>, Path(name): Path<String>) -> ApiResult {
    if let Some(ag) = &a.agent
        && let Some(q) = ag.volume_qos(&name).await?
    {
        return ok(q);
    }
    ok(a.node.volume_qos(&name).await?)
}

pub(super) async fn set_volume_qos(
    State(a): State<App>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: QosRequest = body(&b)?;
    if let Some(ag) = &a.agent
        && let Some(q) = ag.set_volume_qos(&name, r.clone()).await?
    {
        return ok(q);
    }
    ok(a.node.set_volume_qos(&name, r).await?)
}

pub(super) async fn audit(State(n): State<Arc<Node>>) -> ApiResult {
    ok(serde_json::json!({ "stale_writes": n.stale_write_audit() }))
}
pub(super) async fn cluster_status(State(a): State<App>) -> ApiResult {
    ok(a.agent()?.status_or_unreachable().await?)
}
pub(super) async fn cluster_probe(State(a): State<App>, Path(name): Path<String>) -> ApiResult {
    a.agent()?.probe(&name).await?;
    ok(ProbeResult {
        reachable: true,
        volume: name,
    })
}
pub(super) async fn move_volume(
    State(a): State<App>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: MoveRequest = body(&b)?;
    ok(a.agent()?.move_volume(&name, &r.to).await?)
}
pub(super) async fn drain_node(State(a): State<App>, Path(name): Path<String>) -> ApiResult {
    ok(a.agent()?.drain(&name, true).await?)
}
/// Rewraps every encrypted volume's key under a new key-encryption key.
pub(super) async fn rotate_kek(State(n): State<Arc<Node>>) -> ApiResult {
    ok(n.rotate_kek().await?)
}
pub(super) async fn undrain_node(State(a): State<App>, Path(name): Path<String>) -> ApiResult {
    ok(a.agent()?.drain(&name, false).await?)
}
/// In cluster mode the agent answers for the thin volumes and snapshots
/// of cluster pools (recorded in etcd, served by every node); the node
/// for its own volumes.
pub(super) async fn export(State(a): State<App>, Path(name): Path<String>, b: Bytes) -> ApiResult {
    let x: ExportRequest = body(&b)?;
    if let Some(ag) = &a.agent
        && let Some(v) = ag.export(&name, x.clone()).await?
    {
        return ok(v);
    }
    ok(a.node.export(&name, x).await?)
}
pub(super) async fn unexport(
    State(a): State<App>,
    Path(name): Path<String>,
    Query(q): Query<ForceQuery>,
    b: Bytes,
) -> ApiResult {
    let force = force_of(&b, &q)?;
    if let Some(ag) = &a.agent
        && let Some(v) = ag.unexport(&name, force).await?
    {
        return ok(v);
    }
    ok(a.node.unexport(&name, force).await?)
}
pub(super) async fn rebuild_status(
    State(n): State<Arc<Node>>,
    Path(name): Path<String>,
) -> ApiResult {
    let v = n.volume(&name).await?;
    let r = RebuildStatus {
        members: v.members,
        rebuild: v.rebuild,
        state: v.state,
        volume: v.name,
    };
    // Through a `Value`, as this answer always was: its objects' keys sorted.
    ok(serde_json::to_value(r)
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?)
}
