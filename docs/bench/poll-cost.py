#!/usr/bin/env python3
"""Adaptive polling against `poll_us = 0`, beside the raw loopback TCP ceiling.

    docs/bench/poll-cost.py BIN [--before OLD_BIN] [--rounds 3]
                                [--workloads r4k1,r4k32,w4k32,r128k,w128k]
                                [--ns null,mem] [--clients sleep,poll] [--polls 0,50]
                                [--ceiling] [--counts] [--out DIR]

With --before, OLD_BIN's target runs too (same client: BIN's bench), and the
table has before and after columns for each poll_us.

Each run starts a fresh node (target on CPU 0, one reactor) with a `null` or a
`mem` namespace (`mem-thick`: `thin = false`, all its RAM allocated at
start) and the given `poll_us`, and runs `flashpool bench` on CPU 1,
one connection, 5 s after a 1 s ramp. The client either sleeps between
completions (`sleep`) or busy-polls (`poll`: `--poll-us 1000000`, the way a
polling client such as SPDK's perf behaves); `poll-1pdu` and `sleep-1pdu`
also hand each PDU to the kernel in its own write (`--pdu-per-write`), and
`poll-r2t` sends all write data by R2T (`--in-capsule 0`). Target settings alternate run by
run, so drift hits both alike.

For each run it records the load average at the start and the CPU time that
other processes used during it (ticks, all of /proc), so that a run that
overlapped other work shows; a run with more than OTHER_MAX ticks of other
work is repeated once.

--counts also counts, with `perf stat` for 3 s of each run, the target's
context switches and system calls (writev, recvfrom, epoll_wait) per I/O, and
the bytes per writev.

--ceiling adds iperf3 (3 rounds, 5 s, 4 streams; server on CPU 0, client on
CPU 1) with 128 KiB and with 1 MiB writes, both directions: the upper bound
of 128 KiB I/O on this pair of cores (iperf3 3.12 itself costs more per write
than the kernel at 128 KiB, so the 1 MiB figure is the stricter ceiling).

Prints a Markdown table: median (min-max) per cell, the ratio default / poll 0,
and target CPU per I/O.
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

NQN = "nqn.2026-01.io.flashpool:pollcost"
PORT = 4660
OTHER_MAX = 60  # ticks (0.6 s of CPU at 100 Hz) of other processes during a run

WORKLOADS = {
    "r4k1": ("4 KiB random read QD 1", ["--rw", "randread", "--bs", "4k", "--qd", "1"], "lat"),
    "r4k1rate": ("4 KiB random read QD 1 at 500 IOPS", ["--rw", "randread", "--bs", "4k", "--qd", "1", "--rate-iops", "500"], "lat"),
    "r4k32": ("4 KiB random read QD 32", ["--rw", "randread", "--bs", "4k", "--qd", "32"], "iops"),
    "w4k32": ("4 KiB random write QD 32", ["--rw", "randwrite", "--bs", "4k", "--qd", "32"], "iops"),
    "r128k": ("128 KiB read QD 16", ["--rw", "read", "--bs", "128k", "--qd", "16"], "mbps"),
    "w128k": ("128 KiB write QD 16", ["--rw", "write", "--bs", "128k", "--qd", "16"], "mbps"),
}


# How the client behaves: sleeping between completions, or polling (as SPDK's
# perf does), and then one PDU per write system call, or every write by R2T.
CLIENTS = {
    "sleep": [],
    "poll": ["--poll-us", "1000000"],
    "poll-1pdu": ["--poll-us", "1000000", "--pdu-per-write"],
    "poll-r2t": ["--poll-us", "1000000", "--in-capsule", "0"],
    "sleep-1pdu": ["--pdu-per-write"],
}


# What --counts counts in the target, per second (then per I/O).
COUNTED = ["context-switches", "syscalls:sys_enter_writev", "syscalls:sys_enter_recvfrom",
           "syscalls:sys_enter_epoll_wait"]


def config(out, ns, poll):
    path = f"{out}/node-{ns}-{poll}.toml"
    with open(path, "w") as f:
        f.write(f"""[node]
reactors = 1
cpus = [0]
log = "warn"
poll_us = {poll}

[api]
enabled = false

[transport]
max_queue_depth = 128
in_capsule_data = 8192
max_h2c_data = "128KiB"

