//! What `GET /metrics` answers: the Prometheus text exposition format,
//! version 0.0.4, encoded by `prometheus-client`. Every value is read at
//! scrape time from counters the node already keeps (plain atomics on the
//! I/O path, the node's state for gauges), so a series exists exactly as
//! long as its volume, drive or controller does and the I/O path never
//! looks a metric up. [`Exposition`] buffers one scrape's families and
//! samples; [`Exposition::finish`] hands them to a fresh registry as a
//! [`Collector`] and lets the crate write the text (names, escaping,
//! histogram buckets).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet, prometheus_text,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use nvmf_target::stats::{HistogramSnapshot, LATENCY_BOUNDS_NS};

/// The Content-Type of the answer (Prometheus text 0.0.4).
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

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
    fn metric_type(self) -> MetricType {
        match self {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
            Kind::Histogram => MetricType::Histogram,
        }
    }
}

pub type Labels<'a> = [(&'static str, &'a str)];

/// One scrape's metric families, in the order they were started. A family
/// without samples is left out of the page.
#[derive(Default)]
pub struct Exposition {
    families: Vec<FamilyData>,
}

struct FamilyData {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    samples: Vec<Sample>,
}

struct Sample {
    labels: Vec<(&'static str, String)>,
    value: Value,
}

enum Value {
    Int(u64),
    Float(f64),
    Histogram(HistogramSnapshot),
    Seconds(SecondsSnapshot),
}

/// A histogram in seconds with its own bounds (durations of cluster
/// actions, far longer than an I/O).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SecondsSnapshot {
    /// `le` bounds, increasing; `+Inf` is added.
    pub bounds: &'static [f64],
    /// Cumulative counts per bound.
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum: f64,
}

/// One family being filled (see [`Exposition::family`]).
pub struct Family<'a> {
    data: &'a mut FamilyData,
}

impl std::fmt::Debug for Exposition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exposition")
            .field("families", &self.families.len())
            .finish()
    }
}

impl Exposition {
    /// Starts family `name`, exactly as it is exposed: counters end in
    /// `_total` (prometheus-client adds the suffix itself, so it is taken
    /// off before the family is handed over).
    pub fn family(&mut self, name: &'static str, kind: Kind, help: &'static str) -> Family<'_> {
        debug_assert!(valid_name(name), "{name}");
        debug_assert!(kind != Kind::Counter || name.ends_with("_total"), "{name}");
        self.families.push(FamilyData {
            name,
            help,
            kind,
            samples: Vec::new(),
        });
        Family {
            data: self.families.last_mut().expect("just pushed"),
        }
    }

    /// The page's text.
    pub fn finish(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        // Writing to a String fails only if an encoder does, and ours don't.
        prometheus_text::encode(&mut out, &registry).expect("encoding into a String");
        out
    }
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in self.families.iter().filter(|f| !f.samples.is_empty()) {
            let name = match f.kind {
                Kind::Counter => f.name.strip_suffix("_total").unwrap_or(f.name),
                Kind::Gauge | Kind::Histogram => f.name,
            };
            let mut family = encoder.encode_descriptor(name, f.help, None, f.kind.metric_type())?;
            for s in &f.samples {
                let sample = family.encode_family(&s.labels)?;
                match (&s.value, f.kind) {
                    (Value::Int(v), Kind::Counter) => ConstCounter::new(*v).encode(sample)?,
                    (Value::Int(v), _) => ConstGauge::new(*v).encode(sample)?,
                    (Value::Float(v), Kind::Counter) => ConstCounter::new(*v).encode(sample)?,
                    (Value::Float(v), _) => ConstGauge::new(*v).encode(sample)?,
                    (Value::Histogram(h), _) => LatencySeconds(h).encode(sample)?,
                    (Value::Seconds(h), _) => h.encode(sample)?,
                }
            }
        }
        Ok(())
    }
}

/// A latency histogram snapshot in seconds, as prometheus-client encodes a
/// histogram: per-bucket counts (it adds them up into `le` buckets and
/// `+Inf`), sum and count.
struct LatencySeconds<'a>(&'a HistogramSnapshot);

