//! The snapshot calls: take (one or a consistency group), clone, revert;
//! the pool check and pool growth. On a node running alone; cluster pools
//! answer 409 until the agent carries these (see docs/api.md).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;

use super::errors::{ApiError, ApiResult, body, ok};
use super::handlers::App;
use crate::api_types::{
    CloneRequest, ExpandPool, RevertRequest, SnapshotGroupRequest, SnapshotRequest,
};

fn node_only(a: &App, what: &str) -> Result<(), ApiError> {
    match a.agent {
        Some(_) => Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "{what} is not supported in cluster mode yet (only on a node running alone); \
                 nothing was changed"
            ),
        )),
        None => Ok(()),
    }
}

pub(super) async fn take_snapshot(
    State(a): State<App>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: SnapshotRequest = body(&b)?;
    node_only(&a, "a snapshot")?;
    let mut v = a.node.snapshot_volumes(&[(name, r.name)]).await?;
    Ok((StatusCode::CREATED, axum::Json(v.remove(0))).into_response())
}

pub(super) async fn take_snapshots(State(a): State<App>, b: Bytes) -> ApiResult {
    let r: SnapshotGroupRequest = body(&b)?;
    node_only(&a, "a snapshot")?;
    let pairs: Vec<(String, String)> = r
        .snapshots
        .into_iter()
        .map(|p| (p.volume, p.name))
        .collect();
    let v = a.node.snapshot_volumes(&pairs).await?;
    Ok((StatusCode::CREATED, axum::Json(v)).into_response())
}

pub(super) async fn snapshots(State(a): State<App>) -> ApiResult {
    let v: Vec<_> = a
        .node
        .volumes()
        .await
        .into_iter()
        .filter(|v| v.snapshot)
        .collect();
    ok(v)
}

pub(super) async fn clone_volume(
    State(a): State<App>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: CloneRequest = body(&b)?;
    node_only(&a, "a clone")?;
    let v = a.node.clone_volume(&name, &r.name, r.export).await?;
    Ok((StatusCode::CREATED, axum::Json(v)).into_response())
}

pub(super) async fn revert_volume(
    State(a): State<App>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: RevertRequest = body(&b)?;
    node_only(&a, "a revert")?;
    ok(a.node.revert_volume(&name, &r.snapshot, r.force).await?)
}

pub(super) async fn check_pool(State(a): State<App>, Path(name): Path<String>) -> ApiResult {
    ok(a.node.check_pool(&name).await?)
}

pub(super) async fn expand_pool(
    State(a): State<App>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: ExpandPool = body(&b)?;
    node_only(&a, "growing a pool")?;
    ok(a.node.expand_pool(&name, r).await?)
}
