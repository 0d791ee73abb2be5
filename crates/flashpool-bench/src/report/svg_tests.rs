//! Tests of the SVG charts: geometry read back from the markup, ticks, formats.

use super::*;

/// Attribute `name` of every element that starts with `start`.
fn attrs(svg: &str, start: &str, name: &str) -> Vec<f64> {
    svg.match_indices(start)
        .map(|(i, _)| {
            let rest = &svg[i..];
            let el = &rest[..rest.find('>').unwrap()];
            let k = el.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
            el[k..k + el[k..].find('"').unwrap()].parse().unwrap()
        })
        .collect()
}

fn bars() -> BarChart {
    BarChart {
        title: "IOPS by workload".into(),
        x_label: "workload".into(),
        y_label: "IOPS".into(),
        groups: vec!["4 KiB random read".into(), "4 KiB random write".into()],
        series: vec![
            BarSeries {
                name: "#1 mem:<a&b>".into(),
                values: vec![Some(100_000.0), Some(50_000.0)],
            },
            BarSeries {
                name: "#2 tcp".into(),
                values: vec![Some(25_000.0), None],
            },
        ],
        format: Format::Compact,
    }
}

#[test]
fn bar_heights_are_proportional_and_labelled() {
    let svg = bars().render();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    let h = attrs(&svg, "<rect class=\"bar\"", "height");
    let v = attrs(&svg, "<rect class=\"bar\"", "data-value");
    assert_eq!(v, vec![100_000.0, 25_000.0, 50_000.0]);
    assert_eq!(h.len(), 3);
    assert!((h[0] / h[1] - 4.0).abs() < 0.01, "{h:?}");
    assert!((h[0] / h[2] - 2.0).abs() < 0.01, "{h:?}");
    // Bars stand on one baseline: y + height is the same for all.
    let y = attrs(&svg, "<rect class=\"bar\"", "y");
    assert!((y[0] + h[0] - (y[1] + h[1])).abs() < 0.01);
    // Values on the bars, the missing one marked, axis title, groups, ticks from 0.
    for want in [
        ">100k<",
        ">50k<",
        ">25k<",
        ">n/a<",
        ">IOPS<",
        ">4 KiB random write<",
        ">0<",
    ] {
        assert!(svg.contains(want), "{want} missing");
    }
    // Two distinct colours.
    assert!(svg.contains(color(0)) && svg.contains(color(1)));
}

#[test]
fn names_are_escaped() {
    let svg = bars().render();
    assert!(svg.contains("#1 mem:&lt;a&amp;b&gt;"));
    assert!(!svg.contains("<a&b>"));
    assert_eq!(
        escape(r#"<x y="1">&'"#),
        "&lt;x y=&quot;1&quot;&gt;&amp;&#39;"
    );
}

#[test]
fn long_legend_names_are_cut_to_the_canvas() {
    let mut c = bars();
    c.series[1].name = format!("file:/{}", "x".repeat(300));
    let svg = c.render();
    let line = svg.lines().find(|l| l.contains(">file:/x")).unwrap();
    assert!(line.contains("x…</text>"), "{line}");
    let n = line.matches('x').count();
    assert!(n * 8 < WIDTH as usize && n > 80, "{n}");
}

#[test]
fn line_chart_on_log_axes() {
    let c = LineChart {
        title: "latency".into(),
        x_label: "offered load (IOPS, log scale)".into(),
        y_label: "latency (log scale)".into(),
        x_scale: Scale::Log,
        y_scale: Scale::Log,
        x_format: Format::Compact,
        y_format: Format::Micros,
        series: vec![
            LineSeries {
                name: "#1 mean".into(),
                color: 0,
                dashed: false,
                points: vec![(1e4, 10.0), (1e5, 20.0), (1e6, 400.0)],
            },
            LineSeries {
                name: "#1 p99.9".into(),
                color: 0,
                dashed: true,
                points: vec![(1e4, 50.0), (1e5, 80.0), (1e6, 2000.0), (0.0, 1.0)],
            },
        ],
    };
    let svg = c.render();
    assert_eq!(svg.matches("<polyline class=\"series\"").count(), 2);
    assert_eq!(
        svg.matches("stroke-dasharray").count(),
        2,
        "line and its legend"
    );
    // The zero x is left out on a log axis, not drawn at -infinity.
    assert!(!svg.contains("NaN") && !svg.contains("inf"));
    for want in [">10k<", ">100k<", ">1M<", ">10 µs<", ">1 ms<", ">#1 p99.9<"] {
        assert!(svg.contains(want), "{want} missing");
    }
    // Equal ratios are equal distances on a log axis.
    let i = svg.find("<polyline class=\"series\" points=\"").unwrap() + 33;
    let pts: Vec<(f64, f64)> = svg[i..i + svg[i..].find('"').unwrap()]
        .split(' ')
        .map(|p| {
            let (x, y) = p.split_once(',').unwrap();
            (x.parse().unwrap(), y.parse().unwrap())
        })
        .collect();
    assert!(
        ((pts[1].0 - pts[0].0) - (pts[2].0 - pts[1].0)).abs() < 0.2,
        "{pts:?}"
    );
}

#[test]
fn number_formats_and_ticks() {
    assert_eq!(Format::Compact.fmt(612_345.0), "612k");
    assert_eq!(Format::Compact.fmt(1_234_567.0), "1.23M");
    assert_eq!(Format::Compact.fmt(45_678.0), "45.7k");
    assert_eq!(Format::Compact.fmt(150.0), "150");
    assert_eq!(Format::Thousands.fmt(2345.6), "2,346");
    assert_eq!(Format::Thousands.fmt(12.34), "12.3");
    assert_eq!(Format::Micros.fmt(85.24), "85.2 µs");
    assert_eq!(Format::Micros.fmt(1500.0), "1.5 ms");
    assert_eq!(Format::Micros.fmt(0.125), "0.125 µs");
    assert_eq!(
        linear_ticks(0.0, 9.0, 5),
        vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    );
    assert_eq!(log_ticks(1.0, 1000.0).len(), 10);
    assert_eq!(
        log_ticks(1.0, 1e6),
        vec![1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6]
    );
    assert!(log_ticks(100.0, 130.0).len() >= 2);
}
