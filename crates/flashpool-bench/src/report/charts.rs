//! The report's charts, from its results: which numbers go on which chart.

use super::Report;
use super::svg::{BarChart, BarSeries, Format, LineChart, LineSeries, Scale};

/// One chart: `charts/{stem}.svg` and `.png`.
pub struct Chart {
    pub stem: &'static str,
    pub title: String,
    /// A sentence on how to read it.
    pub caption: String,
    pub svg: String,
}

pub fn build(r: &Report) -> Vec<Chart> {
    let mut out = Vec::new();
    let bars =
        |title: &str, y_label: &str, format: Format, value: fn(&super::Summary) -> f64| BarChart {
            title: title.into(),
            x_label: format!("workload ({} per target)", r.shape()),
            y_label: y_label.into(),
            groups: r.cells_plan.iter().map(|c| c.label.to_string()).collect(),
            series: r
                .targets
                .iter()
                .enumerate()
                .map(|(t, e)| BarSeries {
                    name: e.label.clone(),
                    values: r
                        .cells_plan
                        .iter()
                        .map(|c| r.matrix_summary(t, c.name).map(value))
                        .collect(),
                })
                .collect(),
            format,
        };
    let c = bars(
        "IOPS by workload",
        "IOPS (I/Os per second)",
        Format::Compact,
        |s| s.all.iops,
    );
    out.push(Chart {
        stem: "iops",
        title: c.title.clone(),
        caption: "I/Os per second of each target in each cell, closed loop; higher is better."
            .into(),
        svg: c.render(),
    });
    let c = bars(
        "Bandwidth by workload",
        "MB/s (10^6 bytes per second)",
        Format::Thousands,
        |s| s.all.mb_s,
    );
    out.push(Chart {
        stem: "bandwidth",
        title: c.title.clone(),
        caption: "Bytes moved per second in each cell; higher is better.".into(),
        svg: c.render(),
    });
    let label = r
        .cells_plan
        .iter()
        .find(|c| c.name == r.sweep.base)
        .map_or(r.sweep.base, |c| c.label);
    let mut series = Vec::new();
    for (t, e) in r.targets.iter().enumerate() {
        let steps = r.sweep_cells(t);
        let pts = |f: fn(&super::Summary) -> f64| -> Vec<(f64, f64)> {
            steps
                .iter()
                .filter_map(|c| Some((c.offered_iops? as f64, f(c.summary.as_ref()?))))
                .collect()
        };
        let mean = pts(|s| s.all.lat.mean_us);
        let none = if mean.is_empty() { " (no data)" } else { "" };
        series.push(LineSeries {
            name: format!("{} mean{none}", e.label),
            color: t,
            dashed: false,
            points: mean,
        });
        series.push(LineSeries {
            name: format!("{} p99.9{none}", e.label),
            color: t,
            dashed: true,
            points: pts(|s| s.all.lat.p999_us),
        });
    }
    let c = LineChart {
        title: format!("{label}: latency under load"),
        x_label: "offered load (IOPS, log scale)".into(),
        y_label: "completion latency (log scale)".into(),
        x_scale: Scale::Log,
        y_scale: Scale::Log,
        x_format: Format::Compact,
        y_format: Format::Micros,
        series,
    };
    out.push(Chart {
        stem: "latency",
        title: c.title.clone(),
        caption: format!(
            "Open loop: {} offered loads per target from {:.0}% to {:.0}% of the IOPS it reached in the {label} cell. \
             Solid: mean, dashed: p99.9. Latency is timed from submission, so past saturation it levels off \
             at what a full queue gives, and the achieved IOPS (table) fall short of the offered.",
            r.sweep.steps,
            r.sweep.from * 100.0,
            r.sweep.to * 100.0
        ),
        svg: c.render(),
    });
    out
}