impl EncodeMetric for LatencySeconds<'_> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let h = self.0;
        let mut below = 0;
        let buckets: Vec<(f64, u64)> = LATENCY_BOUNDS_NS
            .iter()
            .zip(&h.cumulative)
            .map(|(bound, &n)| {
                let in_bucket = n.saturating_sub(below);
                below = n;
                (*bound as f64 / 1e9, in_bucket)
            })
            .collect();
        encoder.encode_histogram::<NoLabelSet>(h.sum_ns as f64 / 1e9, h.count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl EncodeMetric for SecondsSnapshot {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let mut below = 0;
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(&self.cumulative)
            .map(|(bound, &n)| {
                let in_bucket = n.saturating_sub(below);
                below = n;
                (*bound, in_bucket)
            })
            .collect();
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl Family<'_> {
    /// A histogram in seconds with its own bounds.
    pub fn seconds(&mut self, labels: &Labels, h: &SecondsSnapshot) -> &mut Self {
        debug_assert!(self.data.kind == Kind::Histogram);
        self.push(labels, Value::Seconds(h.clone()))
    }

    fn push(&mut self, labels: &Labels, value: Value) -> &mut Self {
        self.data.samples.push(Sample {
            labels: labels.iter().map(|&(k, v)| (k, v.to_string())).collect(),
            value,
        });
        self
    }

    /// A counter or integer gauge sample.
    pub fn int(&mut self, labels: &Labels, v: u64) -> &mut Self {
        debug_assert!(self.data.kind != Kind::Histogram);
        self.push(labels, Value::Int(v))
    }

    /// A gauge sample.
    pub fn float(&mut self, labels: &Labels, v: f64) -> &mut Self {
        debug_assert!(self.data.kind == Kind::Gauge);
        self.push(labels, Value::Float(v))
    }

    /// A counter that is not whole (seconds added up).
    pub fn float_counter(&mut self, labels: &Labels, v: f64) -> &mut Self {
        debug_assert!(self.data.kind == Kind::Counter);
        self.push(labels, Value::Float(v))
    }

    /// A latency histogram in seconds: cumulative buckets, `+Inf`, sum, count.
    pub fn histogram(&mut self, labels: &Labels, h: &HistogramSnapshot) -> &mut Self {
        debug_assert!(self.data.kind == Kind::Histogram);
        self.push(labels, Value::Histogram(h.clone()))
    }
}

fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':')
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

