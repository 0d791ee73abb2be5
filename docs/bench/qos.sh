#!/usr/bin/env bash
# Per-volume QoS (docs/performance.md, "Per-volume QoS"): how close the
# measured rate comes to a limit, and what an unlimited namespace on the
# same node loses.
#
#   docs/bench/qos.sh BIN [BASELINE_BIN]
#
# A node with two RAM drives and one reactor; volume `lim` (nsid 1) takes
# the limits, volume `free` (nsid 2) none. Every bench line is the median
# of 3 rounds of 10 s after a 1 s ramp (the ramp spends the idle burst).
#  1. accuracy: 500 and 2000 IOPS (4 KiB random read QD 32; 2000 also
#     random write), 20 MB/s (128 KiB sequential read and write QD 8);
#  2. the neighbour: nsid 2 (4 KiB random read QD 32) alone, beside nsid 1
#     paced by the client at 2000 IOPS (no limit), and beside nsid 1 held
#     by QoS at 2000 IOPS (QD 32, so 30 commands are held all the time);
#     three times, interleaved;
#  3. with BASELINE_BIN (a build without QoS): nsid 2 alone on each build,
#     alternating, twice.
set -uo pipefail
F=$(realpath "$1"); BASE=${2:+$(realpath "$2")}
DIR=$(mktemp -d /tmp/qos-bench.XXXXXX) || { echo "mktemp failed (is the disk full?)" >&2; exit 1; }
cd "$DIR"
N=nqn.2026-01.io.flashpool:qos; PORT=${PORT:-4460}; APIP=${APIP:-9700}
cat > node.toml <<TOML
[node]
reactors = 1
log = "warn"
poll_us = 0
state_dir = "$DIR/state"
[api]
address = "127.0.0.1:$APIP"
[[listener]]
address = "127.0.0.1"
port = $PORT
kind = "io"
[[subsystem]]
nqn = "$N"
serial = "QOS1"
model = "flashpool"
allow_any_host = true
[[drive]]
name = "d0"
backend = "mem"
size = "512MiB"
[[drive]]
name = "d1"
backend = "mem"
size = "512MiB"
TOML
export FLASHPOOL_API=127.0.0.1:$APIP FLASHPOOL_TOKEN_FILE=$DIR/state/api-token
B="bench --runtime 10s --ramp 1s --rounds 3 -q"
T1="tcp://127.0.0.1:$PORT/$N?nsid=1"; T2="tcp://127.0.0.1:$PORT/$N?nsid=2"
line() { grep -E "^  (read|write) |rounds"; }
start() { # $1: binary; $2: also make `lim`
  rm -rf state; "$1" serve -c node.toml > serve.log 2>&1 & SERVE=$!; sleep 2
  [ -n "${2:-}" ] && "$1" volume create lim --layout concat --drives d0 --export $N --nsid 1 >/dev/null
  "$1" volume create free --layout concat --drives d1 --export $N --nsid 2 >/dev/null
}
stop() { kill $SERVE; wait $SERVE 2>/dev/null; sleep 1; }
beside() { # $1: nsid 1's bench options; nsid 2 measured meanwhile
  ( $F bench --target $T1 --rw randread --bs 4k --qd 32 --runtime 40s -q $1 | line | sed 's/^/   [nsid 1] /' ) &
  local b=$!; sleep 0.5; $F $B --target $T2 --rw randread --bs 4k --qd 32 | line; wait $b
}
start $F lim
echo "== 500 IOPS, 4k randread qd32"; $F volume qos lim --iops 500; $F $B --target $T1 --rw randread --bs 4k --qd 32 | line
echo "== 2000 IOPS, 4k randread qd32"; $F volume qos lim --iops 2000; $F $B --target $T1 --rw randread --bs 4k --qd 32 | line
echo "== 2000 IOPS, 4k randwrite qd32"; $F $B --target $T1 --rw randwrite --bs 4k --qd 32 | line
echo "== 20 MB/s, 128k read qd8"; $F volume qos lim --clear --bandwidth 20000000; $F $B --target $T1 --rw read --bs 128k --qd 8 | line
echo "== 20 MB/s, 128k write qd8"; $F $B --target $T1 --rw write --bs 128k --qd 8 | line
for i in 1 2 3; do
  echo "== nsid 2 alone ($i)"; $F $B --target $T2 --rw randread --bs 4k --qd 32 | line
  $F volume qos lim --clear >/dev/null
  echo "== nsid 2 beside nsid 1 paced by the client at 2000 IOPS, no limit ($i)"; beside "--rate-iops 2000"
  $F volume qos lim --iops 2000 >/dev/null
  echo "== nsid 2 beside nsid 1 held by QoS at 2000 IOPS ($i)"; beside ""
done
$F volume qos lim
stop
if [ -n "$BASE" ]; then
  for i in 1 2; do for bin in $BASE $F; do
    start $bin
    echo "== nsid 2 alone, $bin ($i)"; $bin $B --target $T2 --rw randread --bs 4k --qd 32 | line
    stop
  done; done
fi
