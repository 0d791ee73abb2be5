use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

#[cfg(feature = "png")]
use super::png::png_dimensions;
#[cfg(feature = "png")]
use super::svg::{HEIGHT, WIDTH};
use super::*;
use crate::engine::new_histogram;
use crate::stats::{Cpu, Rates};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
    Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.bench)
}

fn temp_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    std::env::temp_dir().join(format!("fp-{name}-{}-{nanos}", std::process::id()))
}

#[test]
fn cli_rules() {
    use clap::CommandFactory;
    Cli::command().debug_assert();
    let a = parse(&["--compare", "mem:1M", "file:/x", "--matrix", "seeds"]).unwrap();
    assert_eq!(
        (a.compare.len(), a.matrix, a.target),
        (2, Some(Matrix::Seeds), None)
    );
    assert!(parse(&["--target", "mem:1M"]).unwrap().compare.is_empty());
    let err = |args: &[&str]| parse(args).err().map(|e| e.to_string()).unwrap_or_default();
    let both = ["--compare", "mem:1M", "mem:1M", "--matrix", "seeds"];
    let with = |extra: &[&str]| err(&[&both[..], extra].concat());
    let e = with(&["--target", "mem:1M"]);
    assert!(e.contains("--target") && e.contains("--compare"), "{e}");
    for fixed in [
        ["--rw", "write"],
        ["--bs", "8k"],
        ["--qd", "4"],
        ["--jobs", "2"],
    ] {
        let e = with(&fixed);
        assert!(e.contains(fixed[0]) && e.contains("--matrix"), "{e}");
    }
    let e = with(&["--rate-iops", "1000"]);
    assert!(e.contains("--rate-iops"), "{e}");
    let e = with(&["--json", "x.json"]);
    assert!(e.contains("--json"), "{e}");
    let e = err(&["--compare", "mem:1M", "mem:1M", "--matrix", "fio"]);
    assert!(e.contains("seeds"), "names the valid matrices: {e}");
    let e = err(&["--compare", "mem:1M", "mem:1M"]);
    assert!(e.contains("--matrix"), "{e}");
    let e = err(&["--compare", "mem:1M", "--matrix", "seeds"]);
    assert!(e.contains("2 values"), "{e}");
    let e = err(&[]);
    assert!(e.contains("--target"), "{e}");
    for single in [&["--report", "d"][..], &["--sweep-steps", "3"][..]] {
        let e = err(&[&["--target", "mem:1M"][..], single].concat());
        assert!(e.contains("--compare"), "{e}");
    }
    let a = parse(&["--target", "mem:1M", "--matrix", "seeds"]).unwrap();
    let e = crate::run(a).unwrap_err().to_string();
    assert!(e.contains("--matrix is for --compare"), "{e}");
    // A bad target is named before anything runs.
    let a = parse(&["--compare", "mem:1M", "nvme:0", "--matrix", "seeds"]).unwrap();
    let e = crate::run(a).unwrap_err().to_string();
    assert!(e.contains("nvme:0"), "{e}");
}

#[test]
fn defaults_with_compare() {
    let a = parse(&["--compare", "mem:1M", "mem:1M", "--matrix", "seeds"]).unwrap();
    let w = a.workload_for(true).unwrap();
    assert_eq!(
        (w.runtime, w.ramp),
        (Some(Duration::from_secs(5)), Duration::from_secs(1))
    );
    assert_eq!(a.sweep_steps, 8);
    let a = parse(&["--target", "mem:1M"]).unwrap();
    let w = a.workload_for(false).unwrap();
    assert_eq!(
        (w.runtime, w.ramp),
        (Some(Duration::from_secs(10)), Duration::ZERO)
    );
}

#[test]
fn sweep_rises_geometrically_past_saturation() {
    let f = Matrix::Seeds.sweep(8).fractions();
    assert_eq!(f.len(), 8);
    assert!(
        (f[0] - 0.10).abs() < 1e-12 && (f[7] - 1.20).abs() < 1e-12,
        "{f:?}"
    );
    for w in f.windows(3) {
        assert!((w[1] / w[0] - w[2] / w[1]).abs() < 1e-9, "{f:?}");
    }
    let cells = Matrix::Seeds.cells();
    assert_eq!(cells.len(), 4);
    assert!(cells.iter().all(|c| c.qd == 32 && c.jobs == 4));
    assert!(cells.iter().any(|c| c.name == Matrix::Seeds.sweep(3).base));
}

