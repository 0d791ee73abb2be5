//! `flashpool bench --compare A B ... --matrix seeds`: the same matrix of
//! workloads on each target, then a report in a directory: Markdown, a
//! self-contained HTML page with SVG charts, the charts as SVG and PNG, and
//! every cell's full summary as JSON.
//!
//! The first target is the baseline: the tables give each other target's
//! IOPS and latency as a ratio of it ("how much does the fabric cost against local?").

mod charts;
pub mod doc;
mod html;
mod markdown;
#[cfg(feature = "png")]
mod png;
mod svg;
mod tables;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use flashpool_util::output::{out, outln};
use serde::Serialize;

use crate::spec::{Rw, Target, Workload, human_bytes};
use crate::stats::{Summary, fmt_thousands};
use crate::{BenchArgs, run_workload};

/// Which set of workloads `--matrix` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Matrix {
    /// The usual storage comparison: 4 KiB random read and write, 128 KiB sequential read
    /// and write, QD 32 x 4 jobs; then 4 KiB random read at rising offered load.
    Seeds,
}

/// One closed-loop cell of a matrix.
#[derive(Debug, Clone, Copy)]
pub struct CellSpec {
    /// Short name, used in file names and JSON: "randread-4k".
    pub name: &'static str,
    /// For people: "4 KiB random read".
    pub label: &'static str,
    pub rw: Rw,
    pub bs: u32,
    pub qd: u32,
    pub jobs: u32,
}

/// The latency-under-load sweep: `base`'s workload at `steps` offered loads
/// from `from` to `to` times the IOPS `base` reached on the same target.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SweepPlan {
    pub base: &'static str,
    pub steps: u32,
    pub from: f64,
    pub to: f64,
}

impl SweepPlan {
    /// Fractions of the saturation IOPS, rising geometrically (equal steps on a log axis).
    pub fn fractions(&self) -> Vec<f64> {
        let n = self.steps.max(2);
        (0..n)
            .map(|i| self.from * (self.to / self.from).powf(f64::from(i) / f64::from(n - 1)))
            .collect()
    }
}

impl Matrix {
    pub fn name(self) -> &'static str {
        match self {
            Matrix::Seeds => "seeds",
        }
    }

    pub fn cells(self) -> Vec<CellSpec> {
        match self {
            Matrix::Seeds => {
                let c = |name, label, rw, bs| CellSpec {
                    name,
                    label,
                    rw,
                    bs,
                    qd: 32,
                    jobs: 4,
                };
                vec![
                    c("randread-4k", "4 KiB random read", Rw::Randread, 4096),
                    c("randwrite-4k", "4 KiB random write", Rw::Randwrite, 4096),
                    c("read-128k", "128 KiB sequential read", Rw::Read, 128 << 10),
                    c(
                        "write-128k",
                        "128 KiB sequential write",
                        Rw::Write,
                        128 << 10,
                    ),
                ]
            }
        }
    }

    /// 10% to 120%: from lightly loaded, where latency is the bare round trip,
    /// to past the knee, where the queue fills and latency is qd x jobs / IOPS.
    pub fn sweep(self, steps: u32) -> SweepPlan {
        match self {
            Matrix::Seeds => SweepPlan {
                base: "randread-4k",
                steps,
                from: 0.10,
                to: 1.20,
            },
        }
    }
}

impl CellSpec {
    fn workload(&self, base: &Workload) -> Workload {
        Workload {
            rw: self.rw,
            bs: self.bs,
            qd: self.qd,
            jobs: self.jobs,
            ..base.clone()
        }
    }
}

