#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/flashpool}; OUT=${OUT:-/tmp/flashpool-perf}; mkdir -p $OUT
run() { local name=$1; shift; taskset -c 1 $BIN bench --target mem:1G --cpus 1 --runtime 5s --ramp 1s -q --json $OUT/inproc-$name.json "$@" > $OUT/inproc-$name.txt 2>&1 || echo "FAILED $name"; }
run seqwrite128k-qd16 --rw write --bs 128k --qd 16
run seqread128k-qd16  --rw read  --bs 128k --qd 16
run randwrite4k-qd32  --rw randwrite --bs 4k --qd 32
run randread4k-qd1    --rw randread --bs 4k --qd 1
run randread4k-qd32   --rw randread --bs 4k --qd 32
run randread4k-qd128  --rw randread --bs 4k --qd 128
