//! `flashpool bench --render SPEC.json DIR`: a report of numbers measured by
//! something else (a script's application runs, docs/bench/apps.sh), drawn
//! with this report's tables, charts, HTML page and PNG renderer, so that
//! every report of the project looks and reads the same.
//!
//! The spec is JSON: a title, Markdown paragraphs, tables (cells as text)
//! and charts (bar or line, their data). Out come `report.md`,
//! `report.html` and `charts/STEM.svg` (and `.png`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::html::{CSS, table as html_table};
use super::markdown::table as md_table;
use super::svg::{BarChart, BarSeries, Format, LineChart, LineSeries, Scale, escape};
use super::tables::Table;
use super::{CHARTS_DIR, HTML, IMAGE, MARKDOWN};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocSpec {
    pub title: String,
    /// Paragraphs (Markdown in report.md, plain text in report.html).
    #[serde(default)]
    pub intro: Vec<String>,
    #[serde(default)]
    pub sections: Vec<Section>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Section {
    pub heading: String,
    #[serde(default)]
    pub text: Vec<String>,
    #[serde(default)]
    pub table: Option<TableSpec>,
    #[serde(default)]
    pub charts: Vec<ChartSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSpec {
    pub head: Vec<String>,
    /// Right-aligned columns (numbers); default: all but the first.
    #[serde(default)]
    pub right: Option<Vec<bool>>,
    pub rows: Vec<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChartSpec {
    /// File name without extension: letters, digits, '-' and '_'.
    pub stem: String,
    pub caption: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// "compact" (612k), "thousands" (2,345) or "micros" (85.2 µs).
    #[serde(default = "compact")]
    pub format: String,
    /// Bars: one group per entry, one bar per series in each.
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub bars: Vec<BarSpec>,
    /// Lines: x and y of each point (a linear x axis formatted "compact").
    #[serde(default)]
    pub lines: Vec<LineSpec>,
}

fn compact() -> String {
    "compact".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BarSpec {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineSpec {
    pub name: String,
    #[serde(default)]
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

fn format_of(s: &str) -> Result<Format> {
    Ok(match s {
        "compact" => Format::Compact,
        "thousands" => Format::Thousands,
        "micros" => Format::Micros,
        _ => bail!("unknown format {s:?} (compact, thousands, micros)"),
    })
}

impl ChartSpec {
    /// The chart as SVG; refuses a spec that is neither bars nor lines, or whose bars do not
    /// have one value per group.
    pub fn svg(&self) -> Result<String> {
        if self.stem.is_empty()
            || !self
                .stem
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            bail!(
                "chart stem {:?}: letters, digits, '-' and '_' only",
                self.stem
            );
        }
        let format = format_of(&self.format)?;
        match (self.bars.is_empty(), self.lines.is_empty()) {
            (false, true) => {
                if let Some(b) = self
                    .bars
                    .iter()
                    .find(|b| b.values.len() != self.groups.len())
                {
                    bail!(
                        "chart {}: series {:?} has {} values for {} groups",
                        self.stem,
                        b.name,
                        b.values.len(),
                        self.groups.len()
                    );
                }
                Ok(BarChart {
                    title: self.title.clone(),
                    x_label: self.x_label.clone(),
                    y_label: self.y_label.clone(),
                    groups: self.groups.clone(),
                    series: self
                        .bars
                        .iter()
                        .map(|b| BarSeries {
                            name: b.name.clone(),
                            values: b.values.clone(),
                        })
                        .collect(),
                    format,
                }
                .render())
            }
            (true, false) => Ok(LineChart {
                title: self.title.clone(),
                x_label: self.x_label.clone(),
                y_label: self.y_label.clone(),
                x_scale: Scale::Linear,
                y_scale: Scale::Linear,
                x_format: Format::Compact,
                y_format: format,
                series: self
                    .lines
                    .iter()
                    .enumerate()
                    .map(|(i, l)| LineSeries {
                        name: l.name.clone(),
                        color: i,
                        dashed: l.dashed,
                        points: l.points.clone(),
                    })
                    .collect(),
            }
            .render()),
            _ => bail!("chart {}: give either bars or lines", self.stem),
        }
    }
}

impl TableSpec {
    fn table(&self) -> Result<Table> {
        let right = self
            .right
            .clone()
            .unwrap_or_else(|| (0..self.head.len()).map(|i| i > 0).collect::<Vec<bool>>());
        if right.len() != self.head.len() {
            bail!(
                "table: {} alignments for {} columns",
                right.len(),
                self.head.len()
            );
        }
        if let Some(r) = self.rows.iter().find(|r| r.len() != self.head.len()) {
            bail!(
                "table row {r:?}: {} cells for {} columns",
                r.len(),
                self.head.len()
            );
        }
        Ok(Table {
            head: self.head.clone(),
            right,
            rows: self.rows.clone(),
        })
    }
}

/// Reads the spec at `spec`, writes the report into `dir`; returns the files written.
pub fn render(spec: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let text =
        std::fs::read_to_string(spec).with_context(|| format!("cannot read {}", spec.display()))?;
    let doc: DocSpec = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a report spec", spec.display()))?;
    write(&doc, dir)
}

pub fn write(doc: &DocSpec, dir: &Path) -> Result<Vec<PathBuf>> {
    let charts_dir = dir.join(CHARTS_DIR);
    std::fs::create_dir_all(&charts_dir)
        .with_context(|| format!("cannot create {}", charts_dir.display()))?;
    #[cfg(feature = "png")]
    let renderer = super::png::PngRenderer::new();
    let mut md = format!("# {}\n\n", doc.title);
    let mut html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{t}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<h1>{t}</h1>\n",
        t = escape(&doc.title)
    );
    let para = |md: &mut String, html: &mut String, p: &str| {
        let _ = write!(md, "{p}\n\n");
        let _ = writeln!(html, "<p>{}</p>", escape(p));
    };
    for p in &doc.intro {
        para(&mut md, &mut html, p);
    }
    let mut files = Vec::new();
    for s in &doc.sections {
        let _ = write!(md, "## {}\n\n", s.heading);
        let _ = writeln!(html, "<h2>{}</h2>", escape(&s.heading));
        for p in &s.text {
            para(&mut md, &mut html, p);
        }
        if let Some(t) = &s.table {
            let t = t
                .table()
                .with_context(|| format!("section {:?}", s.heading))?;
            md += &md_table(&t);
            md.push('\n');
            html += &html_table(&t, None);
        }
        for c in &s.charts {
            let svg = c.svg()?;
            let p = charts_dir.join(format!("{}.svg", c.stem));
            std::fs::write(&p, &svg).with_context(|| format!("cannot write {}", p.display()))?;
            files.push(p);
            #[cfg(feature = "png")]
            {
                let png = renderer
                    .render(&svg, super::PNG_SCALE)
                    .with_context(|| format!("chart {}", c.stem))?;
                let p = charts_dir.join(format!("{}.png", c.stem));
                std::fs::write(&p, png).with_context(|| format!("cannot write {}", p.display()))?;
                files.push(p);
            }
            let _ = write!(
                md,
                "![{}]({CHARTS_DIR}/{}.{IMAGE})\n\n{}\n\n",
                c.title, c.stem, c.caption
            );
            let _ = writeln!(
                html,
                "<figure id=\"{stem}\">\n{svg}<figcaption>{cap} <a href=\"{CHARTS_DIR}/{stem}.svg\">SVG</a></figcaption>\n</figure>",
                stem = c.stem,
                cap = escape(&c.caption)
            );
        }
    }
    html.push_str("</body>\n</html>\n");
    for (name, body) in [(MARKDOWN, md), (HTML, html)] {
        let p = dir.join(name);
        std::fs::write(&p, body).with_context(|| format!("cannot write {}", p.display()))?;
        files.insert(0, p);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"{
      "title": "apps",
      "intro": ["Two configurations."],
      "sections": [{
        "heading": "RocksDB",
        "table": {"head": ["config", "ops/s"], "rows": [["local", "100"], ["tcp", "95"]]},
        "charts": [
          {"stem": "ops", "caption": "c", "title": "ops/s", "x_label": "w", "y_label": "ops/s",
           "groups": ["80/20"], "bars": [{"name": "local", "values": [100]}, {"name": "tcp", "values": [null]}]},
          {"stem": "timeline", "caption": "t", "title": "over time", "x_label": "s", "y_label": "ops/s",
           "lines": [{"name": "tcp", "points": [[1, 5], [2, 7]]}]}
        ]
      }]
    }"#;

    #[test]
    fn renders_tables_and_both_chart_kinds() {
        let doc: DocSpec = serde_json::from_str(SPEC).unwrap();
        let dir = std::env::temp_dir().join(format!("fp-doc-{}", std::process::id()));
        let files = write(&doc, &dir).unwrap();
        let md = std::fs::read_to_string(dir.join(MARKDOWN)).unwrap();
        assert!(md.contains("| local | 100 |"), "{md}");
        assert!(md.contains(&format!("(charts/timeline.{IMAGE})")), "{md}");
        let html = std::fs::read_to_string(dir.join(HTML)).unwrap();
        assert_eq!(html.matches("<svg").count(), 2);
        assert!(html.contains("<td class=\"r\">95</td>"), "{html}");
        let svg = std::fs::read_to_string(dir.join(CHARTS_DIR).join("ops.svg")).unwrap();
        assert!(svg.contains("n/a"), "a missing bar is drawn as n/a");
        assert!(files.len() >= 4);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_bad_specs() {
        let mut doc: DocSpec = serde_json::from_str(SPEC).unwrap();
        doc.sections[0].charts[0].bars[0].values.push(Some(1.0));
        assert!(
            doc.sections[0].charts[0]
                .svg()
                .unwrap_err()
                .to_string()
                .contains("2 values for 1 groups")
        );
        doc.sections[0].charts[1].stem = "../x".into();
        assert!(doc.sections[0].charts[1].svg().is_err());
        doc.sections[0].charts[1].stem = "x".into();
        doc.sections[0].charts[1].format = "furlongs".into();
        assert!(doc.sections[0].charts[1].svg().is_err());
        doc.sections[0]
            .table
            .as_mut()
            .unwrap()
            .rows
            .push(vec!["only one".into()]);
        assert!(doc.sections[0].table.as_ref().unwrap().table().is_err());
        assert!(serde_json::from_str::<DocSpec>(r#"{"title": "x", "colour": 1}"#).is_err());
    }
}