/// Everything a report shows; also `results.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub matrix: Matrix,
    pub created_utc: String,
    pub command: String,
    pub machine: String,
    /// Measured seconds per cell, after `ramp_s`.
    pub cell_runtime_s: f64,
    pub ramp_s: f64,
    /// Bytes of each target used (None: all of it).
    pub size: Option<u64>,
    pub prefill: bool,
    pub cells_plan: Vec<CellPlanJson>,
    pub sweep: SweepPlan,
    pub targets: Vec<TargetEntry>,
    pub cells: Vec<CellResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CellPlanJson {
    pub name: &'static str,
    pub label: &'static str,
    pub rw: Rw,
    pub bs: u32,
    pub qd: u32,
    pub jobs: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct TargetEntry {
    /// "#1 mem:1 GiB": the name in tables and legends (two equal targets stay apart).
    pub label: String,
    pub target: String,
    /// What the target turned out to be, from its first measured cell.
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CellResult {
    /// Index into `targets`.
    pub target: usize,
    /// The matrix cell, or for sweep steps the cell the sweep is based on.
    pub cell: String,
    pub label: String,
    /// 0, 1, ... for the sweep's steps; None for the matrix cells.
    pub sweep_step: Option<u32>,
    /// Fraction of the base cell's IOPS offered.
    pub offered_fraction: Option<f64>,
    pub offered_iops: Option<u64>,
    pub summary: Option<Summary>,
    pub error: Option<String>,
}

impl Report {
    /// The closed-loop cell `name` on target `t`, when it was measured.
    pub fn matrix_summary(&self, t: usize, name: &str) -> Option<&Summary> {
        self.cells
            .iter()
            .find(|c| c.target == t && c.sweep_step.is_none() && c.cell == name)
            .and_then(|c| c.summary.as_ref())
    }

    /// The sweep's steps on target `t`, in order.
    pub fn sweep_cells(&self, t: usize) -> Vec<&CellResult> {
        self.cells
            .iter()
            .filter(|c| c.target == t && c.sweep_step.is_some())
            .collect()
    }

    pub fn failures(&self) -> Vec<&CellResult> {
        self.cells.iter().filter(|c| c.error.is_some()).collect()
    }

    /// "QD 32 x 4 jobs" when all cells share it.
    pub fn shape(&self) -> String {
        let first = self.cells_plan.first();
        match first {
            Some(f)
                if self
                    .cells_plan
                    .iter()
                    .all(|c| (c.qd, c.jobs) == (f.qd, f.jobs)) =>
            {
                format!("QD {} × {} jobs", f.qd, f.jobs)
            }
            _ => "QD and jobs per cell".into(),
        }
    }
}

/// File names under the report directory.
pub const MARKDOWN: &str = "report.md";
pub const HTML: &str = "report.html";
pub const JSON: &str = "results.json";
pub const CHARTS_DIR: &str = "charts";
/// PNGs are drawn at twice the SVG's size, for sharp images on any screen.
#[cfg(feature = "png")]
pub const PNG_SCALE: f32 = 2.0;
/// The chart files the Markdown shows: PNG, or SVG in a build without the
/// `png` feature (no renderer).
pub const IMAGE: &str = if cfg!(feature = "png") { "png" } else { "svg" };

/// `flashpool bench --compare ...`: measures, writes the report, prints the table.
pub(super) fn run(args: &BenchArgs, matrix: Matrix) -> Result<()> {
    let targets = args
        .compare
        .iter()
        .map(|s| Target::parse(s))
        .collect::<Result<Vec<_>>>()?;
    let base = args.workload_for(true)?;
    let dir = args
        .report
        .clone()
        .unwrap_or_else(|| PathBuf::from("bench-report"));
    // Fail on a bad directory now, not after minutes of measuring.
    std::fs::create_dir_all(dir.join(CHARTS_DIR))
        .with_context(|| format!("--report {}: cannot create the directory", dir.display()))?;
    let report = measure(matrix, &targets, &base, args.sweep_steps, args.prefill)?;
    let files = write(&report, &dir)?;
    out!("{}", markdown::results_table(&report));
    outln!();
    for f in &files {
        outln!("wrote {}", f.display());
    }
    let failed = report.failures();
    if !failed.is_empty() {
        let first = failed[0];
        bail!(
            "{} of {} cells failed (the report shows which); first: {} {}: {}",
            failed.len(),
            report.cells.len(),
            report.targets[first.target].label,
            first.label,
            first.error.as_deref().unwrap_or("")
        );
    }
    Ok(())
}

/// Runs the matrix, then the sweep, on each target in turn.
pub fn measure(
    matrix: Matrix,
    targets: &[Target],
    base: &Workload,
    sweep_steps: u32,
    prefill: bool,
) -> Result<Report> {
    let plan = matrix.cells();
    let sweep = matrix.sweep(sweep_steps);
    let sweep_base = plan
        .iter()
        .find(|c| c.name == sweep.base)
        .copied()
        .context("the sweep's base cell is not in the matrix")?;
    let total = targets.len() * (plan.len() + sweep.steps as usize);
    let mut n = 0;
    let mut entries: Vec<TargetEntry> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| TargetEntry {
            label: format!("#{} {t}", i + 1),
            target: t.to_string(),
            detail: None,
        })
        .collect();
    let mut cells: Vec<CellResult> = Vec::new();
    for (ti, target) in targets.iter().enumerate() {
        let label = entries[ti].label.clone();
        let mut w_base = base.clone();
        // The target's CPU is only meaningful for a target in another process.
        if !matches!(target, Target::Tcp { .. }) {
            w_base.target_pid.clear();
            // --engine picks how tcp:// targets are reached; a local one is a BlockDevice anyway.
            w_base.engine = crate::Engine::Queue;
        }
        // A RAM device is new in each cell, so it is filled in each reading cell;
        // a file or a remote namespace keeps its data, so one pass up front does.
        let fill_each = prefill && matches!(target, Target::Mem(_));
        if prefill && !fill_each {
            eprintln!("{label}: prefill (one sequential 128 KiB write pass)");
            let w = Workload {
                rw: Rw::Write,
                bs: 128 << 10,
                qd: 16,
                jobs: 4,
                runtime: None,
                ramp: Duration::ZERO,
                rate_iops: None,
                verify: false,
                prefill: false,
                progress: false,
                ..w_base.clone()
            };
            if let Err(e) = run_workload(target, &w) {
                eprintln!("{label}: prefill failed: {e:#}");
            }
        }
        let run_cell = |n: &mut usize, spec: &CellSpec, rate: Option<(u32, f64, u64)>| {
            *n += 1;
            let mut w = spec.workload(&w_base);
            w.prefill = fill_each && !spec.rw.writes();
            w.rate_iops = rate.map(|r| r.2);
            let what = match rate {
                Some((_, f, r)) => format!(
                    "{} at {} IOPS offered ({:.0}%)",
                    spec.label,
                    fmt_thousands(r as f64),
                    f * 100.0
                ),
                None => format!("{}, {}", spec.label, shape_of(spec)),
            };
            eprintln!("[{n}/{total}] {label}: {what}");
            let r = run_workload(target, &w);
            match &r {
                Ok(s) => eprintln!(
                    "[{n}/{total}] {label}: {} IOPS, {:.1} MB/s, mean {:.1} us, p99.9 {:.1} us",
                    fmt_thousands(s.all.iops),
                    s.all.mb_s,
                    s.all.lat.mean_us,
                    s.all.lat.p999_us
                ),
                Err(e) => eprintln!("[{n}/{total}] {label}: failed: {e:#}"),
            }
            CellResult {
                target: ti,
                cell: spec.name.into(),
                label: spec.label.into(),
                sweep_step: rate.map(|r| r.0),
                offered_fraction: rate.map(|r| r.1),
                offered_iops: rate.map(|r| r.2),
                error: r.as_ref().err().map(|e| format!("{e:#}")),
                summary: r.ok(),
            }
        };
        for spec in &plan {
            cells.push(run_cell(&mut n, spec, None));
        }
        let saturation = cells
            .iter()
            .find(|c| c.target == ti && c.sweep_step.is_none() && c.cell == sweep.base)
            .and_then(|c| c.summary.as_ref())
            .map(|s| s.all.iops)
            .filter(|&i| i >= 1.0);
        for (k, f) in sweep.fractions().into_iter().enumerate() {
            let k = k as u32;
            match saturation {
                Some(sat) => {
                    let rate = ((sat * f).round() as u64).max(1);
                    cells.push(run_cell(&mut n, &sweep_base, Some((k, f, rate))));
                }
                None => {
                    n += 1;
                    cells.push(CellResult {
                        target: ti,
                        cell: sweep.base.into(),
                        label: sweep_base.label.into(),
                        sweep_step: Some(k),
                        offered_fraction: Some(f),
                        offered_iops: None,
                        summary: None,
                        error: Some(format!(
                            "not run: the sweep's loads come from the {} cell, which has no result",
                            sweep.base
                        )),
                    });
                }
            }
        }
        entries[ti].detail = cells
            .iter()
            .filter(|c| c.target == ti)
            .find_map(|c| c.summary.as_ref())
            .map(|s| s.target_detail.clone());
    }
    Ok(Report {
        matrix,
        created_utc: utc_now(),
        command: command_line(),
        machine: machine(),
        cell_runtime_s: base.runtime.map_or(0.0, |d| d.as_secs_f64()),
        ramp_s: base.ramp.as_secs_f64(),
        size: base.size,
        prefill,
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
        targets: entries,
        cells,
    })
}

fn shape_of(c: &CellSpec) -> String {
    format!("QD {} × {} jobs", c.qd, c.jobs)
}

/// Writes every file of the report into `dir`; returns the main ones.
pub fn write(report: &Report, dir: &Path) -> Result<Vec<PathBuf>> {
    let charts_dir = dir.join(CHARTS_DIR);
    std::fs::create_dir_all(&charts_dir)
        .with_context(|| format!("cannot create {}", charts_dir.display()))?;
    let put = |p: PathBuf, bytes: &[u8]| -> Result<PathBuf> {
        std::fs::write(&p, bytes).with_context(|| format!("cannot write {}", p.display()))?;
        Ok(p)
    };
    let charts = charts::build(report);
    #[cfg(feature = "png")]
    let renderer = png::PngRenderer::new();
    #[cfg(feature = "png")]
    if renderer.family.is_none() {
        eprintln!(
            "flashpool: warning: no fonts found (install fonts-dejavu-core); the PNG charts will have no text"
        );
    }
    #[cfg(not(feature = "png"))]
    eprintln!(
        "flashpool: note: built without the PNG renderer (feature png of flashpool-bench); the charts are SVG only"
    );
    for c in &charts {
        put(charts_dir.join(format!("{}.svg", c.stem)), c.svg.as_bytes())?;
        #[cfg(feature = "png")]
        {
            let png = renderer
                .render(&c.svg, PNG_SCALE)
                .with_context(|| format!("chart {}", c.stem))?;
            put(charts_dir.join(format!("{}.png", c.stem)), &png)?;
        }
    }
    let json = serde_json::to_string_pretty(report).context("encoding the results as JSON")?;
    Ok(vec![
        put(
            dir.join(MARKDOWN),
            markdown::render(report, &charts).as_bytes(),
        )?,
        put(dir.join(HTML), html::render(report, &charts).as_bytes())?,
        put(dir.join(JSON), (json + "\n").as_bytes())?,
        charts_dir,
    ])
}

/// "2026-11-22 07:30:05 UTC".
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc(secs)
}

fn utc(secs: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    let s = humantime::format_rfc3339_seconds(t).to_string();
    format!("{} UTC", s.trim_end_matches('Z').replacen('T', " ", 1))
}

/// The command as typed (words with spaces or quotes quoted for a POSIX shell).
fn command_line() -> String {
    let mut args = std::env::args();
    let argv0 = args.next().unwrap_or_default();
    let prog = Path::new(&argv0)
        .file_name()
        .map_or("flashpool".into(), |f| f.to_string_lossy().into_owned());
    std::iter::once(prog)
        .chain(args)
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// "host, 2 CPUs (AMD EPYC ...), Linux 6.18": where the numbers come from.
fn machine() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let host = read("/proc/sys/kernel/hostname").trim().to_string();
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_default();
    // SAFETY: sysconf only reads a configuration value.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1);
    let mem = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| format!(", {} RAM", human_bytes(kb << 10)))
        .unwrap_or_default();
    let mut s = format!("{host}: {cpus} CPUs");
    if !model.is_empty() {
        s += &format!(" ({model})");
    }
    s += &mem;
    if !kernel.is_empty() {
        s += &format!(", Linux {kernel}");
    }
    s
}

#[cfg(test)]
pub(crate) mod tests;
