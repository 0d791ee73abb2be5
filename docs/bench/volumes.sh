#!/usr/bin/env bash
# Fabric numbers of the volume layouts: flashpool serve (core 0) with raid0,
# raid5 7+1 and raid6 6+2 volumes on RAM drives (docs/bench/node-volumes.toml),
# flashpool bench (core 1) over 127.0.0.1. Then degraded reads (one drive of
# each volume failed) and the rebuild speed onto a spare.
# usage: docs/bench/volumes.sh [LABEL]   results in $OUT (default /tmp/flashpool-vol)
set -u
cd "$(dirname "$0")/../.."
LABEL=${1:-vol}
BIN=${BIN:-target/release/flashpool}
NQN=nqn.2026-01.io.flashpool:bench
OUT=${OUT:-/tmp/flashpool-vol}; mkdir -p "$OUT"
API="--api 127.0.0.1:9410"
taskset -c 0 "$BIN" serve -c docs/bench/node-volumes.toml > "$OUT/serve-$LABEL.log" 2>&1 &
SPID=$!
sleep 2
run() { # name nsid args...
  local name=$1 ns=$2; shift 2
  taskset -c 1 "$BIN" bench --target "tcp://127.0.0.1:4420/$NQN?nsid=$ns" --cpus 1 --runtime 5s --ramp 1s \
    --poll-us 50 --target-pid $SPID -q --json "$OUT/$LABEL-$name.json" "$@" > "$OUT/$LABEL-$name.txt" 2>&1 \
    || echo "FAILED $LABEL $name"
}
for ns in 1 2 3 4; do
  # 128 KiB writes at QD 16 cover 7 x 64 KiB strips in ~4 commands: mostly full stripes
  run ns$ns-seqwrite128k-qd16 $ns --rw write --bs 128k --qd 16 --size 512M
  run ns$ns-seqwrite448k-qd8 $ns --rw write --bs 448k --qd 8 --size 448M
  run ns$ns-seqread128k-qd16 $ns --rw read --bs 128k --qd 16 --size 512M
  run ns$ns-randwrite4k-qd32 $ns --rw randwrite --bs 4k --qd 32 --size 512M
  run ns$ns-randread4k-qd32 $ns --rw randread --bs 4k --qd 32 --size 512M
done
# degraded: one drive of each volume failed
for v in r0 r5 r6; do [ $v = r0 ] || "$BIN" drive fail ${v}d3 $API > /dev/null; done
run ns2-degraded-seqread128k-qd16 2 --rw read --bs 128k --qd 16 --size 512M
run ns3-degraded-seqread128k-qd16 3 --rw read --bs 128k --qd 16 --size 512M
run ns2-degraded-randread4k-qd32 2 --rw randread --bs 4k --qd 32 --size 512M
run ns3-degraded-randread4k-qd32 3 --rw randread --bs 4k --qd 32 --size 512M
# rebuild speed onto the spare (no host I/O), unthrottled: the target logs
# "rebuild done in T" for each volume
for v in r5 r6; do
  "$BIN" drive replace ${v}d3 --with ${v}s0 $API > /dev/null
  "$BIN" volume rebuild-status $v --wait $API > "$OUT/$LABEL-$v-rebuild.txt"
done
grep -E "rebuilding members|rebuild done in" "$OUT/serve-$LABEL.log" | sed 's/^[^ ]* *//' | tee "$OUT/$LABEL-rebuild.txt"
kill $SPID; wait $SPID 2>/dev/null
python3 - "$OUT" "$LABEL" <<'PY'
import glob, json, os, sys
out, label = sys.argv[1], sys.argv[2]
names = {"1": "raid0 8", "2": "raid5 7+1", "3": "raid6 6+2", "4": "mem"}
rows = {}
for f in sorted(glob.glob(f"{out}/{label}-ns*.json")):
    r = json.load(open(f))["all"]
    key = os.path.basename(f)[len(label) + 1:-5]
    ns, work = key[2], key[4:]
    rows.setdefault(work, {})[ns] = r
print("| workload | " + " | ".join(names[n] for n in "1234") + " | raid5 / raid0 | raid6 / raid0 |")
print("|---|---|---|---|---|---|---|")
for work, by in rows.items():
    big = "128k" in work or "448k" in work
    val = lambda n: (by[n]["mb_s"] / 1000 if big else by[n]["iops"] / 1000) if n in by else None
    cell = lambda v: "" if v is None else (f"{v:.2f} GB/s" if big else f"{v:.0f}k IOPS")
    rat = lambda a, b: "" if val(a) is None or val(b) is None else f"{val(a) / val(b) * 100:.0f}%"
    print(f"| {work} | " + " | ".join(cell(val(n)) for n in "1234") + f" | {rat('2', '1')} | {rat('3', '1')} |")
PY
