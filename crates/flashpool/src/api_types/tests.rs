//! The wire format: answers that were `json!` objects keep their bytes,
//! and what the CLI reads back parses, also from a node that leaves out
//! the fields it did not have yet.

use serde_json::json;

use super::*;

fn same_bytes<T: serde::Serialize>(typed: &T, was: serde_json::Value) {
    assert_eq!(serde_json::to_string(typed).unwrap(), was.to_string());
}

#[test]
fn answers_that_were_json_objects_keep_their_bytes() {
    same_bytes(&ErrorBody { error: "no".into() }, json!({ "error": "no" }));
    same_bytes(
        &VolumeDeleted {
            deleted: "v1".into(),
        },
        json!({ "deleted": "v1" }),
    );
    same_bytes(
        &ProbeResult {
            reachable: true,
            volume: "v1".into(),
        },
        json!({ "volume": "v1", "reachable": true }),
    );
    same_bytes(
        &Hello {
            boot: "b".into(),
            last_seq: 3,
        },
        json!({ "boot": "b", "last_seq": 3 }),
    );
    same_bytes(
        &Lagged {
            message: "m".into(),
            missed_from: 1,
            missed_to: 2,
        },
        json!({ "missed_from": 1, "missed_to": 2, "message": "m" }),
    );
    same_bytes(
        &TokenRotated {
            files: vec!["/run/t".into()],
            token: "id.secret".into(),
            token_id: "id".into(),
        },
        json!({ "token_id": "id", "token": "id.secret", "files": ["/run/t"] }),
    );
    let rebuild = json!({
        "running": false, "members": [], "drives": [], "queued_drives": [],
        "done_stripes": 0, "total_stripes": 0, "percent": 0.0, "bytes": 0,
        "mb_per_sec": 0.0, "eta_secs": null, "last_error": null
    });
    let members = json!([{ "position": 0, "drive": "d0", "state": "active" }]);
    let r = RebuildStatus {
        members: serde_json::from_value(members.clone()).unwrap(),
        rebuild: serde_json::from_value(rebuild.clone()).unwrap(),
        state: "optimal".into(),
        volume: "v1".into(),
    };
    // The handler answers it through a `Value` (keys sorted at every level).
    same_bytes(
        &serde_json::to_value(&r).unwrap(),
        json!({ "volume": "v1", "state": "optimal", "members": members, "rebuild": rebuild }),
    );
}

#[test]
fn a_job_reads_back_with_its_state_and_error() {
    let running = json!({
        "id": 4, "kind": "scrub", "volume": "r5", "state": "running",
        "started": "t", "elapsed_secs": 1.5, "done_stripes": 1, "total_stripes": 8,
        "percent": 12.5, "mb_per_sec": 3.0, "eta_secs": 10.0, "repair": false,
        "mismatches": 0, "repaired": 0, "skipped": 0
    });
    let j: JobInfo = serde_json::from_value(running.clone()).unwrap();
    assert_eq!(
        (j.kind, j.state.name(), j.state.error()),
        (JobKind::Scrub, "running", None)
    );
    assert_eq!(serde_json::to_value(&j).unwrap(), running);
    let mut failed = running;
    failed["state"] = json!("failed");
    failed["error"] = json!("member d1 gone");
    failed["finished"] = json!("t2");
    let j: JobInfo = serde_json::from_value(failed.clone()).unwrap();
    assert_eq!(j.state, JobState::Failed("member d1 gone".into()));
    assert_eq!(serde_json::to_value(&j).unwrap(), failed);
}

#[test]
fn an_older_nodes_answers_parse() {
    // No jobs, last_scrub, forced, queued_drives or from_config.
    let v = json!({
        "name": "v1", "uuid": "u", "layout": "raid1", "size_bytes": 4096,
        "block_size": 4096, "strip_bytes": 65536, "state": "optimal", "generation": 1,
        "members": [{ "position": 0, "drive": "d0", "state": "active" }],
        "export": { "nqn": "nqn.x", "nsid": 1 },
        "rebuild": { "running": false, "members": [], "drives": [], "done_stripes": 0,
            "total_stripes": 0, "percent": 0.0, "bytes": 0, "mb_per_sec": 0.0,
            "eta_secs": null, "last_error": null }
    });
    let v: VolumeInfo = serde_json::from_value(v).unwrap();
    assert!(v.jobs.is_empty() && v.last_scrub.is_none() && !v.from_config);
    assert_eq!(v.export.map(|x| x.nsid), Some(1));
    let e: Event = serde_json::from_value(json!({
        "seq": 3, "time": "t", "kind": "drive_failed", "severity": "warning",
        "drive": "d1", "message": "m"
    }))
    .unwrap();
    assert_eq!(
        (e.kind, e.severity.as_ref()),
        (EventKind::DriveFailed, "warning")
    );
}
