#!/usr/bin/env bash
# usage: [ROUNDS=3] before-after.sh BEFORE_BIN AFTER_BIN [CONFIG...]
# 4 KiB random reads at QD 1 and QD 32 on the mem namespace (nsid 1), the
# two targets interleaved round by round (3 rounds), the same client (AFTER's
# bench) for both; target on CPU 0, client on CPU 1. Prints one line per run
# (docs/bench/before-after-summary.py OUT prints medians and target CPU per I/O).
set -u
cd "$(dirname "$0")/../.."
BEFORE=$1; AFTER=$2; shift 2
CONFIGS=${*:-docs/bench/node.toml docs/bench/node-poll.toml}
NQN=nqn.2026-01.io.flashpool:bench
OUT=${OUT:-/tmp/flashpool-ba}; mkdir -p "$OUT"
T="tcp://127.0.0.1:4420/$NQN?nsid=1"
for cfg in $CONFIGS; do
  c=$(basename "$cfg" .toml)
  for round in $(seq 1 ${ROUNDS:-3}); do
    for side in before after; do
      bin=$BEFORE; [ $side = after ] && bin=$AFTER
      taskset -c 0 "$bin" serve -c "$cfg" > "$OUT/serve-$c-$side-$round.log" 2>&1 &
      spid=$!; sleep 1
      for qd in 1 32; do
        j="$OUT/$c-$side-qd$qd-r$round.json"
        taskset -c 1 "$AFTER" bench --target "$T" --rw randread --bs 4k --qd $qd --cpus 1 \
          --runtime 5s --ramp 1s -q --target-pid $spid --json "$j" > /dev/null 2>&1 || echo "FAILED $c $side qd$qd"
        python3 -c "import json; a=json.load(open('$j'))['all']; print('$c $side qd$qd r$round', round(a['iops']), 'IOPS', a['lat']['mean_us'], 'us')" 2>/dev/null || echo "$c $side qd$qd r$round (see $j)"
      done
      kill $spid; wait $spid 2>/dev/null
    done
  done
done
