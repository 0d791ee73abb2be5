//! Bar and line charts as standalone SVG: data in, a string out.
//!
//! No scripts and no external references, so the same string can be a
//! `.svg` file, be inlined into an HTML page, and be rasterised by resvg.
//! Text uses one generic font stack; its width is estimated (no font
//! metrics here), with margins generous enough for DejaVu Sans, the
//! widest common sans-serif.

use std::fmt::Write as _;

/// Canvas size of every chart, in CSS pixels.
pub const WIDTH: f64 = 960.0;
pub const HEIGHT: f64 = 540.0;
/// The font stack; the PNG renderer maps `sans-serif` to whatever it finds.
pub const FONT: &str = "DejaVu Sans, Liberation Sans, Arial, sans-serif";

/// Tableau 10: distinct for the usual colour-vision deficiencies and in grey.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// The colour of series `i` (cycles after ten).
pub fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// How numbers are written on ticks and bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// 612k, 1.23M: counts (IOPS).
    Compact,
    /// 2,345 or 12.3: rates with a unit in the axis label (MB/s).
    Thousands,
    /// A duration given in microseconds: 85.2 µs, 1.5 ms, 2 s.
    Micros,
}

impl Format {
    pub fn fmt(self, v: f64) -> String {
        if !v.is_finite() {
            return "n/a".into();
        }
        match self {
            Format::Compact => {
                let a = v.abs();
                if a >= 1e9 {
                    format!("{}G", sig3(v / 1e9))
                } else if a >= 1e6 {
                    format!("{}M", sig3(v / 1e6))
                } else if a >= 1e3 {
                    format!("{}k", sig3(v / 1e3))
                } else {
                    sig3(v)
                }
            }
            Format::Thousands => {
                if v.abs() >= 100.0 {
                    crate::stats::fmt_thousands(v)
                } else {
                    sig3(v)
                }
            }
            Format::Micros => {
                let a = v.abs();
                if a >= 1e6 {
                    format!("{} s", sig3(v / 1e6))
                } else if a >= 1e3 {
                    format!("{} ms", sig3(v / 1e3))
                } else {
                    format!("{} µs", sig3(v))
                }
            }
        }
    }
}

