#!/usr/bin/env bash
# docs/bench/cluster-scale.sh -- the cluster at rack scale (issue 21, "How it is measured"):
# when does a survivor serve each of N volumes after a fault of the node that owns them all?
#
# A 3-member etcd, ENCL (6) enclosure nodes with DRIVES (24) sparse file drives each, and
# three controller nodes c1..c3 in cluster mode (tests/cluster/lib.sh; its own bridge
# fpsbr0 and network 10.93.0.0/24, so it runs beside the test suites). For each N of COUNTS
# a fresh cluster gets N volumes v1..vN (LAYOUT, members on distinct enclosures), made on c1
# and exported under one NQN as nsid 1..N (one ANA group each). With POOLS=P THIN=M also
# P cluster pools p1..pP (LAYOUT --thin-pool, members on the drive slots after the volumes',
# exported under the same NQN) of M thin volumes p1t1..pPtM each (THIN_SIZE, made through
# c1..c3 in turn, 4 at a time; the nodes pick their nsids, read back from GET /v1/volumes):
# a pool is one unit of ownership and one ANA group, however many thin volumes it holds.
# COUNTS=0 POOLS=P runs the pools alone. Then the cases, each with every volume and pool
# owned by c1 first (moved back when a case left them elsewhere); the probe times every
# namespace (N + P x M):
#   kill-cold  kill -9 of c1, the first fault of the cluster: the survivors never opened the
#              volumes' members
#   kill-warm  kill -9 of c1 again (WARM times), after c1 restarted and got them back
#   drain      `flashpool node drain c1` (the clock starts as the command starts)
#   sigstop    SIGSTOP of c1: taken over after its lease (LEASE_MS); SIGCONT after STOP_S
# `flashpool failover-probe` (hidden; crates/flashpool-bench/src/failover/) does each fault
# itself, on the clock it times with: connected to all three nodes as a multipath host is,
# it writes a block to each volume through c1, does the fault, polls the survivors' ANA logs
# every 5 ms and, for each volume a survivor reports Optimized, reads the block back, writes
# another and reads that back through it: that is when the volume counts as served. It
# samples the CPU time (/proc/PID/task/*/schedstat) of the survivors and the etcd members
# from 1 s before the fault to AFTER s past the last volume ("quiet": the first moment from
# which they use at most their idle baseline + 0.1 CPU together over every 500 ms window,
# sampled every 100 ms). Around each probe the script reads
# etcd's request counters (grpc_server_handled_total, Range and Txn, summed over the
# members: from 1 s before the fault to AFTER s past the last volume), the machine's load
# average and busy CPUs (/proc/stat over the same window: other agents' work shows there),
# the took_over/moved events of the survivors (their detect/claim/assemble/serve step times)
# and GET /v1/audit's stale_writes on every node.
#
# usage (root; needs etcd, etcdctl, iproute2, python3, openssl and a release build):
#   docs/bench/cluster-scale.sh                      COUNTS="1 8 48": the table at the end
#   COUNTS=8 CASES="kill-warm drain" docs/bench/cluster-scale.sh
#   COUNTS=0 POOLS=2 THIN=250 DRIVES=8 docs/bench/cluster-scale.sh   (2 pools x 250 thin volumes)
#   OUT=/tmp/flashpool-scale TABLE_ONLY=1 docs/bench/cluster-scale.sh   (the tables of a saved run)
#   CHECK=1 COUNTS=4 ENCL=6 DRIVES=4 docs/bench/cluster-scale.sh   (what CI runs:
#                                    tests/cluster/run.sh scale; RESULT lines, exit 1 on FAIL)
# env: COUNTS="1 8 48" (0: no RAID volumes, with POOLS)  POOLS=0 THIN=0 (P cluster pools
#      of M thin volumes each, beside the N volumes of every COUNTS run; N + P x M <= 1024)
#      EXPAND=1 (each pool grows by a LAYOUT extent on the next free drive slot, asked of c2,
#      which passes it to the owner, before the thin volumes: every takeover and move of a
#      pool then assembles its extent too, or the pool does not open)
#      THIN_SIZE=16MiB  POOL_CLUSTER=64KiB (the pools' allocation unit: the probe writes
#      LBAs 0 and 1 of each thin volume, one cluster each, so M x POOL_CLUSTER must fit)
#      ENCL=6 (2..6)  DRIVES=24  DRIVE_SIZE=32MiB (sparse)  LAYOUT=raid1 (raid1, raid5,
#      raid6, ecK+M: width <= ENCL)  CASES="kill-cold kill-warm drain sigstop"  WARM=2
#      LEASE_MS=2000  STOP_S=1  AFTER=3 (s of CPU/etcd watch past the last volume)
#      TIMEOUT=30 (s per fault)  SLACK=0.5 (CHECK: the relaxed goal, below)
#      BIN (default target/release/flashpool)  OUT=/tmp/flashpool-scale
#      PERF_S=S (a system-wide `perf record -g` of each probe's first S s: $OUT/N<n>-<case>.perf)
# Output: per run a line; at the end two Markdown tables ready to paste into
# docs/performance.md (first/median/last per N and case; the took_over step times), also in
# $OUT/table.md; every probe's JSON in $OUT/N<n>-<case>.json.
#
# CHECK=1 (CI) reports, per case, RESULT scale-<case> PASS|FAIL (scale-pools-<case> with
# POOLS > 0): every namespace (volume and thin volume) served elsewhere, 0 verify errors, 0 stale writes on every node (hard); and the goal relaxed
# for a shared 2-vCPU CI machine: a kill's last volume within 1.5 x its first + SLACK s
# (the first volume of the same run stands for the single-volume time), a drain's last
# within 0.5 + SLACK s. SLACK absorbs the scheduling stalls of a machine where other jobs
# compile (tests/cluster/run.sh scale uses 0.8 s: the 4 volumes of one wave spread over up
# to 0.55 s at load 10-18 on 2 vCPUs). It still fails a volume stalled behind a 4 s connect
# timeout or a lost one; a finer regression (serial at 0.1 s per volume) it lets through:
# that is what the full bench's table shows.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$(pwd)
COUNTS=${COUNTS:-1 8 48}
POOLS=${POOLS:-0}; THIN=${THIN:-0}; THIN_SIZE=${THIN_SIZE:-16MiB}; POOL_CLUSTER=${POOL_CLUSTER:-64KiB}
ENCL=${ENCL:-6}; DRIVES=${DRIVES:-24}; DRIVE_SIZE=${DRIVE_SIZE:-32MiB}; LAYOUT=${LAYOUT:-raid1}
CASES=${CASES:-kill-cold kill-warm drain sigstop}; WARM=${WARM:-2}
LEASE_MS=${LEASE_MS:-2000}; STOP_S=${STOP_S:-1}; AFTER=${AFTER:-3}; TIMEOUT=${TIMEOUT:-30}
SLACK=${SLACK:-0.5}; CHECK=${CHECK:-0}; EXPAND=${EXPAND:-0}
OUT=${OUT:-/tmp/flashpool-scale}
FPC_BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/flashpool}
case $FPC_BIN in /*) ;; *) FPC_BIN=$ROOT/$FPC_BIN;; esac
export FPC_BIN
FPC_DIR=$OUT/nodes
FPC_PREFIX=${FPC_PREFIX:-fps}; FPC_NET=${FPC_NET:-10.93.0}; FPC_ETCD_BASE=${FPC_ETCD_BASE:-12900}
FPC_EXPORT_HOSTS="c1 c2 c3"; FPC_LEASE_MS=$LEASE_MS; FPC_CLUSTER=scale
FPC_LOG_LEVEL=${FPC_LOG_LEVEL:-info}
. tests/cluster/lib.sh
NQN=nqn.2026-01.io.flashpool:scale
RES=$OUT/results.txt

say() { echo "[scale $(date +%T)] $*"; }
die() { echo "cluster-scale: $*" >&2; exit 2; }
# TABLE_ONLY=1: print the tables (and checks) of the run saved in $OUT again
if [ "${TABLE_ONLY:-0}" = 1 ]; then
  [ -s "$OUT/results.txt" ] || die "no saved run in $OUT"
  RES=$OUT/results.txt
fi
if [ "${TABLE_ONLY:-0}" != 1 ]; then
case $POOLS$THIN in *[!0-9]*) die "POOLS and THIN are numbers";; esac
[ "$POOLS" -gt 0 ] && [ "$THIN" -lt 1 ] && die "POOLS=$POOLS needs THIN >= 1 (thin volumes per pool)"
[ "$POOLS" = 0 ] && [ "$THIN" != 0 ] && die "THIN=$THIN needs POOLS > 0"
[ "$THIN" -le 1024 ] || die "THIN=$THIN: a pool holds at most 1024 thin volumes"
for n in $COUNTS; do [ "$n" -gt 0 ] || [ "$POOLS" -gt 0 ] || die "N=0 needs POOLS > 0"; done
[ -x "$FPC_BIN" ] || die "no flashpool binary at $FPC_BIN (cargo build --release, or set BIN)"
"$FPC_BIN" failover-probe --help > /dev/null 2>&1 || die "$FPC_BIN has no failover-probe (build this tree)"
fpc_preflight || die "cannot run: $FPC_WHY"
for c in etcd etcdctl python3 openssl; do command -v $c > /dev/null || die "needs $c"; done
[ "$ENCL" -ge 2 ] && [ "$ENCL" -le 6 ] || die "ENCL must be 2..6 (namespace slots 7..9 are the controllers)"
case $LAYOUT in raid1) WIDTH=2;; raid5) WIDTH=3;; raid6) WIDTH=4;; ec*+*) w=${LAYOUT#ec}; WIDTH=$(( ${w%+*} + ${w#*+} ));; *) die "LAYOUT $LAYOUT?";; esac
[ "$WIDTH" -le "$ENCL" ] || die "$LAYOUT needs $WIDTH enclosures, ENCL=$ENCL"
for n in $COUNTS; do
  [ $(((n + POOLS * (1 + EXPAND)) * WIDTH)) -le $((ENCL * DRIVES)) ] \
    || die "N=$n + POOLS=$POOLS x $((1 + EXPAND)) x $WIDTH members > $ENCL x $DRIVES drives"
  [ $((n + POOLS * THIN)) -le 1024 ] || die "N=$n + $POOLS x $THIN namespaces > 1024 in one subsystem"
done
if [ "$POOLS" -gt 0 ]; then
  case $LAYOUT in raid1) DATA=1;; raid5) DATA=2;; raid6) DATA=$((WIDTH - 2));; ec*) DATA=${LAYOUT#ec}; DATA=${DATA%+*};; esac
  dbytes=$(numfmt --from=iec-i "${DRIVE_SIZE%B}" 2> /dev/null) || die "DRIVE_SIZE $DRIVE_SIZE?"
  cbytes=$(numfmt --from=iec-i "${POOL_CLUSTER%B}" 2> /dev/null) || die "POOL_CLUSTER $POOL_CLUSTER?"
  # each thin volume gets one cluster (LBAs 0, 1); a pool's metadata takes well under a tenth
  [ $((THIN * cbytes)) -le $((DATA * dbytes * 8 / 10)) ] \
    || die "THIN=$THIN x POOL_CLUSTER=$POOL_CLUSTER does not fit a $LAYOUT pool of $DRIVE_SIZE drives (raise DRIVE_SIZE, lower POOL_CLUSTER)"
fi
ip -o addr show | grep -v " $FPC_BR " | grep -q " $FPC_NET\." && die "$FPC_NET.0/24 is in use here (another run? its bridge is $FPC_BR)"
mkdir -p "$OUT" "$FPC_DIR"
: > "$RES"
rm -f "$OUT"/N*.json "$OUT"/N*.txt "$OUT"/table.md
# the drive files (about 1.5 GB a run) go with the cluster; logs and results stay in $OUT
drop_drives() { rm -f "$FPC_DIR"/e*-*.img; }
trap 'fpc_etcd_down; fpc_cleanup; drop_drives' EXIT
trap 'exit 130' INT TERM
fi

# ---------------------------------------------------------------- helpers
ccli() { fpc_ccli "$@"; }
capi() { echo "https://$(fpc_capi "$1")"; }
vols() { seq 1 "$1" | sed 's/^/v/'; }
# units N: what has an owner: v1..vN, then the pools p1..pP
units() { vols "$1"; seq 1 "$POOLS" | sed 's/^/p/'; }
# drives_of I: volume I's members, WIDTH consecutive slots, so each on another enclosure
drives_of() {
  local i=$1 j s l=""
  for j in $(seq 0 $((WIDTH - 1))); do
    s=$(((i - 1) * WIDTH + j)); l="$l,e$((s % ENCL + 1)):d$((s / ENCL))"
  done
  echo "${l#,}"
}
# owners_json: {volume: [owner, state]} from c1's (or any) GET /v1/cluster
owners() {
  fpc_cluster_json | python3 -c '
import json, sys
for v in json.load(sys.stdin)["volumes"]:
    print(v["name"], v.get("owner") or "-", v.get("state") or "-")' 2> /dev/null
}
# mine N: of `owners`, the lines of units N (v1..vN, p1..pP)
mine() { owners | awk -v u="$(units "$1" | tr '\n' ' ')" 'BEGIN { split(u, a, " "); for (i in a) w[a[i]] = 1 } $1 in w'; }
# wait_all_owned N NODE SECONDS: every v1..vN and p1..pP owned by NODE (not unowned)
wait_all_owned() {
  local end=$(($(date +%s) + $3)) want=$(($1 + POOLS)) l
  while :; do
    l=$(mine "$1" | awk -v o="$2" '{ n++ } $2 != o || $3 == "unowned" { b++ } END { print n + 0, b + 0 }')
    [ "$l" = "$want 0" ] && return 0
    [ "$(date +%s)" -lt "$end" ] || { say "not all $want volumes/pools owned by $2 after $3 s: $(mine "$1" | awk -v o="$2" '$2 != o' | head -n 5 | tr '\n' ';')"; return 1; }
    sleep 0.3
  done
}
# wait_optimal N SECONDS: every volume and pool optimal on c1 (initial syncs done)
wait_optimal() {
  local end=$(($(date +%s) + $2)) left
  while :; do
    left=$(fpc_get "$(capi 1)/v1/volumes" | python3 -c '
import json, sys
vs = json.load(sys.stdin); vs = vs.get("volumes", vs) if isinstance(vs, dict) else vs
st = {v["name"]: v.get("state") for v in vs}
print(sum(1 for u in sys.argv[1:] if st.get(u) != "optimal"))' $(units "$1") 2> /dev/null || echo "?")
    [ "$left" = 0 ] && return 0
    [ "$(date +%s)" -lt "$end" ] || { say "$left volumes not optimal after $2 s"; return 1; }
    sleep 1
  done
}
# back_to_c1 N: move every volume and pool c1 does not own to c1 (4 at a time), wait until it
# owns all (a pool's move carries its thin volumes)
# (in rounds: a cluster status read that fails under load lists nothing to move, and a move
# refused while the last fault settles is asked again)
back_to_c1() {
  local round
  for round in 1 2 3; do
    mine "$1" | awk '$2 != "c1" { print $1 }' \
      | xargs -r -P 4 -I{} bash -c "timeout 60 '$FPC_BIN' volume move {} --to c1 --api $(capi 1) $(fpc_auth) > /dev/null 2>&1 || echo 'move {} failed (round $round)'"
    wait_all_owned "$1" c1 20 && return 0
  done
  return 1
}
# start_all_ctl: c1..c3 up, listed by cluster status
wait_nodes() {
  local end=$(($(date +%s) + $2))
  until [ "$(fpc_cluster_nodes)" = "$1" ]; do [ "$(date +%s)" -lt "$end" ] || return 1; sleep 0.3; done
}
# etcd_counts: "RANGE TXN" summed over the live members (grpc_server_handled_total)
etcd_counts() {
  local i r=0 t=0 m
  for i in $(seq 1 "$FPC_ETCD_N"); do
    m=$(timeout 3 python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())' \
      "$(fpc_etcd_client "$i")/metrics" 2> /dev/null) || continue
    r=$((r + $(echo "$m" | awk '/^grpc_server_handled_total\{.*grpc_method="Range"/ { s += $NF } END { printf "%d", s }')))
    t=$((t + $(echo "$m" | awk '/^grpc_server_handled_total\{.*grpc_method="Txn"/ { s += $NF } END { printf "%d", s }')))
  done
  echo "$r $t"
}
# busy: "BUSY_JIFFIES TOTAL_JIFFIES" of the whole machine (/proc/stat)
busy() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat; }
# last_seq NODE: the node's newest event number (0 if none)
last_seq() { fpc_get "$(capi "$1")/v1/events?follow=false" | python3 -c 'import json, sys; e = json.load(sys.stdin); print(e[-1]["seq"] if e else 0)' 2> /dev/null || echo 0; }

# probe N CASE TAG FAULT-ARGS...: one fault, one probe; appends a line to $RES
probe() {
  local n=$1 cse=$2 tag=$3; shift 3
  local j="$OUT/N$n-$tag.json" e0 e1 b0 b1 s2 s3 la args="" i v rc watch=""
  for v in $(vols "$n"); do args="$args,$v=${v#v}"; done
  [ "$POOLS" = 0 ] || args="$args,$(paste -sd, "$FPC_DIR/thin-nsids")"
  for i in 2 3; do watch="$watch --watch c$i=$(fpc_pid_of "c$i")"; done
  for i in $(seq 1 "$FPC_ETCD_N"); do watch="$watch --watch etcd-m$i=$(fpc_pid_of "etcd-$i")"; done
  s2=$(last_seq 2); s3=$(last_seq 3)
  e0=$(etcd_counts); b0=$(busy); la=$(cut -d' ' -f1-3 /proc/loadavg)
  # PERF_S=S: a system-wide `perf record -g` of the first S seconds of the probe
  [ -z "${PERF_S:-}" ] || perf record -a -g -q -o "$OUT/N$n-$tag.perf" -- sleep "$PERF_S" > /dev/null 2>&1 &
  "$FPC_BIN" failover-probe --nqn "$NQN" --owner c1 \
    --ctrl "c1=$(fpc_cip 1):$FPC_PORT" --ctrl "c2=$(fpc_cip 2):$FPC_PORT" --ctrl "c3=$(fpc_cip 3):$FPC_PORT" \
    --volume "${args#,}" $watch --after "${AFTER}s" --timeout "${TIMEOUT}s" --json "$j" "$@" \
    > "$OUT/N$n-$tag.txt" 2>&1
  rc=$?
  e1=$(etcd_counts); b1=$(busy)
  say "N=$n $tag: $(tail -n 1 "$OUT/N$n-$tag.txt")"
  # the survivors' took_over/moved events after the fault
  for i in 2 3; do
    fpc_get "$(capi "$i")/v1/events?follow=false&since=$([ "$i" = 2 ] && echo "$s2" || echo "$s3")" > "$OUT/N$n-$tag.events-c$i.json" 2> /dev/null
  done
  fpc_audit_stale "$ENCL" || true
  python3 - "$j" "$n" "$cse" "$tag" "$rc" "$e0" "$e1" "$b0" "$b1" "$la" "$FPC_STALE" "$FPC_AUDIT" "$OUT" "$POOLS" "$THIN" >> "$RES" << 'PY'
import json, sys, os
jf, n, cse, tag, rc, e0, e1, b0, b1, la, stale, audit, out, pools, thin = sys.argv[1:]
r = json.load(open(jf)) if os.path.exists(jf) and os.path.getsize(jf) else {}
e0, e1 = [int(x) for x in e0.split()], [int(x) for x in e1.split()]
b0, b1 = [int(x) for x in b0.split()], [int(x) for x in b1.split()]
busy = (b1[0] - b0[0]) / (b1[1] - b0[1]) * os.cpu_count() if b1[1] > b0[1] else 0
steps = {}
for i in (2, 3):
    p = f"{out}/N{n}-{tag}.events-c{i}.json"
    try:
        ev = json.load(open(p))
    except Exception:
        ev = []
    for e in ev:
        if e.get("kind") in ("took_over", "moved"):
            for s in e.get("steps") or []:
                steps.setdefault(s["step"], []).append(s["ms"])
cpu = r.get("cpu") or {}
row = {
    "n": int(n), "pools": int(pools), "thin": int(thin), "total": int(n) + int(pools) * int(thin),
    "case": cse, "tag": tag, "rc": int(rc),
    "served": r.get("served", 0), "missing": r.get("missing", []), "verify_errors": r.get("verify_errors"),
    "first_ms": r.get("first_ms"), "median_ms": r.get("median_ms"), "last_ms": r.get("last_ms"),
    "by_node": r.get("by_node"), "run": r.get("run"),
    "etcd_range": e1[0] - e0[0], "etcd_txn": e1[1] - e0[1],
    "quiet_after_s": cpu.get("quiet_after_s", "none"), "cpu_after_s": cpu.get("after_s"),
    "cpu_to_last_s": cpu.get("to_last_s"), "baseline_cores": cpu.get("baseline_cores"),
    "loadavg": la, "machine_busy_cores": round(busy, 2), "stale": int(stale), "audit": audit,
    "steps": {k: sorted(v) for k, v in steps.items()},
}
print(json.dumps(row))
PY
  return $rc
}

# ---------------------------------------------------------------- one N
cluster_up() {
  local n=$1 i d dl t0; t0=$(date +%s)
  fpc_etcd_down; fpc_cleanup
  rm -rf "$FPC_DIR"; mkdir -p "$FPC_DIR/pids"
  fpc_net_up 9 || { say "network set-up failed"; return 1; }
  fpc_etcd_up 3 || { say "etcd did not come up"; return 1; }
  for i in $(seq 1 "$ENCL"); do
    dl=""; for d in $(seq 0 $((DRIVES - 1))); do dl="$dl d$d:file:$DRIVE_SIZE"; done
    fpc_enclosure_toml "$i" "$dl" > "$FPC_DIR/e$i.toml"
    fpc_start_enclosure "$i" || return 1
  done
  for i in 1 2 3; do fpc_ctl_toml "$i" "$ENCL" > "$FPC_DIR/c$i.toml"; done
  for i in 1 2 3; do fpc_start_ctl "$i" || return 1; done
  disown -a   # (a node killed by a case is not reported as "Killed" by this shell)
  wait_nodes "c1 c2 c3" 30 || { say "cluster status lists '$(fpc_cluster_nodes)'"; return 1; }
  for i in $(seq 1 "$n"); do
    ccli 1 volume create "v$i" --layout "$LAYOUT" --drives "$(drives_of "$i")" --export "$NQN" --nsid "$i" \
      > "$FPC_DIR/create-v$i.txt" 2>&1 || { say "volume create v$i: $(tail -n 2 "$FPC_DIR/create-v$i.txt" | tr '\n' ' ')"; return 1; }
  done
  for i in $(seq 1 "$POOLS"); do
    ccli 1 volume create "p$i" --layout "$LAYOUT" --drives "$(drives_of $((n + i)))" --thin-pool --cluster "$POOL_CLUSTER" \
      --export "$NQN" > "$FPC_DIR/create-p$i.txt" 2>&1 || { say "pool create p$i: $(tail -n 2 "$FPC_DIR/create-p$i.txt" | tr '\n' ' ')"; return 1; }
  done
  # a node may claim a new volume before its maker does: every one to c1 first
  back_to_c1 "$n" || return 1
  [ "$EXPAND" = 1 ] && for i in $(seq 1 "$POOLS"); do
    ccli 2 pool expand "p$i" --drives "$(drives_of $((n + POOLS + i)))" > "$FPC_DIR/expand-p$i.txt" 2>&1 \
      || { say "pool expand p$i: $(tail -n 2 "$FPC_DIR/expand-p$i.txt" | tr '\n' ' ')"; return 1; }
  done
  [ "$POOLS" = 0 ] || make_thin || return 1
  wait_optimal "$n" 300 || return 1
  say "N=$n: etcd x3, $ENCL enclosures x $DRIVES $DRIVE_SIZE file drives, c1..c3 (lease $LEASE_MS ms), $n $LAYOUT volumes$([ "$POOLS" = 0 ] || echo " and $POOLS pool(s) x $THIN thin volumes") on c1, optimal, in $(($(date +%s) - t0)) s"
}
# make_thin: THIN thin volumes in each pool (pKtJ), 4 creates at a time through c1, c2, c3 in
# turn (a node that does not own the pool passes the create on), each tried up to 3 times;
# then $FPC_DIR/thin-nsids: NAME=NSID a line, as c1's GET /v1/volumes says
make_thin() {
  local k j t0; t0=$(date +%s.%N)
  for k in $(seq 1 "$POOLS"); do for j in $(seq 1 "$THIN"); do
    echo "p$k p${k}t$j https://$(fpc_capi $(((j - 1) % 3 + 1)))"
  done; done | xargs -P 4 -L 1 bash -c '
    for t in 1 2 3; do
      timeout 60 "$0" volume create "$4" --pool "$3" --size "$1" --api "$5" --token-file "$2/api-token" \
        --ca-file "$2/api-ca.pem" > "$2/create-$4.txt" 2>&1 && exit 0
      sleep 0.5
    done
    echo "thin volume create $4 in $3 through $5: $(tail -n 2 "$2/create-$4.txt" | tr "\n" " ")"; exit 1' \
      "$FPC_BIN" "$THIN_SIZE" "$FPC_DIR" || { say "thin volume creates failed"; return 1; }
  fpc_get "$(capi 1)/v1/volumes" | python3 -c '
import json, sys
vs = json.load(sys.stdin); vs = vs.get("volumes", vs) if isinstance(vs, dict) else vs
pools = {f"p{k}" for k in range(1, int(sys.argv[1]) + 1)}
got = sorted(((v.get("export") or {}).get("nsid"), v["name"]) for v in vs if v.get("pool") in pools)
for nsid, name in got:
    print(f"{name}={nsid}")
' "$POOLS" > "$FPC_DIR/thin-nsids" 2> "$FPC_DIR/thin-nsids.err"
  if [ "$(grep -c '^p[0-9]*t[0-9]*=[0-9][0-9]*$' "$FPC_DIR/thin-nsids")" != $((POOLS * THIN)) ]; then
    say "c1 lists $(wc -l < "$FPC_DIR/thin-nsids") thin volumes with an nsid, not $((POOLS * THIN)): $(head -c 300 "$FPC_DIR/thin-nsids.err" "$FPC_DIR/thin-nsids" | tr '\n' ' ')"
    return 1
  fi
  say "$((POOLS * THIN)) thin volumes made in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s, nsids $(cut -d= -f2 "$FPC_DIR/thin-nsids" | sort -n | sed -n '1p;$p' | paste -sd-)"
}
restart_c1() {
  fpc_kill c1 2> /dev/null
  fpc_start_ctl 1 || return 1
  disown -a
  wait_nodes "c1 c2 c3" 30
}

run_n() {
  local n=$1 c k
  if ! cluster_up "$n"; then
    for c in $CASES; do echo "{\"n\": $n, \"pools\": $POOLS, \"thin\": $THIN, \"total\": $((n + POOLS * THIN)), \"case\": \"$c\", \"tag\": \"$c\", \"rc\": 9, \"setup_failed\": true}" >> "$RES"; done
    return 1
  fi
  for c in $CASES; do
    case $c in
      kill-cold)
        probe "$n" kill-cold kill-cold --signal KILL --pid "$(fpc_pid_of c1)"
        rm -f "$(fpc_pidf c1)"
        restart_c1 || say "c1 did not rejoin";;
      kill-warm)
        for k in $(seq 1 "$WARM"); do
          back_to_c1 "$n" || say "the volumes are not all on c1"
          probe "$n" kill-warm "kill-warm$k" --signal KILL --pid "$(fpc_pid_of c1)"
          rm -f "$(fpc_pidf c1)"
          restart_c1 || say "c1 did not rejoin"
        done;;
      drain)
        back_to_c1 "$n" || say "the volumes are not all on c1"
        probe "$n" drain drain --run "timeout 60 '$FPC_BIN' node drain c1 --api $(capi 2) $(fpc_auth)"
        ccli 2 node undrain c1 > /dev/null 2>&1 || say "undrain c1 failed";;
      sigstop)
        back_to_c1 "$n" || say "the volumes are not all on c1"
        local p; p=$(fpc_pid_of c1)
        probe "$n" sigstop sigstop --signal STOP --pid "$p"
        sleep "$STOP_S"; kill -CONT "$p" 2> /dev/null
        # the woken node fences what it owned and joins again
        wait_nodes "c1 c2 c3" 30 || { say "c1 did not rejoin after SIGCONT: restarting it"; restart_c1; }
        sleep 1
        fpc_audit_stale "$ENCL" || true
        [ "$FPC_STALE" = 0 ] || say "stale writes after SIGCONT: $FPC_AUDIT"
        sed -i '$ s/"stale": [0-9]*/"stale": '"$FPC_STALE"'/' "$RES";;
      *) die "unknown case $c (kill-cold kill-warm drain sigstop)";;
    esac
  done
  fpc_etcd_down; fpc_cleanup; drop_drives
}

