//! Tests of the whole page: families, labels and values as a scrape sees them.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use blockdev::{AlignedBuf, BlockOp, IoRequest};

use super::*;
use crate::node::ExportRequest;
use crate::node::testing::{TestNode, volume};

const NQN: &str = "nqn.2026-01.io.flashpool:metrics";

fn node() -> Arc<Node> {
    TestNode::new().mem_drives(4, 16 << 20).target(NQN).build()
}

/// The value of the sample whose line starts with `series ` (name and labels).
fn value(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{page}"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_reads_volume_drive_and_namespace_counters() {
    let node = node();
    node.create_volume(volume("v1", "raid5", &["d0", "d1", "d2"]))
        .await
        .unwrap();
    node.export(
        "v1",
        ExportRequest {
            nqn: NQN.into(),
            nsid: 1,
        },
    )
    .await
    .unwrap();
    let ns = node
        .running_target()
        .unwrap()
        .subsystem(NQN)
        .unwrap()
        .namespace(1)
        .unwrap();
    // One partial-stripe write through the volume, as the target would.
    let mut buf = AlignedBuf::new(4096);
    buf.set_len(4096);
    let done = ns
        .dev
        .submit(IoRequest {
            op: BlockOp::Write { fua: false },
            lba: 0,
            blocks: 1,
            buf,
        })
        .await;
    done.result.unwrap();
    // What the queue core records per command.
    ns.stats.reads.fetch_add(7, Relaxed);
    ns.stats
        .read_latency
        .record(std::time::Duration::from_micros(80));

    let page = node.metrics().await;
    let ns_labels = format!("{{subsystem=\"{NQN}\",nsid=\"1\",volume=\"v1\"}}");
    assert_eq!(
        value(
            &page,
            &format!("flashpool_namespace_reads_total{ns_labels}")
        ),
        7.0
    );
    assert_eq!(
        value(
            &page,
            &format!(
                "flashpool_namespace_read_latency_seconds_bucket{{subsystem=\"{NQN}\",nsid=\"1\",volume=\"v1\",le=\"0.0001\"}}"
            )
        ),
        1.0
    );
    assert_eq!(
        value(
            &page,
            "flashpool_volume_state{volume=\"v1\",state=\"optimal\"}"
        ),
        1.0
    );
    assert_eq!(
        value(
            &page,
            "flashpool_volume_state{volume=\"v1\",state=\"degraded\"}"
        ),
        0.0
    );
    assert_eq!(
        value(&page, "flashpool_volume_encrypted{volume=\"v1\"}"),
        0.0
    );
    // Partial-stripe writes read old data or the other strips.
    let rmw = value(
        &page,
        "flashpool_volume_read_modify_writes_total{volume=\"v1\"}",
    ) + value(
        &page,
        "flashpool_volume_reconstruct_writes_total{volume=\"v1\"}",
    );
    assert!(rmw >= 1.0, "{page}");
    assert_eq!(
        value(&page, "flashpool_drive_state{drive=\"d3\",state=\"free\"}"),
        1.0
    );
    assert_eq!(
        value(
            &page,
            "flashpool_drive_state{drive=\"d0\",state=\"member\"}"
        ),
        1.0
    );
    let written: f64 = ["d0", "d1", "d2"]
        .iter()
        .map(|d| {
            value(
                &page,
                &format!("flashpool_drive_writes_total{{drive=\"{d}\"}}"),
            )
        })
        .sum();
    assert!(written >= 2.0, "data and parity written: {page}");
    assert_eq!(value(&page, "flashpool_nvmf_connections"), 0.0);
    // Every family once, HELP before TYPE before samples.
    let mut seen = std::collections::HashSet::new();
    for l in page.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = l.split(' ').nth(2).unwrap();
        assert!(seen.insert(name.to_string()), "{name} twice");
    }
    assert!(seen.contains("flashpool_volume_degraded_reads_total"));
    assert!(seen.contains("flashpool_volume_rebuild_stripes"));
    // Every line is valid exposition syntax, histograms included.
    super::check_exposition(&page);
    assert!(page.contains("# TYPE flashpool_namespace_reads_total counter\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_shows_the_links_of_remote_drives() {
    use crate::node::remote_tests::{Enclosure, create, hosts, owner};
    let enc = Enclosure::new("e1", 2, &hosts(&["a"]));
    let a = owner("a", &enc);
    a.create_volume(create("m", "raid1", &["e1:d0", "e1:d1"]))
        .await
        .unwrap();
    let page = a.metrics().await;
    for d in ["e1:d0", "e1:d1"] {
        let l = format!("drive=\"{d}\"");
        assert_eq!(
            value(&page, &format!("flashpool_remote_drive_connected{{{l}}}")),
            1.0
        );
        assert_eq!(
            value(
                &page,
                &format!("flashpool_remote_drive_connects_total{{{l}}}")
            ),
            1.0
        );
        let shared = value(
            &page,
            &format!("flashpool_remote_drive_io_queues{{{l},kind=\"shared\"}}"),
        );
        assert_eq!(
            shared,
            f64::from(crate::node::remote_tests::settings().queues)
        );
        // No reactor is registered in this test: none bound.
        assert_eq!(
            value(
                &page,
                &format!("flashpool_remote_drive_io_queues{{{l},kind=\"reactor\"}}")
            ),
            0.0
        );
    }
    // A local drive has no link.
    assert!(!page.contains("flashpool_remote_drive_connected{drive=\"d0\"}"));
}
