#!/usr/bin/env bash
# Makes docs/grafana/dashboard.png: a node on 127.0.0.1 (file drives: a
# RAID 5 volume, a RAID 1 thin pool with a thin volume), a real Prometheus
# (Debian's `prometheus`) scraping its /metrics every second, `flashpool
# bench` load in phases (random read/write, a drive failed and replaced so
# that it rebuilds, thin writes), then docs/grafana/render.py drawing the
# dashboard's panels from Prometheus into a PNG with headless chromium.
#
#   docs/grafana/demo.sh [BIN]        # BIN: target/release/flashpool
#
# Ports 4640 (I/O), 4692 (API), 4695 (Prometheus).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-${CARGO_TARGET_DIR:-target}/release/flashpool}
RUN=$(mktemp -d /tmp/flashpool-demo.XXXXXX)
API=127.0.0.1:4692
NQN=nqn.2026-01.io.flashpool:demo
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

cat >"$RUN/node.toml" <<TOML
[node]
log = "warn"
[api]
address = "$API"
token_file = "$RUN/api-token"
[[listener]]
address = "127.0.0.1"
port = 4640
kind = "io"
TOML
for d in d0 d1 d2 spare t0 t1; do
  printf '[[drive]]\nname = "%s"\nbackend = "file"\npath = "%s"\ncreate = true\nsize = "256MiB"\n' \
    "$d" "$RUN/$d.img" >>"$RUN/node.toml"
done
cat >>"$RUN/node.toml" <<TOML
[[volume]]
name = "r5"
layout = "raid5"
drives = ["d0", "d1", "d2"]
rebuild_rate = "8MiB"
[[volume]]
name = "pool"
layout = "raid1"
drives = ["t0", "t1"]
thin_pool = true
[[volume]]
name = "thin1"
pool = "pool"
size = "1GiB"
[[subsystem]]
nqn = "$NQN"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "volume"
volume = "r5"
[[subsystem.namespace]]
nsid = 2
backend = "volume"
volume = "thin1"
TOML
"$BIN" serve -c "$RUN/node.toml" >"$RUN/node.log" 2>&1 &
PIDS+=($!)
# Every API call carries the node's token (docs/api.md, Authentication).
call() { curl -sf -H "Authorization: Bearer $(cat "$RUN/api-token")" -H 'Content-Type: application/json' "$@"; }
for _ in $(seq 1 100); do [ -s "$RUN/api-token" ] && call "http://$API/metrics" >/dev/null && break; sleep 0.2; done

cat >"$RUN/prometheus.yml" <<YML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: flashpool
    authorization:
      type: Bearer
      credentials_file: $RUN/api-token
    static_configs:
      - targets: ["$API"]
YML
prometheus --config.file="$RUN/prometheus.yml" --storage.tsdb.path="$RUN/tsdb" \
  --web.listen-address=127.0.0.1:4695 >"$RUN/prometheus.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do curl -sf http://127.0.0.1:4695/-/ready >/dev/null && break; sleep 0.2; done

T="tcp://127.0.0.1:4640/$NQN"
B="$BIN bench --bs 4k"
echo "phase 1: mixed random I/O on r5, thin writes"
$B --target "$T?nsid=1" --rw randrw --qd 16 --runtime 40s --rate-iops 4000 --size 256MiB >/dev/null &
LOAD=$!
# 1 MiB clusters: each new 4 KiB write may take one, so a trickle fills the pool gradually.
$B --target "$T?nsid=2" --rw randwrite --qd 1 --runtime 40s --rate-iops 4 --size 200MiB >/dev/null || true
wait "$LOAD" || true
echo "phase 2: d1 fails; degraded I/O"
call -X POST "http://$API/v1/drives/d1/fail" >/dev/null
$B --target "$T?nsid=1" --rw randrw --qd 16 --runtime 25s --rate-iops 3000 >/dev/null || true
echo "phase 3: d1 replaced by spare; rebuild under read load"
call -X POST "http://$API/v1/drives/d1/replace" -d '{"with": "spare"}' >/dev/null
$B --target "$T?nsid=1" --rw randread --qd 32 --runtime 40s >/dev/null || true
echo "phase 4: a scrub of r5 under light load"
call -X POST "http://$API/v1/volumes/r5/scrub" >/dev/null
$B --target "$T?nsid=1" --rw randrw --qd 8 --runtime 15s --rate-iops 2000 >/dev/null || true
sleep 3
python3 docs/grafana/render.py --prometheus http://127.0.0.1:4695 --minutes 2.5 --out docs/grafana/dashboard.png
