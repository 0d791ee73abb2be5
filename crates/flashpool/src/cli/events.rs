//! `flashpool events [--follow]`: what the node reports, one line per
//! event, or its JSON; a follow resumes after the last event it printed
//! when the connection drops or the node restarts.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde_json::Value;

use super::ApiArgs;
use crate::api_types::{Hello, Lagged};
use crate::client::sse::read_sse;
use crate::client::{ApiToken, api_agent, api_base, error_message};
use crate::output::outln;

#[derive(clap::Args, Debug)]
pub struct EventsArgs {
    /// Keep streaming new events (reconnecting when the node restarts or
    /// the connection drops), as `mdadm --monitor` does.
    #[arg(long, short)]
    follow: bool,
    /// Events after this sequence number (0: every event the node keeps).
    /// Without it: the kept events, or with --follow only new ones.
    #[arg(long)]
    since: Option<u64>,
}

/// `flashpool events`.
pub fn events(api: ApiArgs, args: EventsArgs) -> Result<()> {
    if !args.follow {
        let c = api.client()?;
        let q = args
            .since
            .map(|s| format!("&since={s}"))
            .unwrap_or_default();
        let a = c.get(&format!("/events?follow=false{q}"))?;
        let raw: Vec<Value> = a.parse()?;
        for e in &raw {
            print_event(e, api.json)?;
        }
        return Ok(());
    }
    follow_events(&api, args.since)
}

/// One event: `TIME SEVERITY KIND [volume=V] [drive=D] [host=H] MESSAGE`,
/// or its JSON (as the node sent it) on one line.
fn print_event(raw: &Value, as_json: bool) -> Result<()> {
    if as_json {
        outln!("{}", serde_json::to_string(raw)?);
        return Ok(());
    }
    let e = EventLine::deserialize(raw).context("an event without the fields every event has")?;
    outln!("{}", event_line(&e));
    Ok(())
}

/// An event as the CLI prints it. The kind stays a string: a newer node may
/// send kinds this CLI does not know yet, and they still print (and a
/// follow still resumes after them).
#[derive(Deserialize)]
struct EventLine {
    seq: u64,
    time: String,
    kind: String,
    severity: String,
    volume: Option<String>,
    drive: Option<String>,
    host: Option<String>,
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    steps: Vec<crate::api_types::StepTime>,
    message: String,
}

fn event_line(e: &EventLine) -> String {
    let mut about = String::new();
    for (k, v) in [
        ("volume", &e.volume),
        ("drive", &e.drive),
        ("host", &e.host),
        ("node", &e.node),
    ] {
        if let Some(v) = v {
            about += &format!("{k}={v} ");
        }
    }
    let steps = if e.steps.is_empty() {
        String::new()
    } else {
        let s: Vec<String> = e
            .steps
            .iter()
            .map(|s| format!("{} {} ms", s.step, s.ms))
            .collect();
        format!(" [{}]", s.join(", "))
    };
    format!(
        "{} {:<8} {:<16} {}{}{steps}",
        e.time, e.severity, e.kind, about, e.message
    )
}

/// Where a follow resumes: the node's run and the last number seen in it.
#[derive(Debug, Default)]
struct Resume {
    boot: Option<String>,
    last: Option<u64>,
}

/// How long the stream may stay silent (keep-alives come every 15 s)
/// before the connection counts as lost.
const EVENTS_SILENCE: Duration = Duration::from_secs(45);

fn follow_events(api: &ApiArgs, since: Option<u64>) -> Result<()> {
    let ep = api.endpoint();
    let agent = api_agent(&ep, |b| {
        b.timeout_connect(Some(Duration::from_secs(5)))
            .timeout_recv_response(Some(Duration::from_secs(10)))
            .timeout_per_read(Some(EVENTS_SILENCE))
    })?;
    let token = ApiToken::find(&ep)?;
    let url = format!("{}/v1/events", api_base(&api.api).0);
    let mut at = Resume {
        boot: None,
        last: since,
    };
    let mut connected_once = false;
    let mut backoff = Duration::from_millis(250);
    loop {
        let mut req = token.apply(agent.get(&url));
        if let Some(l) = at.last {
            req = req.header("Last-Event-ID", &l.to_string());
        }
        if let Some(b) = &at.boot {
            req = req.query("boot", b);
        }
        let lost = match req.call() {
            Ok(mut resp) if resp.status().is_success() => {
                if connected_once {
                    warn(&format!(
                        "reconnected to {}; resuming after event {}",
                        api.api,
                        at.last.map_or("-".into(), |l| l.to_string())
                    ));
                }
                connected_once = true;
                backoff = Duration::from_millis(250);
                let mut r = std::io::BufReader::new(resp.body_mut().as_reader());
                match stream_events(&mut r, &mut at, api.json) {
                    Ok(Flow::ReaderGone) => return Ok(()),
                    Ok(Flow::Ended) => "the node closed the stream".to_string(),
                    Err(e) => e.to_string(),
                }
            }
            Ok(mut resp) => {
                let text = resp.body_mut().read_to_string().unwrap_or_default();
                let msg = error_message(&text);
                bail!(
                    "{url}: {}: {msg}{}",
                    resp.status(),
                    token.hint(resp.status().as_u16())
                );
            }
            Err(e) if !connected_once => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot reach the management API at {url}: is `flashpool serve` running? \
                         (set --api or FLASHPOOL_API)"
                    )
                });
            }
            Err(e) => e.to_string(),
        };
        if crate::output::reader_gone() {
            return Ok(());
        }
        warn(&format!(
            "connection to {} lost ({lost}); reconnecting in {} ms",
            api.api,
            backoff.as_millis()
        ));
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