[[listener]]
address = "127.0.0.1"
port = {PORT}

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "{ns.split('-')[0]}"
size = "1GiB"{chr(10) + 'thin = false' if ns.endswith('-thick') else ''}
block_size = 4096
""")
    return path


def ticks_by_pid():
    t = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            s = open(f"/proc/{p}/stat").read()
        except OSError:
            continue
        f = s[s.rindex(")") + 2:].split()
        t[int(p)] = int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    return t


def other_ticks(before, after, mine):
    return sum(v - before.get(p, 0) for p, v in after.items() if p not in mine and v >= before.get(p, 0))


def wait_port(port):
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the node did not listen on {port}")


def one_run(a, out, w, ns, client, var, rnd):
    side, target_bin, poll = var
    name = f"{w}-{ns}-{client}-{side}-p{poll}-r{rnd}"
    try:
        socket.create_connection(("127.0.0.1", PORT), 0.1).close()
        raise SystemExit(f"something already listens on 127.0.0.1:{PORT}: stop it first")
    except OSError:
        pass
    node = subprocess.Popen(["taskset", "-c", "0", target_bin, "serve", "-c", config(out, ns, poll)],
                            stdout=open(f"{out}/serve-{name}.log", "w"), stderr=subprocess.STDOUT)
    try:
        wait_port(PORT)
        load = open("/proc/loadavg").read().split()[0]
        args = ["taskset", "-c", "1", a.bin, "bench", "--cpus", "1", "--target", f"tcp://127.0.0.1:{PORT}/{NQN}",
                *WORKLOADS[w][1], "--jobs", "1", "--runtime", "5s", "--ramp", "1s", "--size", "512MiB",
                "--target-pid", str(node.pid), "--json", f"{out}/{name}.json", "-q"]
        args += CLIENTS[client]
        before = ticks_by_pid()
        b = subprocess.Popen(args, stdout=open(f"{out}/bench-{name}.log", "w"), stderr=subprocess.STDOUT)
        counts = None
        if a.counts:
            # 3 s in the middle of the 5 s run: the target's system calls and
            # context switches (perf counts tracepoints, it samples nothing)
            time.sleep(2)
            pc = subprocess.run(["perf", "stat", "-x", ",", "-e", ",".join(COUNTED), "-p", str(node.pid),
                                 "--", "sleep", "3"], capture_output=True, text=True)
            counts = {}
            for line in pc.stderr.splitlines():
                f = line.split(",")
                if len(f) > 2 and f[0].isdigit():
                    counts[f[2].split(":")[-1]] = int(f[0]) / 3
        b.wait()
        after = ticks_by_pid()
        other = other_ticks(before, after, {node.pid, b.pid, os.getpid()})
        if b.returncode != 0:
            raise SystemExit(f"bench failed: {out}/bench-{name}.log")
        r = json.load(open(f"{out}/{name}.json"))["all"]
        return {"iops": r["iops"], "mbps": r["mb_s"], "lat": r["lat"]["mean_us"], "counts": counts,
                "cpu": json.load(open(f"{out}/{name}.json"))["cpu"].get("target_s_per_million_ios"),
                "load": load, "other": other}
    finally:
        node.terminate()
        node.wait()


def iperf(out, reverse, rnd, length):
    srv = subprocess.Popen(["taskset", "-c", "0", "iperf3", "-s", "-p", "5299", "-1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    args = ["taskset", "-c", "1", "iperf3", "-c", "127.0.0.1", "-p", "5299", "-P", "4", "-l", length,
            "-t", "5", "-O", "1", "-J"]
    if reverse:
        args.append("-R")
    res = subprocess.run(args, capture_output=True, text=True)
    srv.wait()
    open(f"{out}/iperf-{length}-{'r' if reverse else 'f'}-{rnd}.json", "w").write(res.stdout)
    j = json.loads(res.stdout)
    return j["end"]["sum_received"]["bits_per_second"] / 8e6


def med(xs):
    return statistics.median(xs), min(xs), max(xs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bin")
    p.add_argument("--before")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workloads", default="r4k1,r4k32,w4k32,r128k,w128k")
    p.add_argument("--ns", default="null,mem")
    p.add_argument("--clients", default="sleep,poll")
    p.add_argument("--polls", default="0,50")
    p.add_argument("--ceiling", action="store_true")
    p.add_argument("--counts", action="store_true", help="perf stat: system calls and context switches per I/O")
    p.add_argument("--out")
    a = p.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="poll-cost.")
    os.makedirs(out, exist_ok=True)
    polls = [int(x) for x in a.polls.split(",")]
    # (label, target binary, poll_us): before and after side by side
    variants = [("after", a.bin, p) for p in polls]
    if a.before:
        variants = [(s, b, p) for p in polls for (s, b) in (("before", a.before), ("after", a.bin))]
    res = {}
    for rnd in range(1, a.rounds + 1):
        for w in a.workloads.split(","):
            for ns in a.ns.split(","):
                for client in a.clients.split(","):
                    for var in variants:
                        r = one_run(a, out, w, ns, client, var, rnd)
                        if r["other"] > OTHER_MAX:
                            print(f"# {w} {ns} {client} {var[0]} poll {var[2]} round {rnd}: {r['other']} ticks of other work, repeated", file=sys.stderr)
                            r = one_run(a, out, w, ns, client, var, rnd)
                        res.setdefault((w, ns, client), {}).setdefault(var[0] + str(var[2]), []).append(r)
                        print(f"# {w} {ns} {client} {var[0]} poll {var[2]} r{rnd}: {r['iops']:.0f} IOPS {r['mbps']:.0f} MB/s {r['lat']:.1f} us, load {r['load']}, other {r['other']} ticks", file=sys.stderr, flush=True)
    if a.ceiling:
        for length in ("128K", "1M"):
            for rev in (False, True):
                v = [iperf(out, rev, r, length) for r in range(1, 4)]
                m = med(v)
                d = "target -> client direction (-R)" if rev else "client -> target direction"
                print(f"iperf3 -P 4 -l {length}, {d}: {m[0]:.0f} MB/s ({m[1]:.0f}-{m[2]:.0f})")
    print()
    keys = [v[0] + str(v[2]) for v in variants]
    names = [(f"{v[0]} " if a.before else "") + f"poll_us = {v[2]}" for v in variants]
    extra = "after default / before default | " if a.before else ""
    print(f"| workload | namespace | client | {' | '.join(names)} | {extra}{polls[-1]} / {polls[0]} | target CPU µs/IO ({', '.join(names)}) | other ticks (max) |")
    print("|---|---|---|" + "---|" * len(keys) + ("---|" if a.before else "") + "---|---|---|")
    for (w, ns, client), by in res.items():
        what, _, unit = WORKLOADS[w]
        cells, meds = [], {}
        for k in keys:
            m = med([r[unit] for r in by[k]])
            meds[k] = m[0]
            f = "{:.1f} µs" if unit == "lat" else ("{:.0f} MB/s" if unit == "mbps" else "{:.0f}")
            if unit == "iops":
                cells.append(f"{m[0] / 1000:.0f}k ({m[1] / 1000:.0f}-{m[2] / 1000:.0f}k)")
            else:
                cells.append(f.format(m[0]) + f" ({m[1]:.0f}-{m[2]:.0f})")
        def ratio(x, y):  # > 1: x is better
            return meds[y] / meds[x] if unit == "lat" else meds[x] / meds[y]
        d, z = f"after{polls[-1]}", f"after{polls[0]}"
        rs = (f"{ratio(d, 'before' + str(polls[-1])):.2f}x | " if a.before else "") + f"{ratio(d, z):.2f}x"
        cpu = ", ".join(f"{statistics.median([r['cpu'] or 0 for r in by[k]]):.2f}" for k in keys)
        other = max(r["other"] for k in keys for r in by[k])
        print(f"| {what} | {ns} | {client} | {' | '.join(cells)} | {rs} | {cpu} | {other} |")
    if a.counts:
        print("\nPer I/O in the target, medians (context switches, writev, recvfrom, epoll_wait; "
              "bytes per writev):\n")
        print("| workload | namespace | client | " + " | ".join(names) + " |")
        print("|---|---|---|" + "---|" * len(keys))
        for (w, ns, client), by in res.items():
            cells = []
            for k in keys:
                per = lambda ev: statistics.median([(r["counts"] or {}).get(ev, 0) / max(r["iops"], 1) for r in by[k]])
                cs, wv, rv, ep = (per(e.split(":")[-1]) for e in COUNTED)
                bpw = statistics.median([r["mbps"] * 1e6 / max((r["counts"] or {}).get("sys_enter_writev", 0), 1) for r in by[k]])
                cells.append(f"{cs:.2f} cs, {wv:.2f} wv, {rv:.2f} rv, {ep:.2f} ep; {bpw / 1024:.0f} KiB/wv")
            print(f"| {WORKLOADS[w][0]} | {ns} | {client} | " + " | ".join(cells) + " |")
    print(f"\n(runs in {out}; a ratio > 1: the first is faster, or has the lower latency)")


if __name__ == "__main__":
    main()