/// Three significant digits, no trailing zeros: 612.3 -> "612", 1.50 -> "1.5", 0.125 -> "0.125".
pub fn sig3(v: f64) -> String {
    let a = v.abs();
    let s = if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        // 0.0123 -> 3 significant digits
        let decimals = (2 - a.log10().floor() as i32).clamp(0, 9) as usize;
        format!("{v:.decimals$}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Escapes text for XML (and HTML) content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Estimated width of `s` in pixels at `size` px (DejaVu Sans averages ~0.6 em).
fn text_width(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * size * 0.61
}

/// Bars grouped along x (one group per category, one bar per series in each).
#[derive(Debug, Clone)]
pub struct BarChart {
    pub title: String,
    pub x_label: String,
    /// With the unit, e.g. "IOPS" or "MB/s (10^6 bytes per second)".
    pub y_label: String,
    pub groups: Vec<String>,
    pub series: Vec<BarSeries>,
    pub format: Format,
}

#[derive(Debug, Clone)]
pub struct BarSeries {
    pub name: String,
    /// One per group; `None` draws "n/a" instead of a bar.
    pub values: Vec<Option<f64>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Linear,
    Log,
}

/// Lines through points, e.g. latency against offered load.
#[derive(Debug, Clone)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_scale: Scale,
    pub y_scale: Scale,
    pub x_format: Format,
    pub y_format: Format,
    pub series: Vec<LineSeries>,
}

#[derive(Debug, Clone)]
pub struct LineSeries {
    pub name: String,
    /// Index into the palette, so that several series can share a colour.
    pub color: usize,
    /// Dashed line with hollow markers (e.g. a tail percentile next to the mean).
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

enum LegendMark {
    Swatch,
    Line { dashed: bool },
}

/// Header shared by both chart kinds: the root element, a white background, the title.
fn open(out: &mut String, title: &str) {
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="{FONT}" fill="#222222">
<title>{t}</title>
<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>
<text x="{cx}" y="30" text-anchor="middle" font-size="19" font-weight="bold">{t}</text>
"##,
        cx = WIDTH / 2.0,
        t = escape(title),
    );
}

/// Legend rows under the title, centred, wrapping; returns the y below it.
fn legend(out: &mut String, entries: &[(String, &str, LegendMark)], top: f64) -> f64 {
    const SIZE: f64 = 13.0;
    const ROW: f64 = 20.0;
    const GAP: f64 = 22.0;
    let mark_w = |m: &LegendMark| match m {
        LegendMark::Swatch => 14.0,
        LegendMark::Line { .. } => 30.0,
    };
    let max_w = WIDTH - 40.0;
    // A name wider than a row is cut, with an ellipsis.
    let fit = |name: &str, m: &LegendMark| {
        let room = ((max_w - mark_w(m) - 6.0) / (SIZE * 0.61)) as usize;
        if name.chars().count() <= room {
            name.to_string()
        } else {
            name.chars()
                .take(room.saturating_sub(1))
                .collect::<String>()
                + "…"
        }
    };
    let entries: Vec<(String, &str, &LegendMark)> = entries
        .iter()
        .map(|(name, col, m)| (fit(name, m), *col, m))
        .collect();
    let mut rows: Vec<Vec<usize>> = vec![Vec::new()];
    let mut row_w = 0.0;
    let widths: Vec<f64> = entries
        .iter()
        .map(|(name, _, m)| mark_w(m) + 6.0 + text_width(name, SIZE))
        .collect();
    for (i, w) in widths.iter().enumerate() {
        let row = rows.last_mut().expect("one row");
        let add = if row.is_empty() { *w } else { GAP + w };
        if !row.is_empty() && row_w + add > max_w {
            rows.push(vec![i]);
            row_w = *w;
        } else {
            row.push(i);
            row_w += add;
        }
    }
    let mut y = top;
    for row in &rows {
        let total: f64 =
            row.iter().map(|&i| widths[i]).sum::<f64>() + GAP * (row.len() as f64 - 1.0);
        let mut x = ((WIDTH - total) / 2.0).max(10.0);
        for &i in row {
            let (name, col, mark) = &entries[i];
            match **mark {
                LegendMark::Swatch => {
                    let _ = writeln!(
                        out,
                        r#"<rect x="{x:.1}" y="{:.1}" width="14" height="14" fill="{col}"/>"#,
                        y - 11.0
                    );
                }
                LegendMark::Line { dashed } => {
                    let _ = writeln!(
                        out,
                        r#"<line x1="{x:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{col}" stroke-width="2.5"{}/>"#,
                        x + 30.0,
                        dash_attr(dashed),
                        ly = y - 4.0
                    );
                    marker(out, x + 15.0, y - 4.0, col, dashed);
                }
            }
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{y:.1}" font-size="{SIZE}">{}</text>"#,
                x + mark_w(mark) + 6.0,
                escape(name)
            );
            x += widths[i] + GAP;
        }
        y += ROW;
    }
    y - ROW + 8.0
}

fn dash_attr(dashed: bool) -> &'static str {
    if dashed {
        r#" stroke-dasharray="7 4""#
    } else {
        ""
    }
}

fn marker(out: &mut String, x: f64, y: f64, col: &str, hollow: bool) {
    let fill = if hollow { "#ffffff" } else { col };
    let _ = writeln!(
        out,
        r#"<circle cx="{x:.1}" cy="{y:.1}" r="4" fill="{fill}" stroke="{col}" stroke-width="2"/>"#
    );
}

