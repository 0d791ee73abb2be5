#!/usr/bin/env bash
# What a volume made of remote drives costs (measurement, not CI). Enclosure nodes in
# network namespaces (tests/cluster/lib.sh: bridge 10.77.0.1/24, enclosure i at
# 10.77.0.(10+i)) each export one RAM drive d0 over NVMe/TCP; an owner node in the root
# namespace builds volumes from them and serves each on its loopback. flashpool bench
# (128 KiB sequential write, QD 16, medians of ROUNDS rounds) loads:
#   (a) each raw remote drive alone, and all of them at once (the raw aggregate)
#   (b) raid0 across the N drives
#   (c) raid5 across them (N-1 + 1)
#   (d) raid6 and ec(N-2)+2 across them
# every volume printed as a share of raid0 and of the raw aggregate. Then 4 KiB random
# read IOPS (QD 32) of a RR_LAYOUT volume on the remote drives against the same layout on
# RAM drives local to the owner, and the CPU each 4 KiB read costs: one hop (the bench
# reads e1:d0 straight from its enclosure; that enclosure's CPU) against two (the volume
# through the owner; the owner's CPU plus every enclosure's).
#
# usage (root): docs/bench/cluster-raid.sh          results and logs in $OUT
# env: NODES=6 (4..9)  DRIVE_SIZE=512MiB  ROUNDS=3  RUNTIME=5s  RAMP=1s  RR_LAYOUT=raid6
#      BIN (default $CARGO_TARGET_DIR or target, release/flashpool)  OUT=/tmp/flashpool-cluster
#      OWNER_IO=14620 OWNER_API=19610  REACTORS=1 (per enclosure)  OWNER_REACTORS=2
#      POLL_US (every node's [node] poll_us; default: the node's default)
#      PERF=record|syscalls: perf record -g of the owner during each volume's first random-read
#      round ($OUT/VOLUME-rr.perf), or its syscalls counted ($OUT/VOLUME-rr.syscalls)
# Needs node identity ([node] name), drive export (export = true) and remote members
# ([[peer]], peer:drive names): see tests/cluster/lib.sh for the TOMLs it writes.
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
NODES=${NODES:-6}
DRIVE_SIZE=${DRIVE_SIZE:-512MiB}
ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-5s}
RAMP=${RAMP:-1s}
RR_LAYOUT=${RR_LAYOUT:-raid6}
# STRIP: per-member strip of the volumes (default: the volume default, 64KiB); BS: the
# sequential write size (default 128k). STRIP=32KiB with NODES=5 (raid5 4+1) or NODES=6
# (raid6/ec 4+2) makes every 128 KiB write one full stripe.
STRIP=${STRIP:-}
# LAYOUTS: which volumes of (b)-(d) to run (default all: raid0 raid5 raid6 ec); RAW=0 skips
# (a), LOCAL_RR=0 the random reads on local drives. The shares need raid0 (and the raw
# rows) in the same run.
LAYOUTS=${LAYOUTS:-raid0 raid5 raid6 ec}; RAW=${RAW:-1}; LOCAL_RR=${LOCAL_RR:-1}
OUT=${OUT:-/tmp/flashpool-cluster}
FPC_BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/flashpool}
case $FPC_BIN in /*) ;; *) FPC_BIN=$ROOT/$FPC_BIN;; esac
FPC_DIR=$OUT/nodes
FPC_PREFIX=fpb                   # its own namespaces and bridge: runs beside the test suite's
FPC_REACTORS=${REACTORS:-1}
FPC_OWNER_REACTORS=${OWNER_REACTORS:-2}
FPC_POLL_US=${POLL_US:-}
. tests/cluster/lib.sh
# (the bench's bridge must not carry the test suite's 10.77.0.1 at the same time)
NQN=nqn.2026-01.io.flashpool:bench-cluster
OWNER_NQN=$FPC_NODE_NQN:owner
IO=${OWNER_IO:-14620}; DISC=$((IO + 1)); API=${OWNER_API:-19610}
[ -x "$FPC_BIN" ] || { echo "no flashpool binary at $FPC_BIN (cargo build --release, or set BIN)"; exit 1; }
fpc_preflight || { echo "cannot run: $FPC_WHY"; exit 1; }
[ "$NODES" -ge 4 ] && [ "$NODES" -le 9 ] || { echo "NODES must be 4..9"; exit 2; }
ip -o addr show | grep -v " $FPC_BR " | grep -q " $FPC_NET\." \
  && { echo "10.77.0.0/24 is in use here (a cluster test running? its bridge is fpcbr0)"; exit 1; }
mkdir -p "$OUT" "$FPC_DIR"
rm -f "$OUT"/*.json "$OUT"/*.txt
trap 'fpc_cleanup' EXIT
trap 'exit 130' INT TERM

say() { echo "[$(date +%T)] $*"; }
# bench NAME TARGET [ARGS]: one run, JSON in $OUT/NAME.json
bench() {
  local name=$1 tgt=$2; shift 2
  timeout 300 "$FPC_BIN" bench --target "$tgt" -q --json "$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1 \
    || { echo "FAILED $name: $(tail -n 2 "$OUT/$name.txt" | tr '\n' ' ')"; return 1; }
}
SEQ="--rw write --bs ${BS:-128k} --qd 16 --runtime $RUNTIME --ramp $RAMP"
RR="--rw randread --bs 4k --qd 32 --runtime $RUNTIME --ramp $RAMP"
# secs DURATION: 1s, 500ms or 2 as seconds (for sleep; RAMP in s or ms)
secs() { case $1 in *ms) awk -v v="${1%ms}" 'BEGIN { print v / 1000 }';; *s) echo "${1%s}";; *) echo "$1";; esac; }
# ticks PID,PID...: utime+stime of each, one per line
ticks() { local p; for p in ${1//,/ }; do awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$p/stat"; done; }
cli() { timeout 600 "$FPC_BIN" "$@" --api "127.0.0.1:$API" $(fpc_auth); }
drives() { local p=$1 i l=""; for i in $(seq 1 "$NODES"); do l="$l,$(printf "$p" "$i")"; done; echo "${l#,}"; }

# ---- nodes
say "$NODES enclosures (one $DRIVE_SIZE RAM drive d0 each, exported) + owner on 127.0.0.1:$IO; results in $OUT"
fpc_net_up "$NODES" || { echo "network set-up failed"; exit 1; }
for i in $(seq 1 "$NODES"); do
  fpc_enclosure_toml "$i" "d0:mem:$DRIVE_SIZE" > "$FPC_DIR/e$i.toml"
  fpc_start_enclosure "$i" || exit 1
done
fpc_owner_toml owner "$IO" "$DISC" "$API" "$NQN" "$NODES" > "$FPC_DIR/owner.toml"
for i in $(seq 1 "$NODES"); do printf '\n[[drive]]\nname = "l%s"\nbackend = "mem"\nsize = "%s"\n' "$i" "$DRIVE_SIZE"; done >> "$FPC_DIR/owner.toml"
fpc_start_node owner "127.0.0.1:$IO" || exit 1
OPID=$(fpc_pid_of owner)
EPIDS=$(for i in $(seq 1 "$NODES"); do fpc_pid_of "e$i"; done | paste -sd,)

# ---- (a) raw remote drives: each alone, then all at once (the owner's host NQN: allowed)
raw() { echo "tcp://$(fpc_ip "$1"):$FPC_PORT/$FPC_DRIVE_NQN:e$1:d0?nsid=1"; }
for r in $(seq 1 "$ROUNDS"); do
  [ "$RAW" = 1 ] || break
  for i in $(seq 1 "$NODES"); do bench "raw-e$i-r$r" "$(raw "$i")" $SEQ --hostnqn "$OWNER_NQN"; done
  pids=""
  for i in $(seq 1 "$NODES"); do bench "rawall-e$i-r$r" "$(raw "$i")" $SEQ --hostnqn "$OWNER_NQN" & pids="$pids $!"; done
  wait $pids
  say "raw round $r done"
done
# one hop: 4 KiB random reads of e1:d0 straight from its enclosure, written whole first
if [ "$RAW" = 1 ]; then
  bench "raw-e1-prefill" "$(raw 1)" --rw write --bs 128k --qd 16 --size "$DRIVE_SIZE" --hostnqn "$OWNER_NQN"
  for r in $(seq 1 "$ROUNDS"); do bench "raw-e1-rr-r$r" "$(raw 1)" $RR --hostnqn "$OWNER_NQN" --target-pid "$(fpc_pid_of e1)"; done
fi

# ---- (b)-(d) volumes on the same drives, one at a time; (e) random reads, remote vs local
N=$NODES
vol() {   # NAME LAYOUT DRIVES: create + export as nsid 1, ROUNDS x seq write, delete
  local name=$1 layout=$2 dl=$3 r t0=$(date +%s)
  cli volume create "$name" --layout "$layout" --drives "$dl" ${STRIP:+--strip "$STRIP"} --export "$NQN" --nsid 1 > "$OUT/create-$name.txt" 2>&1 \
    || { echo "FAILED volume create $name: $(tail -n 2 "$OUT/create-$name.txt" | tr '\n' ' ')"; return 1; }
  say "$name ($layout on $dl) created in $(($(date +%s) - t0)) s"
  for r in $(seq 1 "$ROUNDS"); do bench "$name-r$r" "tcp://127.0.0.1:$IO/$NQN?nsid=1" $SEQ --target-pid "$OPID"; done
  # what the stripe engine did: full stripes, partial ones, gathered ones (volume/gather.rs)
  curl -s -H "Authorization: Bearer $(cat "$FPC_DIR/api-token")" "http://127.0.0.1:$API/metrics" 2> /dev/null \
    | grep -E "^flashpool_volume_(full_stripe|gathered_stripe|read_modify|reconstruct|gather_timeouts)[a-z_]*\{[^}]*volume=\"$name\"" \
    | sed 's/^flashpool_volume_//' | tr '\n' ' ' > "$OUT/stripes-$name.txt"
  [ -s "$OUT/stripes-$name.txt" ] && say "$name stripes: $(cat "$OUT/stripes-$name.txt")"
  if [ "${4:-}" = rr ]; then
    # one sequential pass over the whole volume first: reads of never-written RAM are free
    local mib; mib=$(cli volume show "$name" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["size_bytes"] >> 20)')
    bench "$name-prefill" "tcp://127.0.0.1:$IO/$NQN?nsid=1" --rw write --bs 128k --qd 16 --size "${mib:-64}MiB"
    # the CPU of the owner and of every enclosure: what the two hops cost per I/O
    # (and each node's ticks over the whole run, ramp included: who spent it)
    for r in $(seq 1 "$ROUNDS"); do
      ticks "$OPID,$EPIDS" > "$OUT/$name-rr-r$r.t0"
      # PERF: where the owner's CPU goes in round 1, for 2 s from 0.5 s after the ramp
      case "${PERF:-}:$r" in
        record:1) (sleep "$(secs "$RAMP")"; sleep 0.5; perf record -q -g -p "$OPID" -o "$OUT/$name-rr.perf" -- sleep 2 > /dev/null 2>&1) & ;;
        syscalls:1) (sleep "$(secs "$RAMP")"; sleep 0.5; perf stat -e 'syscalls:sys_enter_*' -p "$OPID" -o "$OUT/$name-rr.syscalls" -- sleep 2 > /dev/null 2>&1) & ;;
      esac
      bench "$name-rr-r$r" "tcp://127.0.0.1:$IO/$NQN?nsid=1" $RR --target-pid "$OPID,$EPIDS"
      ticks "$OPID,$EPIDS" > "$OUT/$name-rr-r$r.t1"
    done
  fi
  cli volume unexport "$name" --force > /dev/null 2>&1; cli volume delete "$name" --force > /dev/null 2>&1 \
    || echo "volume delete $name failed: the next volume may not get its drives"
}
REMOTE=$(drives 'e%s:d0'); LOCAL=$(drives 'l%s')
rr_for() { [ "$1" = "$RR_LAYOUT" ] && echo rr; }
want() { case " $LAYOUTS " in *" $1 "*) return 0;; esac; return 1; }
want raid0 && vol raid0 raid0 "$REMOTE" "$(rr_for raid0)"
want raid5 && vol raid5 raid5 "$REMOTE" "$(rr_for raid5)"
want raid6 && vol raid6 raid6 "$REMOTE" "$(rr_for raid6)"
want ec && vol ec "ec$((N - 2))+2" "$REMOTE" "$(rr_for "ec$((N - 2))+2")"
[ "$LOCAL_RR" = 1 ] && vol local-rr "$RR_LAYOUT" "$LOCAL" rr
fpc_stop owner
for i in $(seq 1 "$NODES"); do fpc_stop "e$i"; done

# ---- the table
python3 - "$OUT" "$NODES" "$ROUNDS" "$RR_LAYOUT" << 'PY'
import json, os, statistics, sys
out, n, rounds, rr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def get(name, key="mb_s"):
    p = f"{out}/{name}.json"
    if not os.path.exists(p):
        return None
    j = json.load(open(p))
    if key == "cpu_us":   # target CPU per I/O, microseconds
        v = j["cpu"].get("target_s_per_million_ios")
        return None if v is None else v
    return j["all"][key]
def med(names, key="mb_s"):
    v = [x for x in (get(nm, key) for nm in names) if x is not None]
    return statistics.median(v) if v else None
R = range(1, rounds + 1)
raw = {i: med([f"raw-e{i}-r{r}" for r in R]) for i in range(1, n + 1)}
# aggregate: per round, the sum of the drives loaded at once; then the median over rounds
agg_r = []
for r in R:
    v = [get(f"rawall-e{i}-r{r}") for i in range(1, n + 1)]
    if all(x is not None for x in v):
        agg_r.append(sum(v))
agg = statistics.median(agg_r) if agg_r else None
sum_single = sum(v for v in raw.values() if v is not None) if all(v is not None for v in raw.values()) else None
vols = [("raid0", f"raid0 {n}", n), ("raid5", f"raid5 {n-1}+1", n - 1), ("raid6", f"raid6 {n-2}+2", n - 2), ("ec", f"ec{n-2}+2", n - 2)]
vm = {k: med([f"{k}-r{r}" for r in R]) for k, _, _ in vols}
r0 = vm.get("raid0")
f = lambda v: "failed" if v is None else f"{v:,.0f} MB/s"
pct = lambda a, b: "" if a is None or not b else f"{100 * a / b:.0f}%"
print(f"\n128 KiB sequential write, QD 16, median of {rounds} rounds ({n} enclosures, one RAM drive each)\n")
print("| target | MB/s | share of raid0 | share of raw aggregate | data share (the ideal vs raid0) |")
print("|---|---|---|---|---|")
for i in range(1, n + 1):
    print(f"| raw e{i}:d0 alone | {f(raw[i])} | {pct(raw[i], r0)} | {pct(raw[i], agg)} | |")
print(f"| raw, sum of the drives alone | {f(sum_single)} | {pct(sum_single, r0)} | {pct(sum_single, agg)} | |")
print(f"| raw aggregate ({n} at once) | {f(agg)} | {pct(agg, r0)} | 100% | |")
for k, label, data in vols:
    print(f"| {label} (owner, loopback) | {f(vm[k])} | {pct(vm[k], r0)} | {pct(vm[k], agg)} | {data}/{n} = {100 * data / n:.0f}% |")
key = {"raid0": "raid0", "raid5": "raid5", "raid6": "raid6"}.get(rr, "ec")
rem = med([f"{key}-rr-r{r}" for r in R], "iops")
loc = med([f"local-rr-rr-r{r}" for r in R], "iops")
fi = lambda v: "failed" if v is None else f"{v:,.0f} IOPS"
def table(title, cols, rows):
    print(f"\n{title}\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(r) + " |")
table(f"4 KiB random read, QD 32, median of {rounds} rounds: {rr} on {n} drives",
      ["members", "IOPS", "vs local"],
      [["remote (enclosures over NVMe/TCP)", fi(rem), pct(rem, loc)],
       ["local RAM drives of the owner", fi(loc), "100%"]])
one = med([f"raw-e1-rr-r{r}" for r in R], "iops")
one_cpu = med([f"raw-e1-rr-r{r}" for r in R], "cpu_us")
two_cpu = med([f"{key}-rr-r{r}" for r in R], "cpu_us")
loc_cpu = med([f"local-rr-rr-r{r}" for r in R], "cpu_us")
fc = lambda v: "-" if v is None else f"{v:.2f} µs"
ratio = "" if one_cpu is None or two_cpu is None else f"{two_cpu / one_cpu:.2f}x"
table(f"4 KiB random read, QD 32, CPU per I/O of the nodes that served it (median of {rounds} rounds)",
      ["path", "IOPS", "CPU per I/O", "vs one hop"],
      [["one hop: e1:d0 from its enclosure (that enclosure)", fi(one), fc(one_cpu), "1.00x"],
       [f"two hops: {rr} through the owner (owner + {n} enclosures)", fi(rem), fc(two_cpu), ratio],
       [f"{rr} on the owner's RAM drives (owner)", fi(loc), fc(loc_cpu), ""]])
def share(nm):   # the owner's share of the nodes' ticks over one run
    try:
        a = [int(x) for x in open(f"{out}/{nm}.t0").read().split()]
        b = [int(x) for x in open(f"{out}/{nm}.t1").read().split()]
    except OSError:
        return None
    d = [y - x for x, y in zip(a, b)]
    return d[0] / sum(d) if sum(d) else None
sh = [x for x in (share(f"{key}-rr-r{r}") for r in R) if x is not None]
if sh and two_cpu is not None:
    s = statistics.median(sh)
    print(f"\nof the two hops' CPU: the owner {100 * s:.0f}% ({s * two_cpu:.2f} µs per I/O), "
          f"the enclosures {100 * (1 - s):.0f}% ({(1 - s) * two_cpu:.2f} µs)")
PY