if [ "${TABLE_ONLY:-0}" != 1 ]; then
  say "COUNTS=$COUNTS POOLS=$POOLS THIN=$THIN LAYOUT=$LAYOUT ENCL=$ENCL DRIVES=$DRIVES x $DRIVE_SIZE CASES=$CASES WARM=$WARM; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); results in $OUT"
  git rev-parse --short HEAD > "$OUT/rev" 2> /dev/null
  for n in $COUNTS; do run_n "$n"; done
fi

# ---------------------------------------------------------------- the tables, the checks
python3 - "$RES" "$CHECK" "$SLACK" "$LAYOUT" "$ENCL" "$DRIVES" "$DRIVE_SIZE" "$LEASE_MS" "$AFTER" "$(cat "$OUT/rev" 2> /dev/null)" "$OUT/table.md" "$THIN_SIZE" "$POOL_CLUSTER" << 'PY'
import json, statistics, sys, os
res, check, slack, layout, encl, drives, dsize, lease, after, rev, tfile, tsize, pcl = sys.argv[1:]
check, slack = check == "1", float(slack)
rows = [json.loads(l) for l in open(res) if l.strip()]
for r in rows:  # a run from before the pools
    r.setdefault("pools", 0); r.setdefault("thin", 0); r.setdefault("total", r["n"])
