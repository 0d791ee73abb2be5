#!/usr/bin/env python3
"""docs/bench/apps.sh's numbers: parsing one run, and the report.

  apps-report.py parse KIND OUTPUT.txt RUN.cpu CONFIG ROUND NAME   -> one JSON line
  apps-report.py report OUT BIN     -> OUT/table.md, OUT/spec.json, and
                                       `BIN bench --render OUT/spec.json OUT/report`

KIND: rocksdb (db_bench --histogram=1), sysbench (oltp_read_write), fio (JSON), failover
(db_bench with its per-second report file). RUN.cpu is apps.sh's run_timed line: app CPU s,
serving (attach + nodes) CPU s, attach CPU s, machine busy fraction, wall s, exit status.
Medians over rounds; ratios are configuration / baseline of the medians.
"""
import json, os, re, statistics, subprocess, sys

CONFIGS = ["local", "mem", "tcp", "raid6"]
LABEL = {"local": "(1) local file", "mem": "(2) attach mem: (FUSE, no fabric)",
         "tcp": "(3) attach tcp (1 node, RAM)", "raid6": "(4) attach tcp, raid6 on 6 enclosures"}


def hist(text, what):
    m = re.search(r"Microseconds per %s:\s*\nCount: (\d+) Average: ([\d.]+).*?\n.*?\n"
                  r"Percentiles: P50: ([\d.]+) P75: ([\d.]+) P99: ([\d.]+) P99\.9: ([\d.]+)" % what, text)
    if not m:
        return None
    n, avg, p50, _, p99, p999 = (float(x) for x in m.groups())
    return {"count": int(n), "avg_us": avg, "p50_us": p50, "p99_us": p99, "p999_us": p999}


def parse(kind, txt, cpu, config, rnd, name):
    text = open(txt, errors="replace").read()
    c = open(cpu).read().split()
    app, serving, attach, busy, wall, rc = (float(x) for x in c)
    r = {"kind": kind, "config": config, "round": int(rnd), "name": name, "rc": int(rc),
         "app_cpu_s": app, "serving_cpu_s": serving, "attach_cpu_s": attach,
         "machine_busy": busy, "wall_s": wall}
    if kind in ("rocksdb", "failover"):
        m = re.search(r"readrandomwriterandom\s*:\s*([\d.]+) micros/op (\d+) ops/sec ([\d.]+) seconds (\d+) operations", text)
        if m:
            r["ops_s"] = float(m.group(2)); r["ops"] = int(m.group(4)); r["secs"] = float(m.group(3))
        pct = re.search(r"--readwritepercent=(\d+)", name) or re.match(r"db(\d+)-", name)
        r["workload"] = f"db{pct.group(1)}" if pct else "db80"
        r["read"], r["write"] = hist(text, "read"), hist(text, "write")
        if r["read"] and r["write"]:
            n = r["read"]["count"] + r["write"]["count"]
            r["avg_us"] = (r["read"]["avg_us"] * r["read"]["count"] + r["write"]["avg_us"] * r["write"]["count"]) / n
        csv = txt[:-4] + ".csv"
        if os.path.exists(csv):
            r["timeline"] = [[float(a), float(b)] for a, b in
                             (l.strip().split(",")[:2] for l in open(csv).readlines()[1:] if "," in l)]
    elif kind == "sysbench":
        r["workload"] = "oltp"
        m = re.search(r"transactions:\s+(\d+)\s+\(([\d.]+) per sec", text)
        if m:
            r["tps"] = float(m.group(2)); r["ops"] = int(m.group(1))
        m = re.search(r"95th percentile:\s+([\d.]+)", text)
        r["p95_ms"] = float(m.group(1)) if m else None
        m = re.search(r"avg:\s+([\d.]+)", text)
        r["avg_ms"] = float(m.group(1)) if m else None
        m = re.search(r"ignored errors:\s+(\d+)", text)
        r["errors"] = int(m.group(1)) if m else None
    elif kind == "fio":
        j = json.loads(text[text.index("{"):])["jobs"][0]
        rw = j["read"] if j["read"]["io_bytes"] else j["write"]
        r["workload"] = "fio-" + j["jobname"]
        r["iops"] = rw["iops"]; r["mb_s"] = rw["bw_bytes"] / 1e6; r["ops"] = rw["total_ios"]
        r["lat_avg_us"] = rw["clat_ns"]["mean"] / 1e3
        r["lat_p99_us"] = rw["clat_ns"]["percentile"].get("99.000000", 0) / 1e3
    ops = r.get("ops") or 0
    if ops:
        # host: the application and the attach (FUSE + the NVMe/TCP host); storage: the nodes
        r["host_cpu_us_op"] = (app + attach) / ops * 1e6
        r["node_cpu_us_op"] = (serving - attach) / ops * 1e6
    print(json.dumps(r))


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def f(v, d=0, unit=""):
    if v is None:
        return "n/a"
    return f"{v:,.{d}f}{unit}"


