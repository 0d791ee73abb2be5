#!/usr/bin/env python3
"""4 KiB random read QD 32 against 1, 2, ... reactors: does the target scale per core?

    docs/bench/reactors.py BIN [--reactors 1,2] [--target-cpus 0,1] [--bench-cpus 1|0-1]
                               [--rounds 3] [--ns null] [--client poll|sleep]

For R reactors the node runs on the first R of --target-cpus (reactor i
pinned to the i-th), and the bench opens 2 R connections (jobs), which the
node hands to its reactors in turn, on --bench-cpus. Each figure is the
median of --rounds runs (`flashpool bench --rounds`), with the target's CPU
time per I/O: if that stays flat as reactors are added, IOPS grows with the
cores given to the target. On a 2-core machine the second reactor shares
its core with the bench, so only the CPU per I/O speaks for scaling there.
"""

import argparse
import json
import os
import socket
import subprocess
import tempfile
import time

NQN = "nqn.2026-01.io.flashpool:reactors"
PORT = 4670


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bin")
    p.add_argument("--reactors", default="1,2")
    p.add_argument("--target-cpus", default="0,1")
    p.add_argument("--bench-cpus", default=None, help="default: the CPUs the node does not use, else all")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ns", default="null")
    p.add_argument("--client", default="poll")
    a = p.parse_args()
    out = tempfile.mkdtemp(prefix="reactors.")
    cpus = a.target_cpus.split(",")
    print("| reactors | target CPUs | bench CPUs | connections | IOPS, median (rounds) | spread | target CPU µs per I/O | other work (cores, max) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in (int(x) for x in a.reactors.split(",")):
        tc = cpus[:r]
        bc = a.bench_cpus or ",".join(c for c in cpus if c not in tc) or ",".join(cpus)
        cfg = f"{out}/node-{r}.toml"
        open(cfg, "w").write(f"""[node]
reactors = {r}
cpus = [{", ".join(tc)}]
log = "warn"

[api]
enabled = false

[[listener]]
address = "127.0.0.1"
port = {PORT}

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "{a.ns}"
size = "1GiB"
block_size = 4096
""")
        node = subprocess.Popen(["taskset", "-c", ",".join(tc), a.bin, "serve", "-c", cfg],
                                stdout=open(f"{out}/serve-{r}.log", "w"), stderr=subprocess.STDOUT)
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", PORT), 0.1).close()
                    break
                except OSError:
                    time.sleep(0.1)
            js = f"{out}/r{r}.json"
            args = [a.bin, "bench", "--target", f"tcp://127.0.0.1:{PORT}/{NQN}", "--rw", "randread", "--bs", "4k",
                    "--qd", "32", "--jobs", str(2 * r), "--cpus", bc, "--runtime", "5s", "--ramp", "1s",
                    "--size", "512MiB", "--rounds", str(a.rounds), "--target-pid", str(node.pid), "--json", js, "-q"]
            if a.client == "poll":
                args += ["--poll-us", "1000000"]
            subprocess.run(args, check=True, stdout=open(f"{out}/bench-{r}.log", "w"), stderr=subprocess.STDOUT)
        finally:
            node.terminate()
            node.wait()
        j = json.load(open(js))
        rounds = j["rounds"]["rounds"]
        iops = ", ".join(f"{x['iops'] / 1000:.0f}k" for x in rounds)
        other = max((x["other_cores"] or 0) for x in rounds)
        print(f"| {r} | {','.join(tc)} | {bc} | {2 * r} | {j['all']['iops'] / 1000:.0f}k ({iops}) | "
              f"{j['rounds']['spread_pct']:.0f}% | {j['cpu']['target_s_per_million_ios']:.2f} | {other:.2f} |")
    print(f"\n(runs in {out})")


if __name__ == "__main__":
    main()
