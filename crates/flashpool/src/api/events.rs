//! `GET /v1/events`: the node's events as a server-sent event stream
//! (resumable by `Last-Event-ID`, with `hello` and `lagged` messages), or
//! the kept ones as a JSON array.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Deserialize;

use super::errors::{ApiError, ApiResult, ok};
use crate::api_types::{Hello, Lagged};
use crate::node::Node;

/// `GET /v1/events` parameters.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
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
pub(super) async fn events(
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
    let lagged = Lagged {
        message: format!(
            "events {from} to {to} are no longer kept (the node keeps the last {}); \
             check the volumes' state: flashpool volume list",
            crate::events::RING
        ),
        missed_from: from,
        missed_to: to,
    };
    axum::response::sse::Event::default()
        .event("lagged")
        .data(serde_json::to_string(&lagged).unwrap_or_default())
}

/// The stream: `hello` (the node's run and newest number), a `lagged`
/// when events after the asked number were dropped, the kept events, then
/// live ones. A subscriber that falls behind the broadcast picks up again
/// from the ring, with a `lagged` for what the ring no longer has. Ends when
/// the client goes (the body is dropped) or the node stops.
pub(super) fn event_stream(
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
            serde_json::to_string(&Hello {
                boot: events.boot().to_string(),
                last_seq: sub.last_seq,
            })
            .unwrap_or_default(),
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