#[test]
fn utc_dates() {
    assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
    assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
    assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
}

/// A summary with `n` I/Os of latency `lat_us` each over one second.
pub(crate) fn summary(target: &str, bs: u32, n: u64, lat_us: u64) -> Summary {
    let mut h = new_histogram();
    h.record_n(lat_us * 1000, n).unwrap();
    Summary {
        target: target.into(),
        target_detail: format!("detail of {target}"),
        workload: Workload::default(),
        elapsed_s: 1.0,
        all: Rates::of(&h, n * u64::from(bs), 1.0),
        read: None,
        write: None,
        offered_iops: None,
        cpu: Cpu {
            bench_s: 0.5,
            bench_s_per_million_ios: 0.5 / (n as f64 / 1e6),
            target_s: None,
            target_s_per_million_ios: None,
            other_s: None,
            load_1m: None,
        },
        verify: None,
        rounds: None,
    }
}

/// Two targets; the second has a quarter of the first's IOPS, four times its
/// latency, and one failed cell.
fn fake_report() -> Report {
    let names = ["mem:1 GiB", "file:/tmp/a<b&c>"];
    let plan = Matrix::Seeds.cells();
    let sweep = Matrix::Seeds.sweep(3);
    let mut cells = Vec::new();
    for (t, name) in names.iter().enumerate() {
        let k = 4u64.pow(t as u32);
        for c in &plan {
            let failed = t == 1 && c.name == "write-128k";
            cells.push(CellResult {
                target: t,
                cell: c.name.into(),
                label: c.label.into(),
                sweep_step: None,
                offered_fraction: None,
                offered_iops: None,
                summary: (!failed).then(|| summary(name, c.bs, 400_000 / k, 10 * k)),
                error: failed.then(|| "boom <here>".into()),
            });
        }
        for (i, f) in sweep.fractions().into_iter().enumerate() {
            let o = (400_000.0 / k as f64 * f) as u64;
            cells.push(CellResult {
                target: t,
                cell: sweep.base.into(),
                label: "4 KiB random read".into(),
                sweep_step: Some(i as u32),
                offered_fraction: Some(f),
                offered_iops: Some(o),
                summary: Some(summary(
                    name,
                    4096,
                    o.min(400_000 / k),
                    10 * k * (i as u64 + 1),
                )),
                error: None,
            });
        }
    }
    Report {
        matrix: Matrix::Seeds,
        created_utc: utc(1_700_000_000),
        command: "flashpool bench --compare ...".into(),
        machine: "test: 2 CPUs".into(),
        cell_runtime_s: 5.0,
        ramp_s: 1.0,
        size: None,
        prefill: false,
        cells_plan: plan
            .iter()
            .map(|c| CellPlanJson {
                name: c.name,
                label: c.label,
                rw: c.rw,
                bs: c.bs,
                qd: c.qd,
                jobs: c.jobs,
            })
            .collect(),
        sweep,
        targets: names
            .iter()
            .enumerate()
            .map(|(i, n)| TargetEntry {
                label: format!("#{} {n}", i + 1),
                target: n.to_string(),
                detail: Some(format!("detail of {n}")),
            })
            .collect(),
        cells,
    }
}

#[test]
fn markdown_has_tables_ratios_and_png_links() {
    let r = fake_report();
    let charts = charts::build(&r);
    assert_eq!(
        charts.iter().map(|c| c.stem).collect::<Vec<_>>(),
        ["iops", "bandwidth", "latency"]
    );
    let md = markdown::render(&r, &charts);
    for want in [
        format!("![IOPS by workload](charts/iops.{IMAGE})").as_str(),
        format!("![Bandwidth by workload](charts/bandwidth.{IMAGE})").as_str(),
        format!("(charts/latency.{IMAGE})").as_str(),
        "| Workload | Target | IOPS | MB/s | Mean | p99 | p99.9 |",
        "| 4 KiB random read | #1 mem:1 GiB | 400,000 | 1638.4 | 10 µs |",
        "| 4 KiB random read | #2 file:/tmp/a<b&c> | 100,000 | 409.6 | 40 µs |",
        "| 0.25× | 4× | 4× |",
        "| baseline |",
        "| 128 KiB sequential write | #2 file:/tmp/a<b&c> | failed |",
        "## Failed cells",
        "boom \\<here\\>",
        "| Offered IOPS | % of saturation | Achieved IOPS |",
        "| 10% |",
        "| 120% |",
    ] {
        assert!(md.contains(want), "{want:?} missing in\n{md}");
    }
    // Every table row has as many cells as its header.
    for block in md.split("\n\n").filter(|b| b.starts_with("| ")) {
        let n = block.lines().next().unwrap().matches(" | ").count();
        assert!(
            block.lines().skip(2).all(|l| l.matches(" | ").count() == n),
            "{block}"
        );
    }
}

