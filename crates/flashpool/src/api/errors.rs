//! The API's error answers: every one is `{"error": "..."}` with a status
//! that says whose fault it was, including those axum makes by itself
//! ([`json_errors`]), and the body parser that gives a bad body the same
//! shape.

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use crate::api_types::ErrorBody;
use crate::node::NodeError;

/// `{"error": "..."}` with its status.
pub(super) struct ApiError(pub(super) StatusCode, pub(super) String);

impl From<NodeError> for ApiError {
    fn from(e: NodeError) -> Self {
        ApiError(e.status(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let msg = crate::echo::bounded(self.1);
        (self.0, axum::Json(ErrorBody { error: msg })).into_response()
    }
}

pub(super) type ApiResult = Result<Response, ApiError>;

pub(super) fn ok<T: serde::Serialize>(v: T) -> ApiResult {
    Ok(axum::Json(v).into_response())
}

/// Parses a JSON body ourselves, so that a bad body gets the same error
/// shape as everything else (and clients need not send a Content-Type).
pub(super) fn body<T: DeserializeOwned>(b: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(b).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("request body is not what this call takes: {e}; see docs/api.md"),
        )
    })
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
        Body::from(serde_json::to_string(&ErrorBody { error: msg }).unwrap_or_default()),
    )
}
