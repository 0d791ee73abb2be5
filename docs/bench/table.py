#!/usr/bin/env python3
import glob, json, os, statistics, sys
R = os.environ.get("OUT", "/tmp/flashpool-perf")
def runs(name):
    fs = glob.glob(f"{R}/{name}.json") + glob.glob(f"{R}/{name}-[0-9].json")
    return [json.load(open(f)) for f in fs]
ROWS = [
    ("4 KiB random read, QD 1: mean / p99 latency", "randread4k-qd1", "lat"),
    ("4 KiB random read, QD 32", "randread4k-qd32", "iops"),
    ("4 KiB random read, QD 128", "randread4k-qd128", "iops"),
    ("4 KiB random write, QD 32", "randwrite4k-qd32", "iops"),
    ("128 KiB sequential read, QD 16", "seqread128k-qd16", "gbs"),
    ("128 KiB sequential write, QD 16", "seqwrite128k-qd16", "gbs"),
]
def med(xs): return statistics.median(xs) if xs else None
def get(rs, kind):
    if not rs: return None
    if kind == "lat":
        return (med([r["all"]["lat"]["mean_us"] for r in rs]), med([r["all"]["lat"]["p99_us"] for r in rs]))
    if kind == "iops": return med([r["all"]["iops"] for r in rs])
    return med([r["all"]["mb_s"] for r in rs])
def fmt(v, kind):
    if v is None: return "n/a"
    if kind == "lat": return f"{v[0]:.1f} / {v[1]:.1f} µs" if v[0] >= 1 else f"{v[0]:.2f} / {v[1]:.2f} µs"
    if kind == "iops": return f"{v/1000:,.0f}k IOPS"
    return f"{v/1000:.2f} GB/s"
def ratio(f, i, kind):
    if f is None or i is None: return "n/a"
    if kind == "lat": return f"{f[0]:.0f}× the latency"
    return f"{f / i * 100:.0f}%"
def cpu(rs):
    if not rs: return "n/a"
    t = med([r["cpu"]["target_s_per_million_ios"] for r in rs if r["cpu"]["target_s_per_million_ios"] is not None])
    b = med([r["cpu"]["bench_s_per_million_ios"] for r in rs])
    return (f"{t:.1f}" if t is not None else "–") + f" / {b:.1f}"
for arg in sys.argv[1:]:
    label, title = arg.split("=", 1)
    print(f"\n{title}\n")
    print("| Workload | fabric, `mem` ns | fabric, `null` ns | in-process `mem:` | fabric `mem` ÷ in-process | CPU s per 10^6 I/Os, target / bench (`mem` ns) |")
    print("|---|---:|---:|---:|---:|---:|")
    for t, name, kind in ROWS:
        m, n, i = runs(f"{label}-ns1-{name}"), runs(f"{label}-ns2-{name}"), runs(f"inproc-{name}")
        print(f"| {t} | {fmt(get(m, kind), kind)} | {fmt(get(n, kind), kind)} | {fmt(get(i, kind), kind)} | {ratio(get(m, kind), get(i, kind), kind)} | {cpu(m)} |")
# spreads for the notes
for arg in sys.argv[1:]:
    label = arg.split("=", 1)[0]
    for _, name, kind in ROWS:
        for ns in (1, 2):
            rs = runs(f"{label}-ns{ns}-{name}")
            if kind == "lat":
                v = sorted(round(r["all"]["lat"]["mean_us"], 1) for r in rs)
            elif kind == "iops":
                v = sorted(round(r["all"]["iops"] / 1000) for r in rs)
            else:
                v = sorted(round(r["all"]["mb_s"] / 1000, 2) for r in rs)
            print(f"<!-- {label} ns{ns} {name}: {v} -->")