s = lambda v: "–" if v is None else f"{v / 1e3:.3f}"
# the N column: "48" (raid volumes), "2x250 thin" (pools of thin volumes), "4 + 1x6 thin"
def units(r):
    if not r["pools"]:
        return str(r["n"])
    t = f"{r['pools']}x{r['thin']} thin"
    return t if not r["n"] else f"{r['n']} + {t}"
out = []
p = out.append
what = f"{layout} volumes (N = {', '.join(sorted({str(r['n']) for r in rows}, key=int))})"
pk = sorted({(r["pools"], r["thin"]) for r in rows if r["pools"]})
if pk:
    what += (f"; PxM thin: {', '.join(f'{a}x{b}' for a, b in pk)} = P cluster pools ({layout} --thin-pool, "
             f"allocation unit {pcl}, one ANA group each) of M thin volumes of {tsize}, in the subsystem of the N volumes")
p(f"{what}; 3 controllers (lease {lease} ms), {encl} enclosures x {drives} sparse {dsize} file drives, 3-member etcd; "
  f"{os.cpu_count()} CPUs; {rev}. Seconds from the fault until a survivor reports ANA Optimized and a write+read through it verifies "
  f"(served: namespaces, N + P x M).")
p("")
p("| N | case | served | first | median | last | last, ANA only | etcd Range / Txn | quiet after last | load avg (1/5/15 min) | machine busy CPUs |")
p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
out_dir = os.path.dirname(tfile)
def ana_last(r):
    try:
        v = json.load(open(f"{out_dir}/N{r['n']}-{r['tag']}.json"))["volumes"]
        a = [x["ana_ms"] for x in v if x.get("ana_ms") is not None]
        return max(a) if len(a) == len(v) else None
    except Exception:
        return None
