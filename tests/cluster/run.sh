#!/usr/bin/env bash
# tests/cluster/run.sh -- several flashpool nodes on one machine, without the QEMU guest.
# Every node is a `flashpool serve` process; enclosures run in network namespaces on a
# bridge (10.77.0.0/24, see lib.sh). Needs root, iproute2 (ip, tc), python3.
#
#   tests/cluster/run.sh plumbing   what the harness itself needs, on any build: enclosures
#                                   as plain [[subsystem]] nodes in namespaces, reached from
#                                   the root namespace by `flashpool bench --verify`; kill -9
#                                   and restart on the same files, link down/up, netem loss
#                                   100% and back, clean-up of a crashed run's leftovers
#   tests/cluster/run.sh host       the interop suite's cluster scenario (lib.sh) with
#                                   `flashpool bench --verify` on the owner's loopback as the
#                                   load instead of the guest's fio (needs node identity,
#                                   drive export and remote members)
#   tests/cluster/run.sh scale      the small version of docs/bench/cluster-scale.sh (needs
#                                   etcd): 3 controllers in cluster mode, 6 enclosures x 4
#                                   drives, 4 raid1 volumes on c1; kill -9 (first and warm),
#                                   drain, SIGSTOP of c1: every volume served by a survivor
#                                   (ANA Optimized + verified write/read), 0 stale writes, and
#                                   the takeover goal relaxed for CI (the script's header);
#                                   then a cluster pool of 6 thin volumes alone (COUNTS=0
#                                   POOLS=1 THIN=6), grown by an extent through c2 first
#                                   (EXPAND=1): kill -9 and drain of c1 carry the pool with
#                                   its extent and all its namespaces (RESULT scale-pools-*)
#   tests/cluster/run.sh atrest     encryption at rest from the enclosures' side (~1 min,
#                                   atrest.sh): an encrypted raid5 thin pool on e1..e3 and an
#                                   unencrypted control on e4..e6; a plaintext canary written
#                                   and read back through `flashpool attach`; after a clean
#                                   stop, the token is in no drive file of e1..e3, in every
#                                   one of e4..e6, and e1..e3's non-zero blocks have the byte
#                                   entropy of ciphertext (ATREST_COMPRESS: extra pool flags)
#   tests/cluster/run.sh all        plumbing and host (default; scale and atrest are asked
#                                   for by name)
#
# Output: RESULT lines, then "N passed, N failed"; exit 0 only if all passed.
# Env: FLASHPOOL_BIN (default $CARGO_TARGET_DIR or target, release/flashpool),
#      FPC_DIR (default <repo>/.cache/cluster; atrest: .cache/cluster-atrest, prefix fpr,
#      net 10.96.0), OWNER_IO=14520 OWNER_DISC=18109 OWNER_API=19510
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=tests/lib/harness.sh
. "$ROOT/tests/lib/harness.sh"   # ports, binaries, abort_run
FPC_BIN=$(flashpool_bin "${FLASHPOOL_BIN:-}")
if [ "${1:-}" = atrest ]; then   # its own namespaces, bridge and state: it may run beside the others
  FPC_PREFIX=${FPC_PREFIX:-fpr}; FPC_NET=${FPC_NET:-10.96.0}; FPC_DIR=${FPC_DIR:-$ROOT/.cache/cluster-atrest}
fi
FPC_DIR=${FPC_DIR:-$ROOT/.cache/cluster}
# shellcheck source=tests/cluster/lib.sh
. "$HERE/lib.sh"
# shellcheck source=tests/cluster/atrest.sh
. "$HERE/atrest.sh"

