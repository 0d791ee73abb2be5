//! Which handler answers which call: the routes of `docs/api.md`, inside
//! [`json_errors`] so that every error is JSON.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{get, post};

use super::errors::{ApiError, BODY_LIMIT, json_errors};
use super::events::events;
use super::handlers::*;
use super::snapshots::*;

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
        .route("/v1/node/rotate-kek", post(rotate_kek))
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
        .route(
            "/v1/volumes/{name}/qos",
            get(volume_qos).post(set_volume_qos),
        )
        .route("/v1/volumes/{name}/rebuild", get(rebuild_status))
        .route("/v1/volumes/{name}/grow", post(grow_volume))
        .route("/v1/volumes/{name}/snapshots", post(take_snapshot))
        .route("/v1/snapshots", get(snapshots).post(take_snapshots))
        .route("/v1/volumes/{name}/clone", post(clone_volume))
        .route("/v1/volumes/{name}/revert", post(revert_volume))
        .route("/v1/volumes/{name}/check", get(check_pool))
        .route("/v1/volumes/{name}/expand", post(expand_pool))
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
