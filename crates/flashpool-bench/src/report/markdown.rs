//! `report.md`: the tables, and the PNG charts by relative link.

use std::fmt::Write as _;

use super::charts::Chart;
use super::tables::{self, Table};
use super::{CHARTS_DIR, HTML, IMAGE, JSON, Report};
use crate::spec::human_bytes;

/// Text for a table cell: no line breaks, no cell separators.
fn cell(s: &str) -> String {
    s.replace(['\n', '\r'], " ").replace('|', "\\|")
}

/// Inline code that survives backticks in the text.
fn code(s: &str) -> String {
    let fence = if s.contains('`') { "``" } else { "`" };
    format!("{fence}{}{fence}", s.replace(['\n', '\r'], " "))
}

/// Text with the characters Markdown would read as markup escaped.
fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\`*_[]<>#|".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

pub(super) fn table(t: &Table) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| {} |",
        t.head
            .iter()
            .map(|h| cell(h))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(
        s,
        "|{}|",
        t.right
            .iter()
            .map(|r| if *r { "---:" } else { ":---" })
            .collect::<Vec<_>>()
            .join("|")
    );
    for row in &t.rows {
        let _ = writeln!(
            s,
            "| {} |",
            row.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | ")
        );
    }
    s
}

/// The matrix table alone (also printed at the end of a run).
pub fn results_table(r: &Report) -> String {
    table(&tables::matrix(r))
}

pub fn render(r: &Report, charts: &[Chart]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# flashpool bench: {} targets, matrix `{}`\n",
        r.targets.len(),
        r.matrix.name()
    );
    let _ = writeln!(s, "Measured {} on {}.\n", r.created_utc, text(&r.machine));
    let _ = writeln!(s, "    {}\n", r.command);
    let _ = writeln!(s, "Targets (the first is the baseline of the ratios):\n");
    for (i, t) in r.targets.iter().enumerate() {
        let _ = write!(s, "{}. {}", i + 1, code(&t.label));
        if let Some(d) = &t.detail {
            let _ = write!(s, ": {}", text(d));
        }
        s.push('\n');
    }
    s.push('\n');
    let _ = writeln!(s, "{}\n", text(&conditions(r)));
    let _ = writeln!(s, "## Matrix\n");
    s += &table(&tables::matrix(r));
    s.push('\n');
    let _ = writeln!(
        s,
        "Latency is per I/O, from submission to completion, over all I/Os of the cell. \
         Bench CPU: CPU time of the bench process over the measured time (cores) and per I/O. \
         Ratios are each target's value over target #1's in the same workload \
         (above 1× for latency means slower than #1).\n"
    );
    for c in charts.iter().filter(|c| c.stem != "latency") {
        let _ = writeln!(
            s,
            "![{}]({CHARTS_DIR}/{}.{IMAGE})\n",
            text(&c.title),
            c.stem
        );
        let _ = writeln!(s, "{}\n", text(&c.caption));
    }
    let _ = writeln!(s, "## Latency under load\n");
    if let Some(c) = charts.iter().find(|c| c.stem == "latency") {
        let _ = writeln!(s, "{}\n", text(&c.caption));
        s += &table(&tables::sweep(r));
        s.push('\n');
        let _ = writeln!(
            s,
            "![{}]({CHARTS_DIR}/{}.{IMAGE})\n",
            text(&c.title),
            c.stem
        );
    }
    let failed = r.failures();
    if !failed.is_empty() {
        let _ = writeln!(s, "## Failed cells\n");
        for c in failed {
            let step = c
                .sweep_step
                .map_or(String::new(), |k| format!(" (sweep step {})", k + 1));
            let _ = writeln!(
                s,
                "- {} {}{step}: {}",
                code(&r.targets[c.target].label),
                text(&c.label),
                text(c.error.as_deref().unwrap_or(""))
            );
        }
        s.push('\n');
    }
    let _ = writeln!(s, "## Files\n");
    let _ = writeln!(
        s,
        "- [{HTML}]({HTML}): this report as one page, charts inline\n\
         - [{JSON}]({JSON}): every cell's full summary (latency histograms included)\n\
         - `{CHARTS_DIR}/`: each chart as SVG and PNG"
    );
    s
}

/// One sentence on how each cell ran.
pub fn conditions(r: &Report) -> String {
    let mut s = format!(
        "Each cell ran {} s after a {} s ramp, {}",
        super::svg::sig3(r.cell_runtime_s),
        super::svg::sig3(r.ramp_s),
        r.shape()
    );
    match r.size {
        Some(sz) => s += &format!(", over the first {} of each target", human_bytes(sz)),
        None => s += ", over the whole of each target",
    }
    if r.prefill {
        s += "; targets were written once before being read (--prefill)";
    }
    s.push('.');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(cell("a|b\nc"), "a\\|b c");
        assert_eq!(code("x`y"), "``x`y``");
        assert_eq!(text("<b>*x*</b>"), "\\<b\\>\\*x\\*\\</b\\>");
    }
}
