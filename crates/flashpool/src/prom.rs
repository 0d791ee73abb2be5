//! The Prometheus text exposition format, version 0.0.4: what `GET
//! /metrics` answers. Written here rather than through a registry because
//! every value is read at scrape time from counters the node already keeps
//! (plain atomics on the I/O path, the node's state for gauges), so a
//! series exists exactly as long as its volume, drive or controller does.

use std::fmt::Write;

use nvmf_target::stats::{HistogramSnapshot, LATENCY_BOUNDS_NS};

/// The Content-Type of the answer.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Longest label value taken from outside the node's configuration (a
/// host NQN): longer ones are cut, so a host cannot bloat every scrape.
pub const MAX_LABEL_LEN: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A page of metric families. Each family's samples are written together,
/// after its HELP and TYPE lines; a family without samples is left out.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

/// One family being written (see [`Exposition::family`]).
pub struct Family<'a> {
    page: &'a mut Exposition,
    name: &'static str,
    help: &'static str,
    kind: Kind,
    started: bool,
}

pub type Labels<'a> = [(&'static str, &'a str)];

impl Exposition {
    /// Starts family `name`; counters end in `_total` (their samples carry
    /// the name as given).
    pub fn family(&mut self, name: &'static str, kind: Kind, help: &'static str) -> Family<'_> {
        debug_assert!(valid_name(name), "{name}");
        debug_assert!(kind != Kind::Counter || name.ends_with("_total"), "{name}");
        Family {
            page: self,
            name,
            help,
            kind,
            started: false,
        }
    }

    pub fn finish(self) -> String {
        self.out
    }
}

impl Family<'_> {
    fn header(&mut self) {
        if !self.started {
            self.started = true;
            let out = &mut self.page.out;
            let _ = writeln!(out, "# HELP {} {}", self.name, escape_help(self.help));
            let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind.as_str());
        }
    }

    fn line(&mut self, suffix: &str, labels: &Labels, extra: Option<(&str, &str)>, value: &str) {
        self.header();
        let out = &mut self.page.out;
        out.push_str(self.name);
        out.push_str(suffix);
        let mut all = labels.iter().map(|&(k, v)| (k, v)).chain(extra).peekable();
        if all.peek().is_some() {
            out.push('{');
            for (i, (k, v)) in all.enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{k}=\"{}\"", escape_label(v));
            }
            out.push('}');
        }
        out.push(' ');
        out.push_str(value);
        out.push('\n');
    }

    /// A counter or integer gauge sample.
    pub fn int(&mut self, labels: &Labels, v: u64) -> &mut Self {
        debug_assert!(self.kind != Kind::Histogram);
        self.line("", labels, None, &v.to_string());
        self
    }

    /// A gauge sample.
    pub fn float(&mut self, labels: &Labels, v: f64) -> &mut Self {
        debug_assert!(self.kind == Kind::Gauge);
        self.line("", labels, None, &float(v));
        self
    }

    /// A latency histogram in seconds: cumulative buckets, `+Inf`, sum, count.
    pub fn histogram(&mut self, labels: &Labels, h: &HistogramSnapshot) -> &mut Self {
        debug_assert!(self.kind == Kind::Histogram);
        for (bound, n) in LATENCY_BOUNDS_NS.iter().zip(&h.cumulative) {
            let le = float(*bound as f64 / 1e9);
            self.line("_bucket", labels, Some(("le", &le)), &n.to_string());
        }
        self.line(
            "_bucket",
            labels,
            Some(("le", "+Inf")),
            &h.count.to_string(),
        );
        self.line("_sum", labels, None, &float(h.sum_ns as f64 / 1e9));
        self.line("_count", labels, None, &h.count.to_string());
        self
    }
}

fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':')
}

/// A sample value as Prometheus writes it.
pub fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// `v` cut to [`MAX_LABEL_LEN`] bytes (at a character boundary), with
/// `…` marking a cut.
pub fn bounded(v: &str) -> String {
    if v.len() <= MAX_LABEL_LEN {
        return v.to_string();
    }
    let mut end = MAX_LABEL_LEN;
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &v[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_help_type_and_escaped_labels() {
        let mut p = Exposition::default();
        p.family("flashpool_x_total", Kind::Counter, "Things.\nMore.")
            .int(&[("volume", "v\"1\\")], 3)
            .int(&[("volume", "line\nbreak")], 4);
        p.family("flashpool_empty", Kind::Gauge, "Never written.");
        p.family("flashpool_g", Kind::Gauge, "A gauge.")
            .float(&[], 0.5)
            .float(&[("a", "b")], f64::INFINITY);
        let t = p.finish();
        assert_eq!(
            t,
            "# HELP flashpool_x_total Things.\\nMore.\n\
             # TYPE flashpool_x_total counter\n\
             flashpool_x_total{volume=\"v\\\"1\\\\\"} 3\n\
             flashpool_x_total{volume=\"line\\nbreak\"} 4\n\
             # HELP flashpool_g A gauge.\n\
             # TYPE flashpool_g gauge\n\
             flashpool_g 0.5\n\
             flashpool_g{a=\"b\"} +Inf\n"
        );
    }

    #[test]
    fn a_histogram_has_cumulative_buckets_in_seconds() {
        let h = nvmf_target::stats::LatencyHistogram::default();
        h.record(std::time::Duration::from_micros(70));
        h.record(std::time::Duration::from_secs(2));
        let mut p = Exposition::default();
        p.family("flashpool_lat_seconds", Kind::Histogram, "Latency.")
            .histogram(&[("volume", "v")], &h.snapshot());
        let t = p.finish();
        assert!(
            t.contains("flashpool_lat_seconds_bucket{volume=\"v\",le=\"0.00005\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("flashpool_lat_seconds_bucket{volume=\"v\",le=\"0.0001\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("flashpool_lat_seconds_bucket{volume=\"v\",le=\"1\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("flashpool_lat_seconds_bucket{volume=\"v\",le=\"+Inf\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("flashpool_lat_seconds_sum{volume=\"v\"} 2.00007\n"),
            "{t}"
        );
        assert!(
            t.contains("flashpool_lat_seconds_count{volume=\"v\"} 2\n"),
            "{t}"
        );
        assert_eq!(t.matches("_bucket").count(), LATENCY_BOUNDS_NS.len() + 1);
    }

    #[test]
    fn long_label_values_are_cut_at_a_char_boundary() {
        assert_eq!(bounded("nqn.short"), "nqn.short");
        let long = format!("nqn.{}", "é".repeat(100));
        let b = bounded(&long);
        assert!(b.ends_with('…'));
        assert!(b.len() <= MAX_LABEL_LEN + '…'.len_utf8());
        assert!(b.starts_with("nqn.é"));
    }
}
