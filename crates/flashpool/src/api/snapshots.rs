//! The snapshot calls: take (one or a consistency group), clone, revert;
//! the pool check and pool growth. On a node running alone the node does
//! them; in cluster mode the agent does (`agent/pool_snaps.rs`): for the
//! thin volumes of a cluster pool on the pool's owner, whichever node is
//! asked, recorded in etcd and listed and served by every node; for a
//! node's own pools, the node. Growing a pool is of a node's own pools only
//! (a cluster pool is refused; see docs/api.md).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;

use super::errors::{ApiError, ApiResult, body, ok};
use super::handlers::App;
use crate::api_types::{
    CloneRequest, ExpandPool, RevertRequest, SnapshotGroupRequest, SnapshotPair, SnapshotRequest,
};

/// Snapshots `pairs` at one instant: through the agent in cluster mode.
async fn take(a: &App, pairs: Vec<SnapshotPair>) -> Result<Vec<crate::node::VolumeInfo>, ApiError> {
    Ok(match &a.agent {
        Some(ag) => ag.snapshot(pairs).await?,
        None => {
            let pairs = crate::agent::node_pairs(&pairs)?;
            a.node.snapshot_volumes(&pairs).await?
        }
    })
}

pub(super) async fn take_snapshot(
    State(a): State<App>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: SnapshotRequest = body(&b)?;
    let pair = SnapshotPair {
        volume: name,
        name: r.name,
        export: r.export,
    };
    let v = take(&a, vec![pair])
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the snapshot was taken but not reported; see `flashpool snapshot list`".into(),
            )
        })?;
    Ok((StatusCode::CREATED, axum::Json(v)).into_response())
}

pub(super) async fn take_snapshots(State(a): State<App>, b: Bytes) -> ApiResult {
    let r: SnapshotGroupRequest = body(&b)?;
    let v = take(&a, r.snapshots).await?;
    Ok((StatusCode::CREATED, axum::Json(v)).into_response())
}

/// Every snapshot; in cluster mode those of the cluster pools too, on
/// every node (as `GET /v1/volumes` lists them).
pub(super) async fn snapshots(State(a): State<App>) -> ApiResult {
    let mut vs = a.node.volumes().await;
    if let Some(ag) = &a.agent {
        for v in &mut vs {
            ag.annotate(v).await;
        }
        ag.list_cluster(&mut vs).await;
    }
    vs.retain(|v| v.snapshot);
    ok(vs)
}

pub(super) async fn clone_volume(
    State(a): State<App>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: CloneRequest = body(&b)?;
    let v = match &a.agent {
        Some(ag) => ag.clone_volume(&name, r).await?,
        None => a.node.clone_volume(&name, &r.name, r.export).await?,
    };
    Ok((StatusCode::CREATED, axum::Json(v)).into_response())
}

pub(super) async fn revert_volume(
    State(a): State<App>,
    Path(name): Path<String>,
    b: Bytes,
) -> ApiResult {
    let r: RevertRequest = body(&b)?;
    match &a.agent {
        Some(ag) => ok(ag.revert(&name, r).await?),
        None => ok(a.node.revert_volume(&name, &r.snapshot, r.force).await?),
    }
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
    if let Some(ag) = &a.agent {
        if let Some(v) = ag.expand(&name, r.clone()).await? {
            return ok(v);
        }
        ag.check_expand(&name).await?;
    }
    ok(a.node.expand_pool(&name, r).await?)
}