# RESULT lines (lib.sh's fpc_result: tests/lib/harness.sh) are counted from $HR
HR=$FPC_DIR/host-results.txt
LOAD_PIDS=""
on_exit() {   # the load loops (subshells of this script) first, then the nodes and the network
  touch "$FPC_DIR/load-stop" 2> /dev/null
  [ -n "$LOAD_PIDS" ] && kill $LOAD_PIDS 2> /dev/null
  atrest_detach "$FPC_DIR/atrest/mnt" > /dev/null 2>&1   # an attach of the atrest mode
  fpc_cleanup
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# bench ARGS: flashpool bench, quiet, with a timeout; output in $FPC_DIR/bench-<tag>.txt
bench() {
  local tag=$1 s=$2; shift 2
  timeout -k 3 "$s" "$FPC_BIN" bench -q "$@" > "$FPC_DIR/bench-$tag.txt" 2>&1
}
bench_line() { grep -E 'verify|IOPS|error|Error' "$FPC_DIR/bench-$1.txt" | head -n 3 | tr '\n' ' ' | sed 's/  */ /g'; }

# ---------------------------------------------------------------- plumbing
do_plumbing() {
  local n=4 i ok d t tgt
  tgt() { echo "tcp://$(fpc_ip "$1"):$FPC_PORT/nqn.2026-01.io.flashpool:plumb:e$1:d0"; }
  fpc_say "plumbing: $n enclosures (plain subsystems) in namespaces, state in $FPC_DIR"
  mkdir -p "$FPC_DIR"
  # a crashed earlier run: its namespaces, a bridge and a process inside a namespace
  ip netns add "$(fpc_ns 9)" 2> /dev/null; ip link add "$FPC_BR" type bridge 2> /dev/null
  ip netns exec "$(fpc_ns 9)" sleep 600 & local stale=$!
  ok=FAIL; d=""
  if fpc_net_up "$n"; then
    kill -0 $stale 2> /dev/null && d="the leftover process $stale survived; " || ok=PASS
    ip netns list | grep -q "^$(fpc_ns 9)\b" && { ok=FAIL; d="${d}leftover namespace $(fpc_ns 9) survived; "; }
    d="$d$n namespaces up, each reached from $FPC_BR_IP (TCP probe)"
  else d="fpc_net_up failed"; fi
  { wait $stale; } 2> /dev/null
  fpc_result plumb-net-up $ok "$d"

  ok=PASS; d=""
  for i in $(seq 1 $n); do
    fpc_enclosure_toml "$i" "d0:file:64MiB d1:mem:64MiB" subsys > "$FPC_DIR/e$i.toml"
  done
  rm -f "$FPC_DIR"/e*-d*.img
  for i in $(seq 1 $n); do fpc_start_enclosure "$i" || { ok=FAIL; d="$d e$i did not start;"; }; done
  fpc_result plumb-serve $ok "${d:-$n flashpool serve processes, each listening on the address of its namespace}"

  ok=PASS; d=""
  for i in $(seq 1 $n); do
    if bench "w$i" 30 --target "$(tgt "$i")" --rw write --bs 128k --qd 8 --size 8MiB --verify --seed "$((100 + i))" \
        && bench "r$i" 30 --target "$(tgt "$i")" --rw read --bs 128k --qd 8 --size 8MiB --verify --seed "$((100 + i))"; then
      d="$d e$i ok;"
    else ok=FAIL; d="$d e$i: $(bench_line "w$i") $(bench_line "r$i");"; fi
  done
  # another seed must fail: the verify really checks
  if bench wrongseed 30 --target "$(tgt 1)" --rw read --bs 128k --qd 8 --size 8MiB --verify --seed 999; then
    ok=FAIL; d="$d a read with the wrong seed passed!"
  else d="$d wrong seed refused"; fi
  fpc_result plumb-io $ok "bench write+read --verify 8 MiB on each from the root namespace:$d"

  # kill -9 and restart on the same drive file: the data is still there
  ok=FAIL; d=""
  if fpc_kill e2; then
    t=$(date +%s.%N)
    if bench dead 10 --target "$(tgt 2)" --rw read --bs 4k --qd 1 --size 1MiB; then d="bench reached a killed node!"
    else
      d="killed: bench fails in $(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s ($(tail -n 1 "$FPC_DIR/bench-dead.txt" | cut -c1-80))"
      if fpc_start_enclosure 2 && bench r2b 30 --target "$(tgt 2)" --rw read --bs 128k --qd 8 --size 8MiB --verify --seed 102; then
        ok=PASS; d="$d; restarted on the same file: 8 MiB read back verified"
      else d="$d; after the restart: $(bench_line r2b)"; fi
    fi
  else d="e2 was not running"; fi
  fpc_result plumb-kill-restart $ok "$d"

  # link down: unreachable (the connect hangs: no RST); up: reachable again
  ok=FAIL
  fpc_link_down 3
  if bench down 6 --target "$(tgt 3)" --rw read --bs 4k --qd 1 --size 1MiB; then d="reached over a link that is down!"
  else
    d="down: bench fails (exit $?)"
    fpc_link_up 3
    if fpc_wait_reach 3 10 && bench up 20 --target "$(tgt 3)" --rw read --bs 128k --qd 8 --size 8MiB --verify --seed 103; then
      ok=PASS; d="$d; up again: verified read"
    else d="$d; up again: $(bench_line up)"; fi
  fi
  fpc_link_up 3
  fpc_result plumb-link-down-up $ok "ip link set $(fpc_veth 3) down/up: $d"

  # netem loss 100%: a silent partition; in-flight connection stalls, then recovers
  ok=FAIL
  bench long 60 --target "$(tgt 4)" --rw randrw --bs 4k --qd 4 --size 8MiB --verify --seed 104 --runtime 12s &
  local bpid=$!
  sleep 3; fpc_loss_on 4; local tl; tl=$(date +%s)
  if bench loss 6 --target "$(tgt 4)" --rw read --bs 4k --qd 1 --size 1MiB; then d="connected through 100% loss!"
  else
    d="loss 100%: a new connection fails"
    sleep 1; fpc_loss_off 4
    wait $bpid; local brc=$?
    d="$d; a bench running across the $(($(date +%s) - tl)) s partition: exit $brc ($(bench_line long))"
    if fpc_wait_reach 4 10 && bench after 20 --target "$(tgt 4)" --rw read --bs 128k --qd 8 --size 8MiB --verify --seed 104; then
      ok=PASS; d="$d; cleared: verified read"
    else d="$d; cleared: $(bench_line after)"; fi
  fi
  fpc_loss_off 4; wait $bpid 2> /dev/null
  fpc_result plumb-netem-loss $ok "$FPC_LOSS_HOW: $d"

  # clean-up: nothing of ours left
  fpc_cleanup
  ok=PASS; d=""
  [ "$(ip netns list | grep -c "^$FPC_PREFIX-")" = 0 ] || { ok=FAIL; d="$d namespaces left;"; }
  ip link show "$FPC_BR" > /dev/null 2>&1 && { ok=FAIL; d="$d bridge left;"; }
  ip -o link show | grep -q "$FPC_PREFIX-v" && { ok=FAIL; d="$d veths left;"; }
  for i in $(seq 1 $n); do [ -e "$(fpc_pidf "e$i")" ] && { ok=FAIL; d="$d pid file e$i left;"; }; done
  fpc_result plumb-cleanup $ok "${d:-no namespace, veth, bridge or process of ours left}"
}

# ---------------------------------------------------------------- host (the scenario)
do_host() {
  local io disc api nqn=nqn.2026-01.io.flashpool:cluster s seed=$((RANDOM + 1)) ok d
  assign_ports OWNER_IO=14520 OWNER_DISC=18109 OWNER_API=19510
  io=$OWNER_IO; disc=$OWNER_DISC; api=$OWNER_API
  fpc_say "host scenario: owner io :$io api :$api, state in $FPC_DIR"
  if ! fpc_scenario_up "$io" "$disc" "$api" "$nqn"; then
    for s in $FPC_STEPS; do fpc_result "cluster-$s" FAIL "no cluster"; done
    fpc_result cluster-load-r6 FAIL "no cluster"; fpc_result cluster-load-ec FAIL "no cluster"
    fpc_scenario_down; return
  fi
  # the load: bench randrw --verify on both namespaces, rounds of 5 s until the steps end
  rm -f "$FPC_DIR/load-stop"
  load() {   # NSID TAG
    local r=0 f=0 n=0
    while [ ! -e "$FPC_DIR/load-stop" ]; do
      n=$((n + 1))
      if ! bench "$2" 90 --target "tcp://127.0.0.1:$io/$nqn?nsid=$1" --rw randrw --bs 16k --qd 8 --size 32MiB \
          --verify --seed "$seed" --runtime 5s; then
        f=$((f + 1)); [ $f -le 3 ] && cp "$FPC_DIR/bench-$2.txt" "$FPC_DIR/bench-$2-fail-$f.txt"
        sleep 1   # a volume that fails at once must not spin
      fi
    done
    echo "$n $f" > "$FPC_DIR/load-$2.count"
  }
  # stamp the whole region first: a run with --seed checks every block it reads
  for s in 1 2; do
    bench "prefill-$s" 120 --target "tcp://127.0.0.1:$io/$nqn?nsid=$s" --rw write --bs 128k --qd 8 --size 32MiB \
        --verify --seed "$seed" || fpc_say "prefill of nsid $s failed: $(bench_line "prefill-$s")"
  done
  load 1 r6 & local l1=$!
  load 2 ec & local l2=$!
  LOAD_PIDS="$l1 $l2"
  sleep 3
  for s in $FPC_STEPS; do fpc_scenario_step "$s"; sleep 2; done
  touch "$FPC_DIR/load-stop"; wait $l1 $l2; LOAD_PIDS=""
  for s in r6:1 ec:2; do
    set -- $(cat "$FPC_DIR/load-${s%:*}.count" 2> /dev/null || echo 0 -1)
    ok=FAIL; [ "$1" -ge 1 ] && [ "$2" = 0 ] && ok=PASS
    d="$1 rounds of bench randrw 16k --verify, $2 failed"
    [ "$2" = 0 ] || d="$d: $(tail -n 3 "$FPC_DIR/bench-${s%:*}-fail-1.txt" 2> /dev/null | tr '\n' ' ')"
    # a full verified read of what was written
    if bench "final-${s%:*}" 120 --target "tcp://127.0.0.1:$io/$nqn?nsid=${s#*:}" --rw read --bs 128k --qd 8 \
        --size 32MiB --verify --seed "$seed"; then d="$d; final read of 32 MiB verified"
    else ok=FAIL; d="$d; final read: $(bench_line "final-${s%:*}")"; fi
    fpc_result "cluster-load-${s%:*}" $ok "$d"
  done
  fpc_scenario_down
}

# ---------------------------------------------------------------- scale (small)
do_scale() {
  local out=$FPC_DIR/scale
  if ! command -v etcd > /dev/null; then
    fpc_result scale-setup FAIL "no etcd (apt-get install etcd-server etcd-client)"; return
  fi
  fpc_say "scale: docs/bench/cluster-scale.sh, CHECK=1 COUNTS=4 ENCL=6 DRIVES=4, state in $out"
  # SLACK 0.8 s: on the shared 2-vCPU CI machine (load 10-18) the 4 volumes of one wave
  # spread over up to 0.55 s; the check still fails a stalled volume (4 s connect timeouts)
  # or a lost one, not a fine regression (the bench's table is for that)
  CHECK=1 SLACK=${SCALE_SLACK:-0.8} COUNTS=${SCALE_COUNTS:-4} ENCL=6 DRIVES=4 DRIVE_SIZE=32MiB WARM=1 AFTER=1 \
    CASES="kill-cold kill-warm drain sigstop" BIN=$FPC_BIN OUT=$out \
    timeout 600 "$ROOT/docs/bench/cluster-scale.sh" > "$FPC_DIR/scale.txt" 2>&1
  local rc=$?
  grep '^RESULT ' "$FPC_DIR/scale.txt" | tee -a "$HR"
  grep -q '^RESULT ' "$FPC_DIR/scale.txt" \
    || fpc_result scale-run FAIL "docs/bench/cluster-scale.sh exit $rc: $(tail -n 3 "$FPC_DIR/scale.txt" | tr '\n' ' ')"
  sed -n '/^| N | case | served/,/^$/p' "$FPC_DIR/scale.txt"
  # cluster pools: one pool (raid1 on the drives the volumes left free) of 6 thin volumes in
  # its one ANA group; a kill (takeover) and a drain (planned move) must carry all 6
  # and grown by an extent first (EXPAND=1), which every takeover and move must carry
  fpc_say "scale: docs/bench/cluster-scale.sh, CHECK=1 COUNTS=0 POOLS=1 THIN=6 EXPAND=1, state in $out-pools"
  CHECK=1 SLACK=${SCALE_SLACK:-0.8} COUNTS=0 POOLS=1 EXPAND=1 THIN=${SCALE_THIN:-6} ENCL=6 DRIVES=4 DRIVE_SIZE=32MiB WARM=1 AFTER=1 \
    CASES="kill-cold drain" BIN=$FPC_BIN OUT=$out-pools \
    timeout 600 "$ROOT/docs/bench/cluster-scale.sh" > "$FPC_DIR/scale-pools.txt" 2>&1
  rc=$?
  grep '^RESULT ' "$FPC_DIR/scale-pools.txt" | tee -a "$HR"
  grep -q '^RESULT ' "$FPC_DIR/scale-pools.txt" \
    || fpc_result scale-pools-run FAIL "docs/bench/cluster-scale.sh POOLS=1 exit $rc: $(tail -n 3 "$FPC_DIR/scale-pools.txt" | tr '\n' ' ')"
  sed -n '/^| N | case | served/,/^$/p' "$FPC_DIR/scale-pools.txt"
}

ACTION=${1:-all}
[ -x "$FPC_BIN" ] || abort_run 1 "no flashpool binary at $FPC_BIN (cargo build --release, or set FLASHPOOL_BIN)"
fpc_preflight || abort_run 1 "cannot run: $FPC_WHY"
command -v python3 > /dev/null || abort_run 1 "needs python3"
mkdir -p "$FPC_DIR"; : > "$HR"
case $ACTION in
  plumbing) do_plumbing;;
  host) do_host;;
  scale) do_scale;;
  atrest) do_atrest;;
  all) do_plumbing; do_host;;
  *) echo "usage: $0 [plumbing|host|scale|atrest|all]"; exit 2;;
esac
np=$(grep -c '^RESULT [^ ]* PASS' "$HR" || true)
nf=$(grep -c '^RESULT [^ ]* FAIL' "$HR" || true)
echo "$np passed, $nf failed"
[ "$nf" = 0 ]