#[test]
fn html_is_self_contained_and_escaped() {
    let r = fake_report();
    let charts = charts::build(&r);
    let html = html::render(&r, &charts);
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    assert!(!html.to_ascii_lowercase().contains("<script"));
    assert_eq!(html.matches("<svg xmlns=").count(), 3);
    assert!(html.contains("<style>"));
    // Nothing fetched: the only URL is the SVG namespace.
    assert_eq!(
        html.matches("http").count(),
        html.matches("http://www.w3.org/2000/svg").count()
    );
    assert!(!html.contains(" src="));
    assert!(html.contains("#2 file:/tmp/a&lt;b&amp;c&gt;"));
    assert!(!html.contains("a<b&c>"));
    assert!(html.contains("boom &lt;here&gt;"));
    assert!(html.contains("0.25×"));
}

#[test]
fn bars_and_lines_carry_the_report_numbers() {
    let r = fake_report();
    let charts = charts::build(&r);
    let iops = &charts[0].svg;
    // Eight bars less the failed one, and the failed one marked.
    assert_eq!(iops.matches("<rect class=\"bar\"").count(), 7);
    assert!(iops.contains(">n/a<"));
    assert!(iops.contains(">400k<") && iops.contains(">100k<"));
    let lat = &charts[2].svg;
    assert_eq!(lat.matches("<polyline class=\"series\"").count(), 4);
    assert!(lat.contains("#2 file:/tmp/a&lt;b&amp;c&gt; p99.9"));
}

/// The whole command: two tiny RAM targets, 200 ms cells, three sweep steps.
#[test]
fn compare_end_to_end() {
    let dir = temp_dir("report");
    let d = dir.to_str().unwrap();
    let args = parse(&[
        "--compare",
        "mem:64M",
        "mem:64M",
        "--matrix",
        "seeds",
        "--runtime",
        "200ms",
        "--ramp",
        "0s",
        "--sweep-steps",
        "3",
        "--report",
        d,
        "-q",
    ])
    .unwrap();
    crate::run(args).unwrap();
    for f in [MARKDOWN, HTML, JSON] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    for stem in ["iops", "bandwidth", "latency"] {
        let svg =
            std::fs::read_to_string(dir.join(CHARTS_DIR).join(format!("{stem}.svg"))).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("#2 mem:64 MiB"),
            "{stem}"
        );
        #[cfg(feature = "png")]
        {
            let png = std::fs::read(dir.join(CHARTS_DIR).join(format!("{stem}.png"))).unwrap();
            let want = (
                (WIDTH * PNG_SCALE as f64) as u32,
                (HEIGHT * PNG_SCALE as f64) as u32,
            );
            assert_eq!(png_dimensions(&png), Some(want), "{stem}.png");
        }
    }
    let html = std::fs::read_to_string(dir.join(HTML)).unwrap();
    assert!(!html.to_ascii_lowercase().contains("<script"));
    assert_eq!(html.matches("<svg").count(), 3);
    let md = std::fs::read_to_string(dir.join(MARKDOWN)).unwrap();
    assert!(md.contains(&format!("](charts/iops.{IMAGE})")) && md.contains("| #2 mem:64 MiB |"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(JSON)).unwrap()).unwrap();
    let cells = json["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2 * (4 + 3));
    assert!(
        cells
            .iter()
            .all(|c| c["error"].is_null() && c["summary"]["all"]["iops"].as_f64() > Some(0.0))
    );
    let offered: Vec<u64> = cells
        .iter()
        .filter(|c| c["target"] == 1 && !c["sweep_step"].is_null())
        .map(|c| c["offered_iops"].as_u64().unwrap())
        .collect();
    assert!(
        offered.len() == 3 && offered[0] < offered[1] && offered[1] < offered[2],
        "{offered:?}"
    );
    assert_eq!(cells[0]["summary"]["workload"]["qd"], 32);
    assert_eq!(cells[0]["summary"]["workload"]["jobs"], 4);
    std::fs::remove_dir_all(&dir).unwrap();
}