enum Flow {
    /// Nobody reads stdout any more (`| head`).
    ReaderGone,
    /// The server ended the stream.
    Ended,
}

fn stream_events(r: &mut impl std::io::BufRead, at: &mut Resume, as_json: bool) -> Result<Flow> {
    while let Some(m) = read_sse(r)? {
        match m.event.as_str() {
            "hello" => {
                let hello = serde_json::from_str::<Hello>(&m.data).ok();
                let boot = hello.as_ref().map(|h| h.boot.clone());
                if at.boot.is_some() && boot != at.boot {
                    // The node sends every event it kept in its new run.
                    warn("the node restarted: its event numbers start again; what it kept follows");
                    at.last = Some(0);
                } else if at.last.is_none() {
                    // A live follow: it resumes after what was newest now.
                    at.last = hello.map(|h| h.last_seq);
                }
                at.boot = boot;
            }
            "lagged" => {
                let lagged = serde_json::from_str::<Lagged>(&m.data).ok();
                warn(&format!(
                    "events were lost: {}",
                    lagged
                        .as_ref()
                        .map_or(m.data.as_str(), |l| l.message.as_str())
                ));
            }
            _ => {
                let v: Value = serde_json::from_str(&m.data)
                    .with_context(|| format!("event {:?} is not JSON: {}", m.event, m.data))?;
                print_event(&v, as_json)?;
                if let Ok(e) = EventLine::deserialize(&v) {
                    at.last = Some(e.seq);
                }
                if crate::output::reader_gone() {
                    return Ok(Flow::ReaderGone);
                }
            }
        }
    }
    Ok(Flow::Ended)
}

/// A note on stderr (not eprintln!: it panics when stderr is closed).
fn warn(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "flashpool events: {msg}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_from_a_new_run_resumes_from_its_start() {
        let mut at = Resume {
            boot: Some("old".into()),
            last: Some(40),
        };
        let text = "event: hello\ndata: {\"boot\":\"new\",\"last_seq\":3}\n\n";
        let mut r = std::io::BufReader::new(text.as_bytes());
        assert!(matches!(
            stream_events(&mut r, &mut at, true).unwrap(),
            Flow::Ended
        ));
        assert_eq!(at.boot.as_deref(), Some("new"));
        assert_eq!(at.last, Some(0), "the new run's kept events follow");
        // A live follow starts after the newest.
        let mut at = Resume::default();
        let mut r = std::io::BufReader::new(text.as_bytes());
        stream_events(&mut r, &mut at, true).unwrap();
        assert_eq!(at.last, Some(3));
        // Same run: where the client was stays.
        let mut at = Resume {
            boot: Some("new".into()),
            last: Some(2),
        };
        let mut r = std::io::BufReader::new(text.as_bytes());
        stream_events(&mut r, &mut at, true).unwrap();
        assert_eq!(at.last, Some(2));
    }

    #[test]
    fn an_event_line_names_what_it_is_about() {
        let e: EventLine = serde_json::from_value(
            serde_json::json!({"seq": 3, "time": "2026-11-25T13:34:56.123Z", "kind": "drive_failed",
            "severity": "warning", "volume": "v", "drive": "d1", "message": "drive d1 has failed"}),
        )
        .unwrap();
        assert_eq!(
            event_line(&e),
            "2026-11-25T13:34:56.123Z warning  drive_failed     volume=v drive=d1 drive d1 has failed"
        );
    }

    #[test]
    fn a_cluster_event_line_has_its_node_and_step_times() {
        let e: EventLine = serde_json::from_value(serde_json::json!({"seq": 4, "time": "t",
            "kind": "took_over", "severity": "info", "volume": "v", "node": "b",
            "steps": [{"step": "claim", "ms": 2.5}, {"step": "total", "ms": 80.0}],
            "message": "volume v: taken over"}))
        .unwrap();
        assert_eq!(
            event_line(&e),
            "t info     took_over        volume=v node=b volume v: taken over [claim 2.5 ms, total 80 ms]"
        );
    }

    #[test]
    fn an_event_of_a_kind_this_cli_does_not_know_still_prints_and_resumes() {
        let text = "event: hello\ndata: {\"boot\":\"b\",\"last_seq\":0}\n\n\
                    id: 7\ndata: {\"seq\":7,\"time\":\"t\",\"kind\":\"from_a_newer_node\",\
                    \"severity\":\"info\",\"message\":\"m\"}\n\n";
        let mut at = Resume::default();
        let mut r = std::io::BufReader::new(text.as_bytes());
        stream_events(&mut r, &mut at, false).unwrap();
        assert_eq!(at.last, Some(7));
        let line = EventLine::deserialize(serde_json::json!({"seq": 7, "time": "t",
            "kind": "from_a_newer_node", "severity": "info", "message": "m"}))
        .unwrap();
        assert_eq!(event_line(&line), "t info     from_a_newer_node m");
    }
}