label = {"kill-cold": "`kill -9`, first (cold)", "kill-warm": "`kill -9`, warm", "drain": "`node drain`", "sigstop": "`SIGSTOP`"}
for r in rows:
    if r.get("setup_failed"):
        p(f"| {units(r)} | {label.get(r['case'], r['case'])} | set-up failed | | | | | | | | |")
        continue
    q = r.get("quiet_after_s")
    qs = "not within {} s".format(after) if q is None else ("–" if q == "none" else f"{q:.1f} s")
    extra = ""
    if r.get("verify_errors"):
        extra += f", **{r['verify_errors']} verify errors**"
    if r.get("stale"):
        extra += f", **{r['stale']} stale writes**"
    if r["case"] == "drain" and r.get("run"):
        extra += f" (drain returned {r['run']['ms'] / 1e3:.2f} s, exit {r['run']['exit']})"
    p(f"| {units(r)} | {label.get(r['case'], r['case'])}{' ' + r['tag'][-1] if r['case'] == 'kill-warm' else ''} | "
      f"{r['served']}/{r['total']}{extra} | {s(r['first_ms'])} | {s(r['median_ms'])} | **{s(r['last_ms'])}** | {s(ana_last(r))} | "
      f"{r['etcd_range']} / {r['etcd_txn']} | {qs} | {r['loadavg']} | {r['machine_busy_cores']} |")
