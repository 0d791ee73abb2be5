//! The API's HTTP behaviour, over real sockets: JSON errors for what axum
//! answers by itself, and the event stream.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use axum::routing::post;
use axum::{Json, Router, middleware};

use super::errors::json_errors;
use super::events::event_stream;
use super::{App, router};
use crate::node::{Node, NodeState};

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

/// A drive named by its URL reaches the handler whole: the client encodes
/// it as one path segment, and the server decodes it back.
#[test]
fn a_drive_url_is_one_path_segment() {
    let url = "tcp://10.0.1.21:4420/nqn.2026-01.io.flashpool:e1-d3?nsid=1";
    let seg = crate::client::segment(url);
    assert!(!seg.contains('/') && !seg.contains('?'), "{seg}");
    let api = node_api();
    for head in [
        format!("GET /v1/drives/{seg}"),
        format!("POST /v1/drives/{seg}/fail"),
    ] {
        let a = http(api, &head, Vec::new());
        assert_eq!(a.status, 404, "{head}: {}", a.json);
        assert!(
            error_of(&a).contains(&format!("{url:?}")),
            "{head}: {}",
            a.json
        );
    }
    assert_eq!(crate::client::segment("e1:d3"), "e1:d3");
    // A name with a query of its own is that name, not another volume with
    // an option (`volume delete 'db?force=true'` deleted db).
    let odd = "db?force=true";
    let a = http(
        api,
        &format!("DELETE /v1/volumes/{}", crate::client::segment(odd)),
        Vec::new(),
    );
    assert_eq!(a.status, 404, "{}", a.json);
    assert!(error_of(&a).contains(&format!("{odd:?}")), "{}", a.json);
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

#[test]
fn qos_is_set_at_create_changed_live_and_bad_values_are_400() {
    let node = crate::node::testing::TestNode::new()
        .mem_drives(2, 8 << 20)
        .target("nqn.2026-01.io.flashpool:api")
        .build();
    let api = serve(router(App { node, agent: None }));
    let post = |path: &str, body: serde_json::Value| {
        http(api, &format!("POST {path}"), body.to_string().into_bytes())
    };
    let get = |path: &str| http(api, &format!("GET {path}"), Vec::new());
    let vol = |qos: serde_json::Value| serde_json::json!({"name": "v", "layout": "raid1", "drives": ["d0", "d1"], "qos": qos});
    // a bad qos makes nothing
    let a = post("/v1/volumes", vol(serde_json::json!({"iops": "many"})));
    assert_eq!(a.status, 400, "{}", a.json);
    assert!(error_of(&a).contains("qos"), "{}", a.json);
    let a = post("/v1/volumes", vol(serde_json::json!({"burst_ms": 0})));
    assert_eq!(a.status, 400, "{}", a.json);
    assert!(error_of(&a).contains("burst_ms 0"), "{}", a.json);
    assert_eq!(get("/v1/volumes/v").status, 404);

    let a = post(
        "/v1/volumes",
        vol(serde_json::json!({"iops": 500, "bandwidth": "20MiB"})),
    );
    assert_eq!(a.status, 201, "{}", a.json);
    let q = get("/v1/volumes/v/qos").json;
    assert_eq!(q["iops"], 500);
    assert_eq!(q["bandwidth"], 20 << 20);
    assert_eq!(q["burst_ms"], 100);
    assert_eq!(q["unlimited"], false);

    for (body, want) in [
        (
            serde_json::json!({"burst_ms": 0}),
            "burst_ms 0 is out of range",
        ),
        (serde_json::json!({"bandwidth": "fast"}), "bandwidth"),
        (serde_json::json!({"read_bandwidth": 10}), "below 4096"),
        (serde_json::json!({"iops": 5, "bogus": 1}), "unknown field"),
        (serde_json::json!({"iops": -1}), "request body"),
    ] {
        let a = post("/v1/volumes/v/qos", body.clone());
        assert_eq!(a.status, 400, "{body}: {}", a.json);
        assert!(error_of(&a).contains(want), "{body}: {}", a.json);
        assert_eq!(get("/v1/volumes/v/qos").json["iops"], 500, "{body}");
    }
    let a = post("/v1/volumes/v/qos", serde_json::json!({"write_iops": 50}));
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(
        (a.json["iops"].clone(), a.json["write_iops"].clone()),
        (500.into(), 50.into())
    );
    let a = post("/v1/volumes/v/qos", serde_json::json!({"clear": true}));
    assert_eq!(a.json["unlimited"], true, "{}", a.json);
    assert_eq!(
        post("/v1/volumes/nope/qos", serde_json::json!({})).status,
        404
    );
}
