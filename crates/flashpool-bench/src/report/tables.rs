//! The report's tables as plain text cells, for the Markdown and HTML writers.

use super::Report;
use super::svg::{Format, sig3};
use crate::stats::{Summary, fmt_thousands};

pub struct Table {
    pub head: Vec<String>,
    /// Right-aligned (numbers) per column.
    pub right: Vec<bool>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    fn new(cols: &[(&str, bool)]) -> Table {
        Table {
            head: cols.iter().map(|c| c.0.to_string()).collect(),
            right: cols.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
        }
    }
}

fn us(v: f64) -> String {
    Format::Micros.fmt(v)
}

/// 0.034 -> "0.034×", 1.5 -> "1.5×", 96.4 -> "96×".
pub fn ratio(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    if v >= 10.0 {
        format!("{v:.0}×")
    } else {
        format!("{}×", sig3(v))
    }
}

fn cores(s: &Summary) -> f64 {
    s.cpu.bench_s / s.elapsed_s.max(1e-9)
}

/// Per workload, one row per target: rates, latency, CPU, ratios to target #1.
pub fn matrix(r: &Report) -> Table {
    let with_target_cpu = r
        .cells
        .iter()
        .filter_map(|c| c.summary.as_ref())
        .any(|s| s.cpu.target_s.is_some());
    let base = r.targets.first().map_or("#1".to_string(), |t| {
        t.label.split(' ').next().unwrap_or("#1").to_string()
    });
    let mut cols: Vec<(String, bool)> = [
        ("Workload", false),
        ("Target", false),
        ("IOPS", true),
        ("MB/s", true),
        ("Mean", true),
        ("p99", true),
        ("p99.9", true),
        ("Bench CPU (cores)", true),
        ("Bench CPU per I/O", true),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), *b))
    .collect();
    if with_target_cpu {
        cols.push(("Target CPU per I/O".into(), true));
    }
    for c in ["IOPS", "Mean lat", "p99.9 lat"] {
        cols.push((format!("{c} ÷ {base}"), true));
    }
    let cols: Vec<(&str, bool)> = cols.iter().map(|(a, b)| (a.as_str(), *b)).collect();
    let mut t = Table::new(&cols);
    for cell in &r.cells_plan {
        let baseline = r.matrix_summary(0, cell.name);
        for (ti, target) in r.targets.iter().enumerate() {
            let mut row = vec![cell.label.to_string(), target.label.clone()];
            let found = r
                .cells
                .iter()
                .find(|c| c.target == ti && c.sweep_step.is_none() && c.cell == cell.name);
            match found.and_then(|c| c.summary.as_ref()) {
                Some(s) => {
                    let l = &s.all.lat;
                    row.extend([
                        fmt_thousands(s.all.iops),
                        format!("{:.1}", s.all.mb_s),
                        us(l.mean_us),
                        us(l.p99_us),
                        us(l.p999_us),
                        format!("{:.2}", cores(s)),
                        // Seconds per million I/Os are microseconds per I/O.
                        us(s.cpu.bench_s_per_million_ios),
                    ]);
                    if with_target_cpu {
                        row.push(s.cpu.target_s_per_million_ios.map_or("".into(), us));
                    }
                    match (ti, baseline) {
                        (0, _) => row.extend(["baseline".into(), "".into(), "".into()]),
                        (_, Some(b)) => row.extend([
                            ratio(s.all.iops / b.all.iops),
                            ratio(l.mean_us / b.all.lat.mean_us),
                            ratio(l.p999_us / b.all.lat.p999_us),
                        ]),
                        (_, None) => row.extend(["n/a".into(), "n/a".into(), "n/a".into()]),
                    }
                }
                None => {
                    row.push("failed".into());
                    row.resize(t.head.len(), String::new());
                }
            }
            t.rows.push(row);
        }
    }
    t
}

/// The sweep: per target and step, offered and achieved load and latency.
pub fn sweep(r: &Report) -> Table {
    let mut t = Table::new(&[
        ("Target", false),
        ("Offered IOPS", true),
        ("% of saturation", true),
        ("Achieved IOPS", true),
        ("Achieved ÷ offered", true),
        ("Mean", true),
        ("p99", true),
        ("p99.9", true),
    ]);
    for (ti, target) in r.targets.iter().enumerate() {
        for c in r.sweep_cells(ti) {
            let mut row = vec![
                target.label.clone(),
                c.offered_iops
                    .map_or("n/a".into(), |o| fmt_thousands(o as f64)),
                c.offered_fraction
                    .map_or("".into(), |f| format!("{:.0}%", f * 100.0)),
            ];
            match (&c.summary, c.offered_iops) {
                (Some(s), Some(o)) => {
                    let l = &s.all.lat;
                    row.extend([
                        fmt_thousands(s.all.iops),
                        format!("{:.0}%", 100.0 * s.all.iops / o as f64),
                        us(l.mean_us),
                        us(l.p99_us),
                        us(l.p999_us),
                    ]);
                }
                _ => {
                    row.push("failed".into());
                    row.resize(t.head.len(), String::new());
                }
            }
            t.rows.push(row);
        }
    }
    t
}