/// Tick values for a linear axis from 0 (or `lo`) covering `hi`: steps of 1, 2 or 5 × 10^k.
fn linear_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).floor() * step;
    let mut v = Vec::new();
    let mut k = 0.0;
    loop {
        let t = first + k * step;
        v.push(t);
        if t >= hi - step * 1e-9 {
            break;
        }
        k += 1.0;
    }
    v
}

/// Ticks inside [lo, hi] on a log axis: 1, 2, 5 × 10^k, or only 10^k over many decades.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let all = |mults: &[f64]| -> Vec<f64> {
        (a..=b)
            .flat_map(|k| mults.iter().map(move |m| m * 10f64.powi(k)))
            .filter(|v| *v >= lo * (1.0 - 1e-9) && *v <= hi * (1.0 + 1e-9))
            .collect()
    };
    let fine = all(&[1.0, 2.0, 5.0]);
    if fine.len() <= 10 {
        if fine.len() >= 4 {
            return fine;
        }
        let finer = all(&[1.0, 1.5, 2.0, 3.0, 5.0, 7.0]);
        if finer.len() >= 3 {
            return finer;
        }
        return linear_ticks(lo, hi, 4)
            .into_iter()
            .filter(|v| *v >= lo && *v <= hi)
            .collect();
    }
    all(&[1.0])
}

/// Maps data to pixels along one axis.
struct Axis {
    scale: Scale,
    lo: f64,
    hi: f64,
    p0: f64,
    p1: f64,
}

impl Axis {
    fn px(&self, v: f64) -> f64 {
        let f = match self.scale {
            Scale::Linear => (v - self.lo) / (self.hi - self.lo),
            Scale::Log => (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln()),
        };
        self.p0 + f * (self.p1 - self.p0)
    }
}

/// Domain of an axis over `vals` (positive only for log), with the ticks to draw.
fn domain(scale: Scale, vals: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64, Vec<f64>) {
    let vals: Vec<f64> = vals
        .filter(|v| v.is_finite() && (scale == Scale::Linear || *v > 0.0))
        .collect();
    let (mut lo, mut hi) = vals
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(*v), b.max(*v))
        });
    if vals.is_empty() {
        (lo, hi) = (1.0, 10.0);
    }
    match scale {
        Scale::Log => {
            if hi / lo < 1.5 {
                (lo, hi) = (lo / 1.5, hi * 1.5);
            }
            let (lo, hi) = (lo / 1.2, hi * 1.2);
            let ticks = log_ticks(lo, hi);
            let decades = |v: &f64| (v.log10() - v.log10().round()).abs() < 1e-9;
            if ticks.len() > 1 && ticks.iter().all(decades) {
                // Only powers of ten are labelled: end the axis on them, so that
                // no data sits beyond the last label.
                let (lo, hi) = (
                    10f64.powf(lo.log10().floor()),
                    10f64.powf(hi.log10().ceil()),
                );
                return (lo, hi, log_ticks(lo, hi));
            }
            (lo, hi, ticks)
        }
        Scale::Linear => {
            let lo = if from_zero { lo.min(0.0) } else { lo };
            let hi = if hi <= lo { lo + 1.0 } else { hi };
            let pad = if from_zero { 0.0 } else { (hi - lo) * 0.05 };
            let ticks = linear_ticks(lo - pad, hi + pad, 5);
            (ticks[0], *ticks.last().expect("ticks"), ticks)
        }
    }
}

/// Rotated y-axis title, x-axis title.
fn axis_titles(
    out: &mut String,
    x_label: &str,
    y_label: &str,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
) {
    let _ = writeln!(
        out,
        r#"<text transform="translate(20,{:.1}) rotate(-90)" text-anchor="middle" font-size="14">{}</text>"#,
        (top + bottom) / 2.0,
        escape(y_label)
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="14">{}</text>"#,
        (left + right) / 2.0,
        HEIGHT - 14.0,
        escape(x_label)
    );
}

