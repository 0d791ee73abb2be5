"""Medians of before-after.sh runs: IOPS, mean latency, target CPU per I/O.
usage: python3 docs/bench/before-after-summary.py OUT_DIR"""
import glob
import json
import re
import statistics
import sys

rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    m = re.match(r".*/(.+)-(before|after)-qd(\d+)-r(\d+)\.json", f)
    d = json.load(open(f))
    a = d["all"]
    cpu = d["cpu"].get("target_s_per_million_ios")
    rows.setdefault((m[1], int(m[3]), m[2]), []).append((a["iops"], a["lat"]["mean_us"], cpu))
print("| config | QD | side | IOPS (median) | mean latency µs (median) | target CPU µs per I/O (median) | runs (kIOPS) |")
print("|---|---:|---|---:|---:|---:|---|")
for k in sorted(rows, key=lambda k: (k[0], k[1], k[2] != "before")):
    v = rows[k]
    med = lambda i: statistics.median(x[i] for x in v if x[i] is not None) if any(x[i] is not None for x in v) else float("nan")
    runs = ", ".join(f"{x[0] / 1000:.0f}" for x in v)
    print(f"| {k[0]} | {k[1]} | {k[2]} | {med(0) / 1000:.1f}k | {med(1):.1f} | {med(2):.2f} | {runs} |")
