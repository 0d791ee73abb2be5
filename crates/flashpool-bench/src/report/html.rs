//! `report.html`: one self-contained page, CSS and SVG charts inline, no
//! scripts and nothing fetched, so it can be mailed or archived as is.

use std::fmt::Write as _;

use super::charts::Chart;
use super::markdown::conditions;
use super::svg::escape;
use super::tables::{self, Table};
use super::{CHARTS_DIR, JSON, MARKDOWN, Report};

pub(super) const CSS: &str = "\
body{font-family:'DejaVu Sans',system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}\
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd}\
code,pre{font-family:'DejaVu Sans Mono',monospace;font-size:.9em}\
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;white-space:pre-wrap}\
table{border-collapse:collapse;margin:1em 0;font-size:.88em}\
th,td{border:1px solid #ccc;padding:.25em .6em}th{background:#f0f0f0}\
td.r,th.r{text-align:right}tr.first td{border-top:2px solid #888}\
figure{margin:1.5em 0}figure svg{max-width:100%;height:auto;border:1px solid #eee}\
figcaption{color:#555;font-size:.9em;max-width:960px}\
.failed{color:#b00}";

pub(super) fn table(t: &Table, group_col: Option<usize>) -> String {
    let mut s = String::from("<table>\n<tr>");
    for (h, r) in t.head.iter().zip(&t.right) {
        let _ = write!(
            s,
            "<th{}>{}</th>",
            if *r { " class=\"r\"" } else { "" },
            escape(h)
        );
    }
    s.push_str("</tr>\n");
    let mut prev: Option<&String> = None;
    for row in &t.rows {
        // A heavier line where a new workload (or target) starts.
        let first = group_col.is_some_and(|g| prev != row.get(g) && prev.is_some());
        prev = group_col.and_then(|g| row.get(g));
        s.push_str(if first {
            "<tr class=\"first\">"
        } else {
            "<tr>"
        });
        for (c, r) in row.iter().zip(&t.right) {
            let class = match (*r, c == "failed") {
                (_, true) => " class=\"failed\"",
                (true, false) => " class=\"r\"",
                (false, false) => "",
            };
            let _ = write!(s, "<td{class}>{}</td>", escape(c));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n");
    s
}

fn figure(c: &Chart) -> String {
    let stem = c.stem;
    let png = if cfg!(feature = "png") {
        format!("<a href=\"{CHARTS_DIR}/{stem}.png\">PNG</a> · ")
    } else {
        String::new()
    };
    format!(
        "<figure id=\"{stem}\">\n{svg}<figcaption>{cap} {png}<a href=\"{CHARTS_DIR}/{stem}.svg\">SVG</a></figcaption>\n</figure>\n",
        svg = c.svg,
        cap = escape(&c.caption)
    )
}

pub fn render(r: &Report, charts: &[Chart]) -> String {
    let title = format!(
        "flashpool bench: {} targets, matrix {}",
        r.targets.len(),
        r.matrix.name()
    );
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{t}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<h1>{t}</h1>\n",
        t = escape(&title)
    );
    let _ = writeln!(
        s,
        "<p>Measured {} on {}.</p>\n<pre>{}</pre>",
        escape(&r.created_utc),
        escape(&r.machine),
        escape(&r.command)
    );
    s.push_str("<p>Targets (the first is the baseline of the ratios):</p>\n<ol>\n");
    for t in &r.targets {
        let _ = write!(s, "<li><code>{}</code>", escape(&t.label));
        if let Some(d) = &t.detail {
            let _ = write!(s, ": {}", escape(d));
        }
        s.push_str("</li>\n");
    }
    s.push_str("</ol>\n");
    let _ = writeln!(s, "<p>{}</p>", escape(&conditions(r)));
    s.push_str("<h2>Matrix</h2>\n");
    s += &table(&tables::matrix(r), Some(0));
    s.push_str(
        "<p>Latency is per I/O, from submission to completion, over all I/Os of the cell. \
         Bench CPU: CPU time of the bench process over the measured time (cores) and per I/O. \
         Ratios are each target's value over target #1's in the same workload \
         (above 1× for latency means slower than #1).</p>\n",
    );
    for c in charts.iter().filter(|c| c.stem != "latency") {
        s += &figure(c);
    }
    s.push_str("<h2>Latency under load</h2>\n");
    if let Some(c) = charts.iter().find(|c| c.stem == "latency") {
        s += &figure(c);
        s += &table(&tables::sweep(r), Some(0));
    }
    let failed = r.failures();
    if !failed.is_empty() {
        s.push_str("<h2>Failed cells</h2>\n<ul>\n");
        for c in failed {
            let step = c
                .sweep_step
                .map_or(String::new(), |k| format!(" (sweep step {})", k + 1));
            let _ = writeln!(
                s,
                "<li><code>{}</code> {}{step}: <span class=\"failed\">{}</span></li>",
                escape(&r.targets[c.target].label),
                escape(&c.label),
                escape(c.error.as_deref().unwrap_or(""))
            );
        }
        s.push_str("</ul>\n");
    }
    let _ = writeln!(
        s,
        "<h2>Files</h2>\n<ul>\n<li><a href=\"{MARKDOWN}\">{MARKDOWN}</a>: this report in Markdown, charts as PNG</li>\n\
         <li><a href=\"{JSON}\">{JSON}</a>: every cell's full summary (latency histograms included)</li>\n\
         <li><code>{CHARTS_DIR}/</code>: each chart as SVG and PNG</li>\n</ul>\n</body>\n</html>"
    );
    s
}