/// Horizontal grid lines and y tick labels.
fn y_grid(out: &mut String, ax: &Axis, ticks: &[f64], fmt: Format, left: f64, right: f64) {
    for &t in ticks {
        let y = ax.px(t);
        let _ = writeln!(
            out,
            r##"<line x1="{left:.1}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="#dddddd" stroke-width="1"/>"##
        );
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="12" fill="#444444">{}</text>"##,
            left - 7.0,
            y + 4.0,
            escape(&fmt.fmt(t))
        );
    }
}

/// Left margin that fits the widest y tick label and the rotated axis title.
fn left_margin(ticks: &[f64], fmt: Format) -> f64 {
    let w = ticks
        .iter()
        .map(|t| text_width(&fmt.fmt(*t), 12.0))
        .fold(0.0, f64::max);
    (w + 48.0).max(70.0)
}

impl BarChart {
    pub fn render(&self) -> String {
        let mut out = String::new();
        open(&mut out, &self.title);
        let entries: Vec<(String, &str, LegendMark)> = self
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), color(i), LegendMark::Swatch))
            .collect();
        let top = legend(&mut out, &entries, 60.0) + 22.0;
        let bottom = HEIGHT - 62.0;
        let plot_h = bottom - top;
        let ng = self.groups.len().max(1);
        let ns = self.series.len().max(1);
        // Width first, from a provisional margin: whether value labels must stand
        // up decides the headroom, which decides the ticks, which decide the margin.
        let provisional_w = WIDTH - 90.0 - 20.0;
        let bar_w = |plot_w: f64| (plot_w / ng as f64 * 0.78 / ns as f64).min(90.0);
        let vals = || {
            self.series
                .iter()
                .flat_map(|s| s.values.iter().flatten().copied())
        };
        let label_w = vals()
            .map(|v| text_width(&self.format.fmt(v), 11.0))
            .fold(0.0, f64::max);
        let upright = label_w + 4.0 > bar_w(provisional_w) + 4.0;
        let label_room = if upright { label_w + 10.0 } else { 18.0 };
        let vmax = vals().filter(|v| v.is_finite()).fold(0.0, f64::max);
        // The tallest bar leaves label_room pixels above it.
        let need = if vmax > 0.0 {
            vmax * plot_h / (plot_h - label_room).max(plot_h * 0.3)
        } else {
            1.0
        };
        let ticks = linear_ticks(0.0, need, 5);
        let ymax = *ticks.last().expect("ticks");
        let left = left_margin(&ticks, self.format);
        let right = WIDTH - 20.0;
        let plot_w = right - left;
        let ax = Axis {
            scale: Scale::Linear,
            lo: 0.0,
            hi: ymax,
            p0: bottom,
            p1: top,
        };
        y_grid(&mut out, &ax, &ticks, self.format, left, right);
        let gw = plot_w / ng as f64;
        let bw = bar_w(plot_w);
        for (g, name) in self.groups.iter().enumerate() {
            let gx = left + g as f64 * gw;
            let x0 = gx + (gw - bw * ns as f64) / 2.0;
            for (s, series) in self.series.iter().enumerate() {
                let x = x0 + s as f64 * bw;
                let cx = x + bw / 2.0;
                let v = series
                    .values
                    .get(g)
                    .copied()
                    .flatten()
                    .filter(|v| v.is_finite());
                let Some(v) = v else {
                    let _ = writeln!(
                        out,
                        r##"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-size="11" fill="#888888">n/a</text>"##,
                        bottom - 5.0
                    );
                    continue;
                };
                let y = ax.px(v.max(0.0));
                let label = escape(&self.format.fmt(v));
                let _ = writeln!(
                    out,
                    r##"<rect class="bar" data-value="{v}" x="{:.2}" y="{y:.2}" width="{:.2}" height="{:.2}" fill="{}" stroke="#ffffff" stroke-width="1"><title>{}: {}</title></rect>"##,
                    x,
                    bw,
                    bottom - y,
                    color(s),
                    escape(&series.name),
                    label
                );
                if upright {
                    let _ = writeln!(
                        out,
                        r#"<text transform="translate({:.1},{:.1}) rotate(-90)" font-size="11">{label}</text>"#,
                        cx + 4.0,
                        y - 5.0
                    );
                } else {
                    let _ = writeln!(
                        out,
                        r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-size="11">{label}</text>"#,
                        y - 5.0
                    );
                }
            }
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13">{}</text>"#,
                gx + gw / 2.0,
                bottom + 20.0,
                escape(name)
            );
        }
        let _ = writeln!(
            out,
            r##"<line x1="{left:.1}" y1="{bottom:.1}" x2="{right:.1}" y2="{bottom:.1}" stroke="#333333" stroke-width="1.5"/>"##
        );
        axis_titles(
            &mut out,
            &self.x_label,
            &self.y_label,
            left,
            right,
            top,
            bottom,
        );
        out.push_str("</svg>\n");
        out
    }
}