p("")
p("Per-step times of the survivors' `took_over` / `moved` events (ms, median / max over the volumes):")
p("")
names = ["detect", "claim", "assemble", "resync", "serve", "move", "total"]
p("| N | case | " + " | ".join(names) + " |")
p("|---:|---|" + "---:|" * len(names))
for r in rows:
    st = r.get("steps") or {}
    if not st:
        continue
    cell = lambda k: "–" if k not in st else f"{statistics.median(st[k]):.0f} / {max(st[k]):.0f}"
    p(f"| {units(r)} | {r['tag']} | " + " | ".join(cell(k) for k in names) + " |")
text = "\n".join(out)
open(tfile, "w").write(text + "\n")
print("\n" + text)
if check:
    print()
    bad = 0
    for r in rows:
        why = []
        if r.get("setup_failed"):
            why.append("set-up failed")
        else:
            if r["served"] != r["total"]:
                why.append(f"{r['served']}/{r['total']} served, missing {' '.join(r['missing'][:5])}")
            if r.get("verify_errors"):
                why.append(f"{r['verify_errors']} verify errors")
            if r.get("stale"):
                why.append(f"{r['stale']} stale writes ({r['audit']})")
            if r.get("rc") not in (0, None) and not why:
                why.append(f"probe exit {r['rc']}")
            f, l = r.get("first_ms"), r.get("last_ms")
            if f is not None and l is not None:
                if r["case"].startswith("kill") and l / 1e3 > 1.5 * f / 1e3 + slack:
                    why.append(f"last {l / 1e3:.3f} s > 1.5 x first {f / 1e3:.3f} s + {slack} s")
                if r["case"] == "drain" and l / 1e3 > 0.5 + slack:
                    why.append(f"last {l / 1e3:.3f} s > 0.5 + {slack} s")
        ok = "FAIL" if why else "PASS"
        bad += bool(why)
        print(f"RESULT scale-{'pools-' if r['pools'] else ''}{r['tag']} {ok} N={units(r).replace(' ', '')}: {r.get('served')}/{r['total']} served, first {s(r.get('first_ms'))} s, "
              f"last {s(r.get('last_ms'))} s, verify errors {r.get('verify_errors')}, stale writes {r.get('stale')}"
              + (": " + "; ".join(why) if why else ""))
    sys.exit(1 if bad else 0)
PY
