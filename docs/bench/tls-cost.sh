#!/usr/bin/env bash
# The cost of TLS 1.3 (TP 8011) against plain NVMe/TCP, side by side on one
# build: a fresh node per run with a `null` namespace (only the transport
# costs) on two listeners, one plain and one TLS-only; the same bench client
# connects to each in turn
# (plain, TLS, plain, TLS, ...), as a host without a key and a host with a
# PSK (TLS_AES_128_GCM_SHA256; with HASH=2, a SHA-384 key and
# TLS_AES_256_GCM_SHA384).
#
#   docs/bench/tls-cost.sh BIN [ROUNDS]        # prints a table of medians
#   WORKLOADS="r4k" docs/bench/tls-cost.sh ...  # a subset of r4k r128k w128k
#
# Workloads: 4 KiB random read QD 32, 128 KiB sequential read and write QD 16,
# one connection. Target on CPU 0, bench on CPU 1 (taskset), as
# docs/performance.md; the target's CPU time per I/O from --target-pid. The
# load average at the start of each run is recorded beside it.
set -euo pipefail
BIN=$1; ROUNDS=${2:-3}; HASH=${HASH:-1}
OUT=$(mktemp -d /tmp/tls-cost.XXXXXX)
PORT=${PORT:-4640}
NQN=nqn.2026-01.io.flashpool:tlscost
HP=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000c0a1
HT=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000c0a2
python3 - "$OUT/host.psk" "$HASH" <<'PY'
import base64, os, sys, zlib
n = 32 if sys.argv[2] == "1" else 48
k = os.urandom(n)
open(sys.argv[1], "w").write("NVMeTLSkey-1:0%s:%s:\n" % (sys.argv[2], base64.b64encode(k + zlib.crc32(k).to_bytes(4, "little")).decode()))
PY
chmod 600 "$OUT/host.psk"
cat >"$OUT/node.toml" <<TOML
[node]
reactors = 1
cpus = [0]
log = "warn"

[api]
enabled = false

[[listener]]
address = "127.0.0.1"
port = $PORT
[[listener]]
address = "127.0.0.1"
port = $((PORT + 1))
tls = "required"

[[subsystem]]
nqn = "$NQN"
hosts = ["$HP"]
[[subsystem.host]]
nqn = "$HT"
tls_key_file = "$OUT/host.psk"
[[subsystem.namespace]]
nsid = 1
backend = "null"
size = "1GiB"
block_size = 4096
TOML
run() { # label workload round
  local port=$PORT args=(--hostnqn "$HP")
  [ "$1" = tls ] && { port=$((PORT + 1)); args=(--hostnqn "$HT" --tls-key-file "$OUT/host.psk"); }
  taskset -c 0 "$BIN" serve -c "$OUT/node.toml" >"$OUT/serve-$1-$2-$3.log" 2>&1 &
  local pid=$!
  PID=$pid
  trap 'kill "$PID" 2>/dev/null || true' EXIT
  for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$((PORT + 1))) 2>/dev/null && break; sleep 0.1; done
  local w
  case $2 in
    r4k) w=(--rw randread --bs 4k --qd 32) ;;
    r128k) w=(--rw read --bs 128k --qd 16) ;;
    w128k) w=(--rw write --bs 128k --qd 16) ;;
  esac
  cut -d' ' -f1 /proc/loadavg >"$OUT/$1-$2-$3.load"
  taskset -c 1 "$BIN" bench --cpus 1 --target "tcp://127.0.0.1:$port/$NQN" "${w[@]}" "${args[@]}" \
    --jobs 1 --runtime 5s --ramp 1s --size 512MiB --target-pid "$pid" \
    --json "$OUT/$1-$2-$3.json" >"$OUT/bench-$1-$2-$3.log" 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
for r in $(seq 1 "$ROUNDS"); do
  for w in ${WORKLOADS:-r4k r128k w128k}; do
    run plain "$w" "$r"
    run tls "$w" "$r"
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print("| workload | plain (runs) | TLS (runs) | TLS / plain | p50 µs plain / TLS | target CPU µs per I/O plain / TLS | load at start (plain; TLS) |")
print("|---|---|---|---|---|---|---|")
import os
for w, what, unit in (("r4k", "4 KiB random read QD 32", "iops"), ("r128k", "128 KiB read QD 16", "mbps"), ("w128k", "128 KiB write QD 16", "mbps")):
    if not os.path.exists(f"{out}/plain-{w}-1.json"):
        continue
    row = {}
    for lab in ("plain", "tls"):
        runs = [json.load(open(f"{out}/{lab}-{w}-{r}.json")) for r in range(1, rounds + 1)]
        loads = [open(f"{out}/{lab}-{w}-{r}.load").read().strip() for r in range(1, rounds + 1)]
        if unit == "iops":
            v = [r["all"]["iops"] / 1000 for r in runs]; fmt = "{:.1f}k"
        else:
            v = [r["all"]["mb_s"] for r in runs]; fmt = "{:.0f} MB/s"
        p50 = statistics.median(r["all"]["lat"]["p50_us"] for r in runs)
        cpu = statistics.median(r["cpu"]["target_s_per_million_ios"] for r in runs)
        row[lab] = (statistics.median(v), v, fmt, p50, cpu, loads)
    p, t = row["plain"], row["tls"]
    show = lambda x: x[2].format(x[0]) + " (" + ", ".join(x[2].format(y) for y in x[1]) + ")"
    print(f"| {what} | {show(p)} | {show(t)} | {t[0]/p[0]:.2f}x | {p[3]:.0f} / {t[3]:.0f} | {p[4]:.2f} / {t[4]:.2f} | {' '.join(p[5])}; {' '.join(t[5])} |")
PY
echo "(runs in $OUT)"