/// Checks that `page` is valid Prometheus text 0.0.4 as far as flashpool
/// writes it: HELP/TYPE lines for valid names, each family once and its
/// samples together under it, label values escaped (`\\`, `\"`, `\n` only),
/// sample values that parse, and per histogram series cumulative `le`
/// buckets ending in `+Inf` = `_count`. Panics with the offending line.
#[cfg(test)]
pub fn check_exposition(page: &str) {
    use std::collections::{HashMap, HashSet};

    fn name_end(l: &str) -> usize {
        l.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(l.len())
    }
    /// Parses `{k="v",...}`; returns the labels (unescaped) and the rest.
    fn labels(mut s: &str, line: &str) -> (Vec<(String, String)>, String) {
        let mut out = Vec::new();
        let Some(rest) = s.strip_prefix('{') else {
            return (out, s.to_string());
        };
        s = rest;
        loop {
            if let Some(rest) = s.strip_prefix('}') {
                return (out, rest.to_string());
            }
            let end = name_end(s);
            let key = &s[..end];
            assert!(
                valid_name(key) && !key.contains(':'),
                "label name {key:?}: {line}"
            );
            s = s[end..]
                .strip_prefix("=\"")
                .unwrap_or_else(|| panic!("no =\" after {key}: {line}"));
            let mut value = String::new();
            let mut chars = s.char_indices();
            let close = loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, 'n')) => value.push('\n'),
                        other => panic!("bad escape {other:?}: {line}"),
                    },
                    Some((i, '"')) => break i,
                    Some((_, '\n')) | None => panic!("unterminated label value: {line}"),
                    Some((_, c)) => value.push(c),
                }
            };
            out.push((key.to_string(), value));
            s = &s[close + 1..];
            s = s.strip_prefix(',').unwrap_or(s);
        }
    }
    fn number(v: &str, line: &str) -> f64 {
        match v {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value {v:?}: {line}")),
        }
    }

    let mut types: HashMap<String, String> = HashMap::new();
    let mut helped = HashSet::new();
    let mut current: Option<String> = None;
    // Histogram series (name + labels without le) -> (le, count) in order, and _count.
    let mut buckets: HashMap<String, Vec<(f64, f64)>> = HashMap::new();
    let mut counts: HashMap<String, f64> = HashMap::new();
    assert!(page.ends_with('\n'), "page does not end in a newline");
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let end = name_end(rest);
            let name = &rest[..end];
            assert!(valid_name(name), "{line}");
            assert!(rest[end..].starts_with(' '), "{line}");
            assert!(helped.insert(name.to_string()), "HELP twice: {line}");
            current = Some(name.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or_else(|| panic!("{line}"));
            assert!(valid_name(name), "{line}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert_eq!(
                current.as_deref(),
                Some(name),
                "TYPE without its HELP: {line}"
            );
            assert!(
                types.insert(name.into(), kind.into()).is_none(),
                "TYPE twice: {line}"
            );
            continue;
        }
        assert!(!line.starts_with('#'), "stray comment: {line}");
        let end = name_end(line);
        let name = &line[..end];
        assert!(valid_name(name), "{line}");
        let (labels, rest) = labels(&line[end..], line);
        let value = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        assert!(!value.contains(' '), "timestamps are not written: {line}");
        let value = number(value, line);
        let family = current
            .as_deref()
            .unwrap_or_else(|| panic!("no TYPE: {line}"));
        let kind = types[family].as_str();
        match kind {
            "histogram" => {
                let suffix = name
                    .strip_prefix(family)
                    .unwrap_or_else(|| panic!("not in {family}: {line}"));
                let key = |ls: &[(String, String)]| {
                    let mut k = family.to_string();
                    for (n, v) in ls.iter().filter(|(n, _)| n != "le") {
                        k.push_str(&format!(",{n}={v:?}"));
                    }
                    k
                };
                match suffix {
                    "_bucket" => {
                        let le = &labels.iter().find(|(n, _)| n == "le").expect(line).1;
                        buckets
                            .entry(key(&labels))
                            .or_default()
                            .push((number(le, line), value));
                    }
                    "_count" => {
                        counts.insert(key(&labels), value);
                    }
                    "_sum" => {}
                    _ => panic!("histogram sample {name}: {line}"),
                }
            }
            "counter" => {
                assert_eq!(name, family, "{line}");
                assert!(name.ends_with("_total"), "{line}");
                assert!(value >= 0.0, "{line}");
            }
            _ => assert_eq!(name, family, "{line}"),
        }
        let mut keys = HashSet::new();
        for (k, _) in &labels {
            assert!(keys.insert(k), "label {k} twice: {line}");
        }
    }
    assert_eq!(
        buckets.len(),
        counts.len(),
        "histogram series without _count"
    );
    for (series, bs) in &buckets {
        assert!(
            bs.windows(2).all(|w| w[0].0 < w[1].0),
            "le order in {series}"
        );
        assert!(
            bs.windows(2).all(|w| w[0].1 <= w[1].1),
            "not cumulative: {series}"
        );
        let last = bs.last().unwrap();
        assert_eq!(last.0, f64::INFINITY, "no +Inf bucket in {series}");
        assert_eq!(
            Some(&last.1),
            counts.get(series),
            "+Inf != _count in {series}"
        );
    }
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
            .float(&[("a", "b")], f64::INFINITY)
            .int(&[("a", "c")], 7);
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
             flashpool_g{a=\"b\"} +Inf\n\
             flashpool_g{a=\"c\"} 7\n"
        );
        check_exposition(&t);
    }

    #[test]
    fn a_histogram_has_cumulative_buckets_in_seconds() {
        let h = nvmf_target::stats::LatencyHistogram::default();
        h.record(std::time::Duration::from_micros(70));
        h.record(std::time::Duration::from_micros(300));
        h.record(std::time::Duration::from_secs(2));
        let mut p = Exposition::default();
        p.family("flashpool_lat_seconds", Kind::Histogram, "Latency.")
            .histogram(&[("volume", "v")], &h.snapshot())
            .histogram(&[("volume", "idle")], &Default::default());
        let t = p.finish();
        for line in [
            "# TYPE flashpool_lat_seconds histogram\n",
            // Go's float format, as client_golang writes `le`.
            "flashpool_lat_seconds_bucket{volume=\"v\",le=\"5e-05\"} 0\n",
            "flashpool_lat_seconds_bucket{volume=\"v\",le=\"0.0001\"} 1\n",
            "flashpool_lat_seconds_bucket{volume=\"v\",le=\"0.00025\"} 1\n",
            "flashpool_lat_seconds_bucket{volume=\"v\",le=\"0.0005\"} 2\n",
            "flashpool_lat_seconds_bucket{volume=\"v\",le=\"1\"} 2\n",
            "flashpool_lat_seconds_bucket{volume=\"v\",le=\"+Inf\"} 3\n",
            "flashpool_lat_seconds_sum{volume=\"v\"} 2.00037\n",
            "flashpool_lat_seconds_count{volume=\"v\"} 3\n",
            "flashpool_lat_seconds_bucket{volume=\"idle\",le=\"+Inf\"} 0\n",
            "flashpool_lat_seconds_count{volume=\"idle\"} 0\n",
        ] {
            assert!(t.contains(line), "{line} not in\n{t}");
        }
        assert_eq!(
            t.matches("_bucket{volume=\"v\"").count(),
            LATENCY_BOUNDS_NS.len() + 1
        );
        check_exposition(&t);
    }

    #[test]
    #[should_panic(expected = "not cumulative")]
    fn the_checker_catches_buckets_that_go_down() {
        check_exposition(
            "# HELP h_seconds H.\n# TYPE h_seconds histogram\n\
             h_seconds_bucket{le=\"1\"} 2\nh_seconds_bucket{le=\"+Inf\"} 1\n\
             h_seconds_sum 1\nh_seconds_count 1\n",
        );
    }

    #[test]
    #[should_panic(expected = "bad escape")]
    fn the_checker_catches_a_bad_label_escape() {
        check_exposition("# HELP g G.\n# TYPE g gauge\ng{a=\"x\\t\"} 1\n");
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
