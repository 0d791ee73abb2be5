#!/usr/bin/env python3
"""Renders docs/grafana/flashpool-dashboard.json's panels from a real
Prometheus, without Grafana: for each panel, each target's expr goes to
Prometheus's query_range API (variables substituted: $volume -> .*,
$__rate_interval -> --rate), the series are drawn as SVG line charts in an
HTML page laid out by the panels' gridPos, and `chromium --headless
--screenshot` turns the page into a PNG.

    python3 docs/grafana/render.py --prometheus http://127.0.0.1:9090 \
        --minutes 5 --out docs/grafana/dashboard.png

Standard library only. This is a stand-in for a Grafana screenshot (no
Grafana server is installable here); the dashboard JSON itself is for Grafana.
"""
import argparse
import html
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

COLORS = ["#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1",
          "#ba43a9", "#705da0", "#508642", "#cca300", "#447ebc", "#c15c17"]


def query_range(prom, expr, start, end, step):
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{q}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt, metric):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt) or str(metric)


def fmt_value(v, unit):
    if unit == "percentunit":
        return f"{v * 100:.0f}%"
    if unit == "s":
        for div, u in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if abs(v) >= div or u == "µs":
                return f"{v / div:.3g} {u}"
    suffix = {"Bps": "B/s", "iops": " io/s", "ops": " /s"}.get(unit, "")
    for div, u in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{u}{suffix}"
    return f"{v:.3g}{suffix}"


def chart(series, unit, start, end, w, h):
    pad_l, pad_r, pad_t, pad_b = 70, 10, 8, 22
    pw, ph = w - pad_l - pad_r, h - pad_t - pad_b
    vals = [v for _, pts in series for _, v in pts]
    lo = min(0.0, min(vals)) if vals else 0.0
    hi = max(vals) if vals else 1.0
    if hi <= lo:
        hi = lo + 1.0
    hi *= 1.08

    def xy(t, v):
        return pad_l + (t - start) / (end - start) * pw, pad_t + ph - (v - lo) / (hi - lo) * ph

    out = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">']
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        _, y = xy(start, v)
        out.append(f'<line x1="{pad_l}" x2="{w - pad_r}" y1="{y:.1f}" y2="{y:.1f}" stroke="#2c3235"/>')
        out.append(f'<text x="{pad_l - 6}" y="{y + 4:.1f}" text-anchor="end">{html.escape(fmt_value(v, unit))}</text>')
    for i in range(5):
        t = start + (end - start) * i / 4
        x, _ = xy(t, lo)
        out.append(f'<text x="{x:.1f}" y="{h - 6}" text-anchor="middle">{time.strftime("%H:%M:%S", time.localtime(t))}</text>')
    for i, (_, pts) in enumerate(series):
        if not pts:
            continue
        d = " ".join(("M" if j == 0 or pts[j][0] - pts[j - 1][0] > 5 else "L") + f"{x:.1f},{y:.1f}"
                     for j, (x, y) in enumerate(xy(t, v) for t, v in pts))
        out.append(f'<path d="{d}" fill="none" stroke="{COLORS[i % len(COLORS)]}" stroke-width="1.5"/>')
    out.append("</svg>")
    return "".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prometheus", default="http://127.0.0.1:9090")
    ap.add_argument("--dashboard", default=os.path.join(os.path.dirname(__file__), "flashpool-dashboard.json"))
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--step", default="2")
    ap.add_argument("--rate", default="10s", help="what $__rate_interval becomes")
    ap.add_argument("--out", default="dashboard.png")
    ap.add_argument("--html", help="also keep the HTML page here")
    ap.add_argument("--chromium", default="chromium")
    a = ap.parse_args()

    dash = json.load(open(a.dashboard))
    end = time.time()
    start = end - a.minutes * 60
    col_px, row_px = 1600 / 24, 34
    cells = []
    bottom = 0
    for p in dash["panels"]:
        g = p["gridPos"]
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        series = []
        for t in p.get("targets", []):
            expr = t["expr"].replace("$__rate_interval", a.rate).replace("$volume", ".*")
            for r in query_range(a.prometheus, expr, start, end, a.step):
                pts = [(float(ts), float(v)) for ts, v in r["values"] if v not in ("NaN", "+Inf", "-Inf")]
                series.append((legend(t.get("legendFormat", ""), r["metric"]), pts))
        w, h = int(g["w"] * col_px) - 8, int(g["h"] * row_px) - 8
        legend_html = "".join(
            f'<span><i style="background:{COLORS[i % len(COLORS)]}"></i>{html.escape(n)}</span>'
            for i, (n, _) in enumerate(series)) or '<span class="none">no data</span>'
        left, top = int(g["x"] * col_px) + 4, int(g["y"] * row_px) + 44
        bottom = max(bottom, top + h)
        cells.append(
            f'<div class="panel" style="left:{left}px;top:{top}px;width:{w}px;height:{h}px">'
            f'<div class="title">{html.escape(p["title"])}</div>'
            f'{chart(series, unit, start, end, w - 12, h - 62)}<div class="legend">{legend_html}</div></div>')
    page = f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ margin: 0; background: #111217; color: #ccccdc; font: 12px 'DejaVu Sans', sans-serif; }}
.head {{ position: absolute; left: 8px; top: 8px; font-size: 16px; }}
.head small {{ color: #8e8e8e; font-size: 11px; margin-left: 12px; }}
.panel {{ position: absolute; background: #181b1f; border: 1px solid #2c3235; border-radius: 3px; padding: 4px 6px; box-sizing: border-box; overflow: hidden; }}
.title {{ font-weight: bold; margin-bottom: 2px; }}
svg text {{ fill: #8e8e8e; font-size: 10px; }}
.legend span {{ margin-right: 10px; white-space: nowrap; }} .legend i {{ display: inline-block; width: 12px; height: 3px; margin-right: 4px; vertical-align: middle; }}
.none {{ color: #6e6e6e; }}
</style></head><body><div class="head">{html.escape(dash["title"])}
<small>rendered by docs/grafana/render.py from Prometheus query_range ({html.escape(a.prometheus)}), not by Grafana &middot;
{time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start))} to {time.strftime("%H:%M:%S", time.localtime(end))}</small></div>
{"".join(cells)}</body></html>"""
    with tempfile.TemporaryDirectory() as tmp:
        page_path = a.html or os.path.join(tmp, "dashboard.html")
        with open(page_path, "w") as f:
            f.write(page)
        out = os.path.abspath(a.out)
        cmd = [a.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--window-size=1600,{bottom + 8}", f"--screenshot={out}", "file://" + os.path.abspath(page_path)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, HOME=tmp))
    print(f"{out}: {len(cells)} panels")


if __name__ == "__main__":
    sys.exit(main())
