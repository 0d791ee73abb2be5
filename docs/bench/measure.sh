#!/usr/bin/env bash
# usage: measure.sh CONFIG LABEL [bench extra args...]
set -u
cd "$(dirname "$0")/../.."
CFG=$1; LABEL=$2; shift 2
BIN=${BIN:-target/release/flashpool}
NQN=nqn.2026-01.io.flashpool:bench
OUT=${OUT:-/tmp/flashpool-perf}; mkdir -p $OUT
taskset -c 0 $BIN serve -c "$CFG" > $OUT/serve-$LABEL.log 2>&1 &
SPID=$!
sleep 1
run() { # name target args...
  local name=$1 tgt=$2; shift 2
  taskset -c 1 $BIN bench --target "$tgt" --cpus 1 --runtime 5s --ramp 1s -q --json $OUT/$LABEL-$name.json "$@" > $OUT/$LABEL-$name.txt 2>&1 || echo "FAILED $LABEL $name"
}
for ns in 1 2; do
  T="tcp://127.0.0.1:4420/$NQN?nsid=$ns"
  P="--target-pid $SPID"
  run ns$ns-seqwrite128k-qd16 "$T" --rw write --bs 128k --qd 16 $P "$@"
  run ns$ns-seqread128k-qd16  "$T" --rw read  --bs 128k --qd 16 $P "$@"
  run ns$ns-randwrite4k-qd32  "$T" --rw randwrite --bs 4k --qd 32 $P "$@"
  run ns$ns-randread4k-qd1    "$T" --rw randread --bs 4k --qd 1 $P "$@"
  run ns$ns-randread4k-qd32   "$T" --rw randread --bs 4k --qd 32 $P "$@"
  run ns$ns-randread4k-qd128  "$T" --rw randread --bs 4k --qd 128 $P "$@"
done
# idle CPU of the target over 10 s
a=$(awk '{print $14+$15}' /proc/$SPID/stat); sleep 10; b=$(awk '{print $14+$15}' /proc/$SPID/stat)
echo "idle ticks over 10s: $((b-a)) (CLK_TCK $(getconf CLK_TCK))" > $OUT/$LABEL-idle.txt
kill $SPID; wait $SPID 2>/dev/null