impl LineChart {
    pub fn render(&self) -> String {
        let mut out = String::new();
        open(&mut out, &self.title);
        let entries: Vec<(String, &str, LegendMark)> = self
            .series
            .iter()
            .map(|s| {
                (
                    s.name.clone(),
                    color(s.color),
                    LegendMark::Line { dashed: s.dashed },
                )
            })
            .collect();
        let top = legend(&mut out, &entries, 60.0) + 18.0;
        let bottom = HEIGHT - 62.0;
        let points = || self.series.iter().flat_map(|s| s.points.iter().copied());
        let (xlo, xhi, xticks) = domain(self.x_scale, points().map(|p| p.0), false);
        let (ylo, yhi, yticks) = domain(self.y_scale, points().map(|p| p.1), true);
        let left = left_margin(&yticks, self.y_format);
        let right = WIDTH - 30.0;
        let xa = Axis {
            scale: self.x_scale,
            lo: xlo,
            hi: xhi,
            p0: left,
            p1: right,
        };
        let ya = Axis {
            scale: self.y_scale,
            lo: ylo,
            hi: yhi,
            p0: bottom,
            p1: top,
        };
        y_grid(&mut out, &ya, &yticks, self.y_format, left, right);
        for &t in &xticks {
            let x = xa.px(t);
            let _ = writeln!(
                out,
                r##"<line x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{bottom:.1}" stroke="#eeeeee" stroke-width="1"/>"##
            );
            let _ = writeln!(
                out,
                r##"<text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="12" fill="#444444">{}</text>"##,
                bottom + 18.0,
                escape(&self.x_format.fmt(t))
            );
        }
        let _ = writeln!(
            out,
            r##"<rect x="{left:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#333333" stroke-width="1.5"/>"##,
            right - left,
            bottom - top
        );
        let ok = |(x, y): &(f64, f64)| {
            x.is_finite()
                && y.is_finite()
                && (self.x_scale == Scale::Linear || *x > 0.0)
                && (self.y_scale == Scale::Linear || *y > 0.0)
        };
        for s in &self.series {
            let col = color(s.color);
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter(|p| ok(p))
                .map(|&(x, y)| (xa.px(x), ya.px(y)))
                .collect();
            if pts.len() > 1 {
                let path: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
                let _ = writeln!(
                    out,
                    r#"<polyline class="series" points="{}" fill="none" stroke="{col}" stroke-width="2.5" stroke-linejoin="round"{}/>"#,
                    path.join(" "),
                    dash_attr(s.dashed)
                );
            }
            for (x, y) in &pts {
                marker(&mut out, *x, *y, col, s.dashed);
            }
        }
        axis_titles(
            &mut out,
            &self.x_label,
            &self.y_label,
            left,
            right,
            top,
            bottom,
        );
        out.push_str("</svg>\n");
        out
    }
}

#[cfg(test)]
#[path = "svg_tests.rs"]
mod tests;
