#!/usr/bin/env bash
# The I/O path cost of metrics: 4 KiB random read, QD 32, one connection,
# through NVMe/TCP on 127.0.0.1, against two builds of `flashpool serve`
# run alternately (A B A B A B), each on a fresh node: A = before metrics,
# B = with metrics. Two namespaces: nsid 1 a RAM namespace (the target's
# per-command counters and latency histogram), nsid 2 a RAID 5 volume on
# three RAM drives (those, plus the volume's metered drives).
#
#   docs/bench/metrics-cost.sh BIN_A BIN_B [ROUNDS]     # prints a table of medians
#   BENCH=BIN docs/bench/metrics-cost.sh ...             # one client binary for both
#
# The target runs on CPU 0, the bench on CPU 1 (taskset), as docs/performance.md.
# Besides IOPS and latency, the target's CPU time per I/O (--target-pid: user +
# system from /proc/PID/stat), which other load on the machine disturbs less.
set -euo pipefail
A=$1; B=$2; ROUNDS=${3:-3}
OUT=$(mktemp -d /tmp/metrics-cost.XXXXXX)
PORT=${PORT:-4630}
NQN=nqn.2026-01.io.flashpool:cost
cat >"$OUT/node.toml" <<TOML
[node]
reactors = 1
cpus = [0]
log = "warn"
poll_us = 0

[api]
enabled = false

[[listener]]
address = "127.0.0.1"
port = $PORT
kind = "io"

[[drive]]
name = "m0"
backend = "mem"
size = "512MiB"
[[drive]]
name = "m1"
backend = "mem"
size = "512MiB"
[[drive]]
name = "m2"
backend = "mem"
size = "512MiB"

[[volume]]
name = "r5"
layout = "raid5"
drives = ["m0", "m1", "m2"]

[[subsystem]]
nqn = "$NQN"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = "mem"
size = "1GiB"
block_size = 4096

[[subsystem.namespace]]
nsid = 2
backend = "volume"
volume = "r5"
TOML
run() { # label bin nsid round
  taskset -c 0 "$2" serve -c "$OUT/node.toml" >"$OUT/serve-$1-$3-$4.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
  taskset -c 1 "${BENCH:-$2}" bench --cpus 1 --target "tcp://127.0.0.1:$PORT/$NQN?nsid=$3" --rw randread --bs 4k \
    --qd 32 --jobs 1 --runtime 5s --ramp 1s --size 256MiB --target-pid "$pid" --json "$OUT/$1-$3-$4.json" >/dev/null 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
for r in $(seq 1 "$ROUNDS"); do
  for ns in 1 2; do
    run A "$A" "$ns" "$r"
    run B "$B" "$ns" "$r"
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys, glob
out, rounds = sys.argv[1], int(sys.argv[2])
print("| namespace | A IOPS (runs) | B IOPS (runs) | A p50 / p99 µs | B p50 / p99 µs | B vs A (median IOPS) | target CPU µs per I/O, A / B (runs) |")
print("|---|---|---|---|---|---|---|")
for ns, what in ((1, "RAM namespace"), (2, "RAID 5 volume on 3 RAM drives")):
    row = {}
    for lab in "AB":
        runs = [json.load(open(f"{out}/{lab}-{ns}-{r}.json")) for r in range(1, rounds + 1)]
        iops = [r["all"]["iops"] for r in runs]
        p50 = statistics.median(r["all"]["lat"]["p50_us"] for r in runs)
        p99 = statistics.median(r["all"]["lat"]["p99_us"] for r in runs)
        cpu = [r["cpu"]["target_s_per_million_ios"] for r in runs]
        row[lab] = (statistics.median(iops), iops, p50, p99, statistics.median(cpu), cpu)
    a, b = row["A"], row["B"]
    fmt = lambda x: ", ".join(f"{v/1000:.1f}k" for v in x)
    cpus = lambda x: ", ".join(f"{v:.2f}" for v in x)
    print(f"| {what} | {a[0]/1000:.1f}k ({fmt(a[1])}) | {b[0]/1000:.1f}k ({fmt(b[1])}) | {a[2]:.0f} / {a[3]:.0f} | {b[2]:.0f} / {b[3]:.0f} | {100*(b[0]/a[0]-1):+.1f}% | {a[4]:.2f} / {b[4]:.2f} ({cpus(a[5])} / {cpus(b[5])}) |")
PY
echo "(runs in $OUT)"
