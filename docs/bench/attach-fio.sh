#!/usr/bin/env bash
# fio on `flashpool attach`'s DIR/disk (O_DIRECT, libaio): mem: (FUSE alone, no fabric)
# against tcp:// to a node's RAM namespace on 127.0.0.1. 4 KiB random read and write,
# 128 KiB sequential read and write; each RUNS times (default 3) for SECONDS (default 5),
# the median printed. Root (FUSE mount).
#
#   docs/bench/attach-fio.sh                      # after cargo build --release -p flashpool
#   RUNS=5 SECONDS_EACH=10 QD=32 docs/bench/attach-fio.sh
set -euo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
# shellcheck source=tests/lib/harness.sh
. tests/lib/harness.sh
BIN=$(flashpool_bin "${BIN:-}")
RUNS=${RUNS:-3}
SECS=${SECONDS_EACH:-5}
QD=${QD:-32}
SIZE=${SIZE:-1GiB}
assign_ports IO_PORT=4660
TARGET_PORTS=$IO_PORT
NQN=nqn.2026-01.io.flashpool:attach-bench
RUN=$(mktemp -d /tmp/flashpool-attach-bench.XXXXXX)
DIR=$RUN/mnt
APID=""
QPID=""
TPID=""
cleanup_more() {
  if [ -n "$APID" ]; then kill "$APID" 2>/dev/null; wait "$APID" 2>/dev/null; fi
  grep -qs " $DIR " /proc/self/mountinfo && umount -l "$DIR"
  rm -rf "$RUN"
}
trap cleanup EXIT
command -v fio >/dev/null || { echo "fio not found: apt-get install fio"; exit 2; }
mkdir -p "$DIR"
: > "$RUN/target.log"
{
  printf '[node]\nlog = "info"\n\n[api]\nenabled = false\n'
  toml_listener "$IO_PORT" io
  toml_subsystem "$NQN" "allow_any_host = true"
  toml_namespace 1 mem "size = \"$SIZE\"" 'block_size = 512' 'thin = false'
} > "$RUN/target.toml"

attach() { # TARGET
  "$BIN" attach --single-path "$1" "$DIR" >"$RUN/attach.log" 2>&1 &
  APID=$!
  for _ in $(seq 1 100); do [ -f "$DIR/disk" ] && return 0; sleep 0.1; done
  cat "$RUN/attach.log"; return 1
}
detach() { kill "$APID"; wait "$APID"; APID=""; }
# one JOB RW BS: the job's IOPS (fio JSON)
one() {
  fio --name="$1" --filename="$DIR/disk" --direct=1 --ioengine=libaio --iodepth="$QD" \
    --rw="$2" --bs="$3" --size="$SIZE" --runtime="$SECS" --time_based --output-format=json \
    2>/dev/null | python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
r, w = j["read"], j["write"]
print(int(r["iops"] + w["iops"]), round((r["bw"] + w["bw"]) / 1024, 1))'
}
median() { sort -n | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'; }

printf '%-8s %-10s %-6s %12s %12s   %s\n' target rw bs "IOPS(med)" "MiB/s(med)" "runs (IOPS)"
for t in mem tcp; do
  if [ $t = mem ]; then attach "mem:$SIZE"; else start_target >/dev/null; attach "tcp://127.0.0.1:$IO_PORT/$NQN?nsid=1"; fi
  # fill once, so reads return stored data
  fio --name=fill --filename="$DIR/disk" --direct=1 --ioengine=libaio --iodepth=8 --rw=write \
    --bs=1M --size="$SIZE" >/dev/null 2>&1
  for c in "randread 4k" "randwrite 4k" "read 128k" "write 128k"; do
    set -- $c
    rm -f "$RUN/runs"
    for _ in $(seq 1 "$RUNS"); do one "$t-$1" "$1" "$2" >> "$RUN/runs"; done
    iops=$(cut -d' ' -f1 "$RUN/runs" | median)
    mibs=$(cut -d' ' -f2 "$RUN/runs" | median)
    printf '%-8s %-10s %-6s %12s %12s   %s\n' "$t" "$1" "$2" "$iops" "$mibs" "$(cut -d' ' -f1 "$RUN/runs" | tr '\n' ' ')"
  done
  detach
done