def ratio(a, b):
    return None if a is None or not b else a / b


def rs(v):
    return "n/a" if v is None else f"{v:.2f}×"


def busy_list(v):
    """'7.36 8.20 8.05; rustc 110.0%, ...': the load and the named processes (an entry with
    no name is a line of top's header that an older apps.sh let through)."""
    load, _, procs = v.partition(";")
    named = [p.strip() for p in procs.split(",") if p.strip() and not p.strip()[0].isdigit()]
    return load.strip() + (", busy: " + ", ".join(named) if named else "")


def report(out, binary):
    rows = [json.loads(l) for l in open(f"{out}/results.jsonl") if l.strip()]
    cond = dict(l.rstrip("\n").split(" ", 1) for l in open(f"{out}/conditions.txt") if " " in l)
    configs = [c for c in CONFIGS if any(r["config"] == c for r in rows if r["kind"] != "failover")]

    def runs(kind, wl, c):
        return [r for r in rows if r["kind"] == kind and r.get("workload") == wl and r["config"] == c]

    def m(kind, wl, c, key):
        return med([key(r) if callable(key) else r.get(key) for r in runs(kind, wl, c)])

    def spread(kind, wl, c, key, d=0):
        v = sorted(r.get(key) or 0 for r in runs(kind, wl, c))
        return "/".join(f"{x:.{d}f}" for x in v)

    md, sections, goals = [], [], []
    # ---- RocksDB
    for wl, title in (("db80", "RocksDB db_bench readrandomwriterandom, 80% reads (seed 002)"),
                      ("db50", "RocksDB db_bench readrandomwriterandom, 50% reads (YCSB-A-like)")):
        if not any(runs("rocksdb", wl, c) for c in configs):
            continue
        head = ["configuration", "ops/s", "÷ local", "÷ mem:", "avg latency", "read p99", "read p99.9",
                "write p99", "host CPU µs/op", "node CPU µs/op", "runs (ops/s)"]
        t = []
        base = {k: m("rocksdb", wl, "local", k) for k in ("ops_s",)}
        memv = m("rocksdb", wl, "mem", "ops_s")
        for c in configs:
            ops = m("rocksdb", wl, c, "ops_s")
            t.append([LABEL[c], f(ops), rs(ratio(ops, base["ops_s"])), rs(ratio(ops, memv)),
                      f(m("rocksdb", wl, c, "avg_us"), 0, " µs"),
                      f(m("rocksdb", wl, c, lambda r: (r["read"] or {}).get("p99_us")), 0, " µs"),
                      f(m("rocksdb", wl, c, lambda r: (r["read"] or {}).get("p999_us")), 0, " µs"),
                      f(m("rocksdb", wl, c, lambda r: (r["write"] or {}).get("p99_us")), 0, " µs"),
                      f(m("rocksdb", wl, c, "host_cpu_us_op"), 1), f(m("rocksdb", wl, c, "node_cpu_us_op"), 1),
                      spread("rocksdb", wl, c, "ops_s")])
        sections.append({"heading": title, "table": {"head": head, "rows": t}, "charts": [], "text": []})
    # ---- MariaDB
    if any(runs("sysbench", "oltp", c) for c in configs):
        head = ["configuration", "transactions/s", "÷ local", "÷ mem:", "avg latency", "p95 latency",
                "host CPU µs/txn", "node CPU µs/txn", "errors", "runs (tps)"]
        b, mm = m("sysbench", "oltp", "local", "tps"), m("sysbench", "oltp", "mem", "tps")
        t = [[LABEL[c], f(m("sysbench", "oltp", c, "tps"), 1), rs(ratio(m("sysbench", "oltp", c, "tps"), b)),
              rs(ratio(m("sysbench", "oltp", c, "tps"), mm)), f(m("sysbench", "oltp", c, "avg_ms"), 2, " ms"),
              f(m("sysbench", "oltp", c, "p95_ms"), 2, " ms"), f(m("sysbench", "oltp", c, "host_cpu_us_op"), 0),
              f(m("sysbench", "oltp", c, "node_cpu_us_op"), 0),
              f(sum((r.get("errors") or 0) for r in runs("sysbench", "oltp", c))),
              spread("sysbench", "oltp", c, "tps", 1)] for c in configs]
        sections.append({"heading": "MariaDB 10.11 + sysbench oltp_read_write (4 tables × 50,000 rows, 4 threads)",
                         "table": {"head": head, "rows": t}, "charts": [], "text": []})
    # ---- fio
    fios = [("fio-randread", "4 KiB random read", "iops"), ("fio-randwrite", "4 KiB random write", "iops"),
            ("fio-read", "128 KiB sequential read", "mb_s")]
    short = {"fio-randread": "fio 4k rand. read", "fio-randwrite": "fio 4k rand. write", "fio-read": "fio 128k seq. read"}
    if any(runs("fio", w, c) for w, _, _ in fios for c in configs):
        head = ["workload (ext4 file, QD 32)"] + [LABEL[c] for c in configs] + ["tcp ÷ mem:", "mem: ÷ local"]
        t = []
        for w, lab, k in fios:
            vals = {c: m("fio", w, c, k) for c in configs}
            unit = " IOPS" if k == "iops" else " MB/s"
            t.append([lab] + [f(vals[c], 0, unit) for c in configs]
                     + [rs(ratio(vals.get("tcp"), vals.get("mem"))), rs(ratio(vals.get("mem"), vals.get("local")))])
        sections.append({"heading": "fio on the mounted ext4 (orientation)", "table": {"head": head, "rows": t},
                         "charts": [], "text": []})
    # ---- charts of the comparisons
    groups, series = [], {c: [] for c in configs}
    for wl, lab in (("db80", "RocksDB 80/20"), ("db50", "RocksDB 50/50")):
        b = m("rocksdb", wl, "local", "ops_s")
        if b:
            groups.append(lab)
            for c in configs:
                series[c].append(ratio(m("rocksdb", wl, c, "ops_s"), b))
    b = m("sysbench", "oltp", "local", "tps")
    if b:
        groups.append("MariaDB tps")
        for c in configs:
            series[c].append(ratio(m("sysbench", "oltp", c, "tps"), b))
    for w, lab, k in fios:
        b = m("fio", w, "local", k)
        if b:
            groups.append(short[w])
            for c in configs:
                series[c].append(ratio(m("fio", w, c, k), b))
    charts = []
    if groups:
        charts.append({"stem": "throughput", "title": "Throughput as a share of local", "x_label": "workload",
                       "y_label": "throughput ÷ local (1 = as fast as the local file)", "format": "thousands",
                       "caption": "Medians of the rounds, each configuration's throughput over the local file's; higher is better.",
                       "groups": groups, "bars": [{"name": LABEL[c], "values": series[c]} for c in configs]})
    lg, ls = [], {c: [] for c in configs}
    for wl, lab in (("db80", "RocksDB 80/20 read p99"), ("db50", "RocksDB 50/50 read p99")):
        if m("rocksdb", wl, "local", lambda r: (r["read"] or {}).get("p99_us")):
            lg.append(lab)
            for c in configs:
                ls[c].append(m("rocksdb", wl, c, lambda r: (r["read"] or {}).get("p99_us")))
    if m("sysbench", "oltp", "local", "p95_ms"):
        lg.append("MariaDB p95")
        for c in configs:
            v = m("sysbench", "oltp", c, "p95_ms")
            ls[c].append(v * 1000 if v is not None else None)
    if lg:
        charts.append({"stem": "latency", "title": "Tail latency", "x_label": "workload", "y_label": "latency",
                       "format": "micros", "caption": "Medians of the rounds; lower is better.",
                       "groups": lg, "bars": [{"name": LABEL[c], "values": ls[c]} for c in configs]})
    # ---- seeds beside ours
    def rr(kind, wl, key, a, b):
        return ratio(m(kind, wl, a, key), m(kind, wl, b, key))
    p99 = lambda r: (r["read"] or {}).get("p99_us")
    p999 = lambda r: (r["read"] or {}).get("p999_us")
    w99 = lambda r: (r["write"] or {}).get("p99_us")
    seed_rows = [
        ["RocksDB 80/20 throughput", "seed 002", "0.98×", rs(rr("rocksdb", "db80", "ops_s", "tcp", "local")),
         rs(rr("rocksdb", "db80", "ops_s", "tcp", "mem")), rs(rr("rocksdb", "db80", "ops_s", "raid6", "local"))],
        ["RocksDB 80/20 average latency", "seed 002: 507 → 568 µs", "1.12×", rs(rr("rocksdb", "db80", "avg_us", "tcp", "local")),
         rs(rr("rocksdb", "db80", "avg_us", "tcp", "mem")), rs(rr("rocksdb", "db80", "avg_us", "raid6", "local"))],
        ["RocksDB 80/20 p99 latency", "seed 002: 3.6 → 3.7 ms", "1.03×", rs(rr("rocksdb", "db80", p99, "tcp", "local")),
         rs(rr("rocksdb", "db80", p99, "tcp", "mem")), rs(rr("rocksdb", "db80", p99, "raid6", "local"))],
        ["RocksDB 80/20 host CPU per op", "seed 002: +10%", "1.10×", rs(rr("rocksdb", "db80", "host_cpu_us_op", "tcp", "local")),
         rs(rr("rocksdb", "db80", "host_cpu_us_op", "tcp", "mem")), rs(rr("rocksdb", "db80", "host_cpu_us_op", "raid6", "local"))],
        ["MySQL/MariaDB sysbench throughput", "seed 002", "0.98×", rs(rr("sysbench", "oltp", "tps", "tcp", "local")),
         rs(rr("sysbench", "oltp", "tps", "tcp", "mem")), rs(rr("sysbench", "oltp", "tps", "raid6", "local"))],
        ["MySQL/MariaDB sysbench tail latency", "seed 002: p99 +2% (ours: p95)", "1.02×", rs(rr("sysbench", "oltp", "p95_ms", "tcp", "local")),
         rs(rr("sysbench", "oltp", "p95_ms", "tcp", "mem")), rs(rr("sysbench", "oltp", "p95_ms", "raid6", "local"))],
        ["YCSB-A read tail (Cassandra; ours RocksDB 50/50 read p99.9)", "seed 001: 28.9 → 40.7 ms p99.9", "1.41×",
         rs(rr("rocksdb", "db50", p999, "tcp", "local")), rs(rr("rocksdb", "db50", p999, "tcp", "mem")),
         rs(rr("rocksdb", "db50", p999, "raid6", "local"))],
        ["YCSB-A update tail (ours: write p99)", "seed 001: 42 → 43 ms p99.9", "1.02×",
         rs(rr("rocksdb", "db50", w99, "tcp", "local")), rs(rr("rocksdb", "db50", w99, "tcp", "mem")),
         rs(rr("rocksdb", "db50", w99, "raid6", "local"))],
        ["MongoDB YCSB", "seed 000", "\"minimum difference\"", "", "", ""],
    ]
    sections.insert(0, {"heading": "The seeds' figures beside ours (ratios remote ÷ local)", "text": [
        "The seeds measured real drives behind a real network; ours are RAM drives on two shared cores, "
        "so only ratios compare. (3) ÷ (1) is the seeds' comparison; (3) ÷ (2) takes FUSE out."],
        "table": {"head": ["measure", "seed", "seed ratio", "ours (3) ÷ (1)", "ours (3) ÷ (2)", "ours (4) ÷ (1)"],
                  "rows": seed_rows}, "charts": charts})
    # ---- goals
    def goal(what, v, ok):
        goals.append([what, rs(v) if isinstance(v, float) else (v or "n/a"),
                      "n/a" if v is None else ("met" if ok else "NOT met")])
    v = rr("rocksdb", "db80", "ops_s", "tcp", "mem"); goal("RocksDB 80/20 throughput (3) ÷ (2) ≥ 0.95×", v, v is not None and v >= 0.95)
    v = rr("rocksdb", "db80", p99, "tcp", "mem"); goal("RocksDB 80/20 read p99 (3) ÷ (2) ≤ 1.15×", v, v is not None and v <= 1.15)
    v = rr("sysbench", "oltp", "tps", "tcp", "mem"); goal("MariaDB tps (3) ÷ (2) ≥ 0.9×", v, v is not None and v >= 0.9)
    v = rr("rocksdb", "db80", "ops_s", "raid6", "mem"); goal("RocksDB 80/20 raid6 (4) ÷ (2) ≥ 0.8×", v, v is not None and v >= 0.8)
    v = rr("sysbench", "oltp", "tps", "raid6", "mem"); goal("MariaDB tps raid6 (4) ÷ (2) ≥ 0.8×", v, v is not None and v >= 0.8)
    fo = [r for r in rows if r["kind"] == "failover"]
    if fo:
        r = fo[0]
        probe = json.load(open(f"{out}/run/probe.json")) if os.path.exists(f"{out}/run/probe.json") else {}
        ev = json.load(open(f"{out}/run/fo.events.json")) if os.path.exists(f"{out}/run/fo.events.json") else {}
        tl = r.get("timeline") or []
        # the first seconds warm the block cache (direct reads): the steady rate is the median
        # after them; each event's dip is its worst second from 1 s before it (the script's
        # clock starts while db_bench opens the database, before db_bench's) to 4 s after
        steady = med([q for t, q in tl if t > 3]) or 0
        dips = {}
        for k in ("move_at_s", "kill_at_s"):
            if k in ev and steady:
                w = [q for t, q in tl if ev[k] - 1 <= t <= ev[k] + 4]
                dips[k] = (min(w) / steady) if w else None
        goal("through failover: db_bench exit status 0 (0 application errors)", "exit %d" % r["rc"], r["rc"] == 0)
        gap = probe.get("longest_gap_s")
        gap_at = ""
        if probe.get("gap_from") and os.path.exists(f"{out}/run/fo.t0"):
            gap_at = f", from {probe['gap_from'] - float(open(f'{out}/run/fo.t0').read()):.1f} s on the script's clock"
        goal("through failover: longest stall ≤ 1.5 s (4 KiB O_DIRECT write probe every 10 ms)",
             None if gap is None else f"{gap:.2f} s", gap is not None and gap <= 1.5)
        lines = [{"name": "db_bench 80/20 on (4), ops/s each second", "points": tl}]
        top = max([q for _, q in tl] or [1])
        for k, lab in (("move_at_s", "volume move (planned)"), ("kill_at_s", "kill -9 of the owner")):
            if k in ev:
                lines.append({"name": f"{lab} at {ev[k]:.0f} s", "dashed": True, "points": [[ev[k], 0], [ev[k], top]]})
        sections.append({"heading": "Through failover: RocksDB 80/20 on (4) while its owner moves, then is killed", "text": [
            f"Owners: {ev.get('owners', '?')}. db_bench exit status {r['rc']}; {r.get('ops_s') or 0:,.0f} ops/s over the run "
            f"({steady:,.0f} ops/s median per second after the first 3 s, which warm the block cache). "
            f"Worst second after the move: {rs(dips.get('move_at_s'))} of that median; after the kill: {rs(dips.get('kill_at_s'))}. "
            f"Probe: {probe.get('writes', 0)} writes, {len(probe.get('errors', []))} errors, longest gap between two "
            f"completions {gap} s{gap_at}."],
            "charts": [{"stem": "failover", "title": "RocksDB 80/20 through a planned move and a kill -9 of the owner",
                        "x_label": "seconds since db_bench started", "y_label": "operations per second",
                        "format": "compact", "caption": "db_bench --report_interval_seconds=1 on configuration (4); "
                        "dashed: when the volume was moved and when its owner was killed, on the script's clock, "
                        "which starts up to a second before db_bench's (it opens the database first).", "lines": lines}]})
    sections.insert(1, {"heading": "Goals", "table": {"head": ["goal", "measured", ""], "right": [False, True, False],
                                                       "rows": goals}, "text": []})
    intro = [f"docs/bench/apps.sh, {cond.get('date', '?')}, commit {cond.get('commit', '?')}, kernel {cond.get('kernel', '?')}, "
             f"{cond.get('nproc', '?')} CPUs shared with other work. Load at the start: {cond.get('uptime', '?').split('load average:')[-1].strip()}; "
             f"at the end: {cond.get('uptime-end', '?').split('load average:')[-1].strip()}. "
             + "".join(f"At the start of phase {k[5:]}: load {busy_list(v)}. " for k, v in cond.items() if k.startswith("load-"))
             + ("(Processes over 5% of a CPU there; flashpool, db_bench, mariadbd and sysbench are this run's.) "
                if any(k.startswith("load-") for k in cond) else "")
             + f"Medians of {max([r['round'] for r in rows] or [0])} rounds, the configurations in a rotated order each round. "
             "Each configuration is ext4 on a loop device with direct I/O: (1) over a file on tmpfs, (2) over "
             "`flashpool attach mem:`, (3) over `flashpool attach` of one node's RAM namespace on 127.0.0.1, "
             "(4) over `flashpool attach` (multipath) of a raid6 volume of a cluster: 6 enclosures with one RAM drive "
             "each, 3 controllers, etcd. Host CPU per op: the application and the attach process; node CPU: the nodes."]
    spec = {"title": "Applications on flashpool volumes, side by side with local", "intro": intro, "sections": sections}
    json.dump(spec, open(f"{out}/spec.json", "w"), indent=1)
    with open(f"{out}/table.md", "w") as fh:
        for s in sections:
            fh.write(f"#### {s['heading']}\n\n")
            for p in s.get("text", []):
                fh.write(p + "\n\n")
            if s.get("table"):
                t = s["table"]
                fh.write("| " + " | ".join(t["head"]) + " |\n|" + "|".join(
                    ["---:" if i else ":---" for i in range(len(t["head"]))]) + "|\n")
                for row in t["rows"]:
                    fh.write("| " + " | ".join(x.replace("|", "\\|") for x in row) + " |\n")
                fh.write("\n")
    print(open(f"{out}/table.md").read())
    subprocess.run([binary, "bench", "--render", f"{out}/spec.json", f"{out}/report"], check=True)


if __name__ == "__main__":
    if sys.argv[1] == "parse":
        parse(*sys.argv[2:8])
    elif sys.argv[1] == "report":
        report(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
