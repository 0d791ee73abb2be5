#!/usr/bin/env bash
# Applications on flashpool volumes, side by side with local (issue 23; measurement, not CI
# except CHECK=1). Each configuration is ext4 on a loop device (--direct-io=on) over:
#   local  a file on tmpfs (the direct-attached baseline: our drives are RAM)
#   mem    `flashpool attach mem:` (the same FUSE and loop path with no fabric)
#   tcp    `flashpool attach` over NVMe/TCP to one node's RAM namespace on 127.0.0.1
#   raid6  `flashpool attach` (multipath, discovery) to a LAYOUT volume of a cluster: etcd,
#          6 enclosures with one RAM drive each, 3 controllers (tests/lib/attach.sh)
# Phases (arguments, default all four, in this order):
#   rocksdb   db_bench readrandomwriterandom 80% reads (seed 002) and 50% (YCSB-A-like),
#             800-byte values, direct reads: ops/s, latency, CPU (db_bench, attach, node)
#   mariadb   mariadbd (its own datadir on the ext4, private socket) + sysbench oltp_read_write
#   fio       4 KiB random read and write, 128 KiB sequential read, on a file of the ext4
#   failover  the 80/20 run on the raid6 configuration through `volume move` of its owner,
#             then kill -9 of the owner: db_bench must finish, ldb checkconsistency pass;
#             per-second throughput and the longest stall (a 4 KiB O_DIRECT write probe)
# Each measurement is ROUNDS rounds, the configurations in a rotated order each round;
# results in $OUT/results.jsonl, then docs/bench/apps-report.py draws the report
# ($OUT/report/report.md, report.html, charts/) through `flashpool bench --render`.
#
#   docs/bench/apps.sh                         # root; installs its packages (apt)
#   CONFIGS="local tcp" ROUNDS=1 docs/bench/apps.sh rocksdb
#   CHECK=1 docs/bench/apps.sh                 # CI (tests/attach/apps.sh): local and tcp,
#                                              # db_bench 80/20 10 s, ldb checkconsistency
# env: CONFIGS="local mem tcp raid6" ROUNDS=3 DB_SECS=20 SB_SECS=20 FIO_SECS=5 FO_SECS=45
#      FO_MOVE=12 FO_KILL=27 KEYS=300000 THREADS=4 SIZE_MIB=1536 LAYOUT=raid6 OUT=/tmp/flashpool-apps BIN
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
# shellcheck source=tests/lib/harness.sh
. tests/lib/harness.sh
BIN=$(flashpool_bin "${BIN:-}")
CHECK=${CHECK:-0}
if [ "$CHECK" = 1 ]; then
  CONFIGS=${CONFIGS:-local tcp}; ROUNDS=${ROUNDS:-1}; DB_SECS=${DB_SECS:-10}; KEYS=${KEYS:-50000}
  SIZE_MIB=${SIZE_MIB:-512}; set -- rocksdb
fi
CONFIGS=${CONFIGS:-local mem tcp raid6}
ROUNDS=${ROUNDS:-3}
DB_SECS=${DB_SECS:-20}
SB_SECS=${SB_SECS:-20}
FIO_SECS=${FIO_SECS:-5}
FO_SECS=${FO_SECS:-45}
FO_MOVE=${FO_MOVE:-12}   # seconds into the failover run: the planned move
FO_KILL=${FO_KILL:-27}   # and the kill -9 of the owner
KEYS=${KEYS:-300000}
THREADS=${THREADS:-4}
SIZE_MIB=${SIZE_MIB:-1536}
LAYOUT=${LAYOUT:-raid6}
OUT=${OUT:-/tmp/flashpool-apps}
PHASES=${*:-rocksdb mariadb fio failover}
RUN=$OUT/run
RES=$OUT/results.jsonl
assign_ports IO_PORT=4670
TARGET_PORTS=$IO_PORT
NQN=nqn.2026-01.io.flashpool:apps
CNQN=nqn.2026-01.io.flashpool:apps-cluster
QPID=""
TPID=""
MYSQLD_PIDS=""

passed=0
failed=0
check() { # what, command...
  local what=$1; shift
  if "$@"; then passed=$((passed + 1)); echo "ok   $what"; else failed=$((failed + 1)); echo "FAIL $what"; fi
}
finish() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit $?; }
need_cluster() { [[ " $CONFIGS " == *" raid6 "* ]] || [[ " $PHASES " == *failover* ]]; }

export FPC_BIN=$BIN FPC_DIR=$RUN/cluster FPC_PREFIX=fpx FPC_NET=10.95.0 FPC_ETCD_BASE=12700
export FPC_CLUSTER=apps FPC_LEASE_MS=2000 FPC_EXPORT_HOSTS="c1 c2 c3"
# shellcheck source=tests/cluster/lib.sh
. tests/cluster/lib.sh
# shellcheck source=tests/lib/attach.sh
. tests/lib/attach.sh

cleanup_more() {
  local p
  for p in $MYSQLD_PIDS; do kill -KILL "$p" 2>/dev/null; done
  att_cleanup
  if need_cluster; then fpc_etcd_down; fpc_cleanup; fi
  rm -f "/dev/shm/flashpool-apps-local.img"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- preflight
[ "$(id -u)" = 0 ] || { echo "needs root (FUSE, loop devices, network namespaces)"; failed=1; finish; }
[ -e /dev/fuse ] || { echo "/dev/fuse missing"; failed=1; finish; }
[ -x "$BIN" ] || { echo "no flashpool binary at $BIN (cargo build --release -p flashpool)"; failed=1; finish; }
pkgs="rocksdb-tools"
[[ " $PHASES " == *mariadb* ]] && pkgs="$pkgs mariadb-server sysbench"
[[ " $PHASES " == *fio* ]] && pkgs="$pkgs fio"
need_cluster && pkgs="$pkgs etcd-server etcd-client iproute2"
missing=""
for t in db_bench:rocksdb-tools ldb:rocksdb-tools mariadbd:mariadb-server sysbench:sysbench fio:fio etcd:etcd-server; do
  case " $pkgs " in *" ${t#*:} "*) command -v "${t%%:*}" >/dev/null || missing="$missing ${t#*:}";; esac
done
if [ -n "$missing" ]; then
  echo "installing$missing"
  scripts/apt-install.sh "$OUT/apt" $missing || { failed=1; finish; }
fi
if need_cluster; then fpc_preflight || { echo "cannot run here: $FPC_WHY"; failed=1; finish; }; fi
rm -rf "$RUN"; mkdir -p "$RUN"
: > "$RES"
{
  echo "date $(date -u +%FT%TZ)"; echo "uptime $(uptime)"; echo "nproc $(nproc)"
  echo "kernel $(uname -r)"; echo "commit $(git rev-parse --short HEAD 2>/dev/null)"
  echo "db_bench $(dpkg-query -W -f '${Version}' rocksdb-tools 2>/dev/null)"
} > "$OUT/conditions.txt"
# what else runs: the load, and the processes that used over 5% of a CPU in one second
# (top's second sample), at the start of each phase
others() {
  echo "load-$1 $(cut -d' ' -f1-3 /proc/loadavg); $(top -b -n 2 -d 1 -w 200 | awk '/^top -/ {n++} n == 2 && $1 ~ /^[0-9]+$/ && $9 + 0 > 5 && $12 != "top" {printf "%s %s%%, ", $12, $9}')" >> "$OUT/conditions.txt"
}

# ---------------------------------------------------------------- configurations
cfg_up() { # CONFIG: its ext4 mounted at $RUN/fs-CONFIG
  local c=$1 f
  case $c in
    local)
      f=/dev/shm/flashpool-apps-local.img; rm -f "$f"; truncate -s "${SIZE_MIB}M" "$f"
      att_fs_up local "$f" "$RUN/fs-local";;
    mem)
      att_start mem "mem:${SIZE_MIB}M" "$RUN/dir-mem" --block-size 4096 && att_fs_up mem "$RUN/dir-mem/disk" "$RUN/fs-mem";;
    tcp)
      {
        printf '[node]\nlog = "info"\nreactors = 1\n\n[api]\nenabled = false\n'
        toml_listener "$IO_PORT" io
        toml_subsystem "$NQN" "allow_any_host = true"
        toml_namespace 1 mem "size = \"${SIZE_MIB}MiB\"" 'block_size = 4096' 'thin = false'
      } > "$RUN/target.toml"
      : > "$RUN/target.log"
      start_target > /dev/null || { tail -n 5 "$RUN/target.log"; return 1; }
      att_start tcp "tcp://127.0.0.1:$IO_PORT/$NQN?nsid=1" "$RUN/dir-tcp" --single-path \
        && att_fs_up tcp "$RUN/dir-tcp/disk" "$RUN/fs-tcp";;
    raid6)
      att_cluster_up 6 3 "mem:$((SIZE_MIB / 4))MiB" "$LAYOUT" "$CNQN" vol || return 1
      att_start raid6 "tcp://$(fpc_cip 1):$FPC_PORT/$CNQN?nsid=1" "$RUN/dir-raid6" \
        --discovery "$(fpc_cip 1):$FPC_DISC_PORT" --fail-after 30s \
        && att_fs_up raid6 "$RUN/dir-raid6/disk" "$RUN/fs-raid6";;
    *) echo "unknown configuration $c (local mem tcp raid6)"; return 1;;
  esac
}
# the flashpool processes that serve CONFIG's I/O: the attach, and the node(s) behind it
serving_pids() {
  case $1 in
    local) ;;
    mem) att_pid mem;;
    tcp) echo "$(att_pid tcp) $TPID";;
    raid6) echo "$(att_pid raid6) $(for n in c1 c2 c3 e1 e2 e3 e4 e5 e6; do fpc_pid_of "$n"; done)";;
  esac
}
attach_pid_of() { [ "$1" = local ] || att_pid "$1"; }
# rotated CONFIGS for round R: each configuration runs first once
order() { local a; read -ra a <<< "$CONFIGS"; local n=${#a[@]} i; for i in $(seq 0 $((n - 1))); do echo "${a[$(((i + $1 - 1) % n))]}"; done; }
busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8}' /proc/stat; }

# run_timed NAME CONFIG CMD...: CMD with CPU accounting; stdout+stderr in $RUN/NAME.txt and
# $RUN/NAME.cpu: "app_cpu_s serving_cpu_s attach_cpu_s machine_busy_fraction wall_s rc"
run_timed() {
  local name=$1 c=$2 s0 s1 a0 a1 b0 b1 t0 rc; shift 2
  local sp; sp=$(serving_pids "$c"); local ap; ap=$(attach_pid_of "$c")
  s0=$(att_cpu_s $sp); a0=$(att_cpu_s $ap); b0=$(busy); t0=$(ts)
  ( "$@"; r=$?; times > "$RUN/$name.times"; exit $r ) > "$RUN/$name.txt" 2>&1; rc=$?
  s1=$(att_cpu_s $sp); a1=$(att_cpu_s $ap); b1=$(busy)
  read -r u s < <(tail -n 1 "$RUN/$name.times" | sed 's/m/ /g; s/s//g' | awk '{print $1 * 60 + $2, $3 * 60 + $4}')
  echo "$(awk -v u="$u" -v s="$s" 'BEGIN{printf "%.2f", u + s}') \
$(awk -v a="$s0" -v b="$s1" 'BEGIN{printf "%.2f", b - a}') \
$(awk -v a="$a0" -v b="$a1" 'BEGIN{printf "%.2f", b - a}') \
$(echo "$b0 $b1" | awk '{printf "%.3f", ($3 - $1) / ($4 - $2)}') $(el "$t0") $rc" > "$RUN/$name.cpu"
  return $rc
}
# record KIND NAME CONFIG ROUND: a line of results.jsonl from $RUN/NAME.txt and .cpu
record() {
  python3 docs/bench/apps-report.py parse "$1" "$RUN/$2.txt" "$RUN/$2.cpu" "$3" "$4" "$2" >> "$RES"
}

# ---------------------------------------------------------------- rocksdb
DBOPTS="--value_size=800 --compression_type=none --use_direct_reads=true \
--use_direct_io_for_flush_and_compaction=true --cache_size=8388608 --histogram=1"
db_fill() { # CONFIG
  rm -rf "$RUN/fs-$1/db"
  db_bench --benchmarks=fillrandom --db="$RUN/fs-$1/db" --num="$KEYS" $DBOPTS > "$RUN/fill-$1.txt" 2>&1 \
    || { tail -n 5 "$RUN/fill-$1.txt"; return 1; }
}
db_run() { # NAME CONFIG READPCT SECS [MORE OPTIONS]
  local name=$1 c=$2 pct=$3 secs=$4; shift 4
  run_timed "$name" "$c" db_bench --benchmarks=readrandomwriterandom --use_existing_db=1 \
    --db="$RUN/fs-$c/db" --num="$KEYS" --readwritepercent="$pct" --duration="$secs" \
    --threads="$THREADS" $DBOPTS "$@"
}
ldb_ok() { ldb --db="$RUN/fs-$1/db" checkconsistency > "$RUN/ldb-$1.txt" 2>&1 && grep -qx OK "$RUN/ldb-$1.txt"; }
phase_rocksdb() {
  local c r pct
  for c in $CONFIGS; do check "$c: db_bench fillrandom $KEYS keys" db_fill "$c"; done
  for r in $(seq 1 "$ROUNDS"); do
    for pct in 80 50; do
      [ "$CHECK" = 1 ] && [ "$pct" = 50 ] && continue
      for c in $(order "$r"); do
        check "$c: db_bench readrandomwriterandom $pct% reads, $DB_SECS s (round $r)" \
          db_run "db$pct-$c-r$r" "$c" "$pct" "$DB_SECS" --report_interval_seconds=1 --report_file="$RUN/db$pct-$c-r$r.csv"
        record rocksdb "db$pct-$c-r$r" "$c" "$r"
        if [ "$CHECK" = 1 ]; then
          check "$c: db_bench reported reads and writes" \
            grep -q 'readrandomwriterandom .* ops/sec.*reads:[1-9].*writes:[1-9]' "$RUN/db$pct-$c-r$r.txt"
          tail -n 1 "$RES" | python3 -c 'import json, sys; r = json.load(sys.stdin)
print("     {:,.0f} ops/s, read p99 {:,.0f} us".format(r.get("ops_s", 0), (r.get("read") or {}).get("p99_us", 0)))'
        fi
      done
    done
  done
  for c in $CONFIGS; do check "$c: ldb checkconsistency" ldb_ok "$c"; done
}

# ---------------------------------------------------------------- mariadb
SB="--db-driver=mysql --mysql-user=root --mysql-db=sbtest --tables=4 --table-size=50000"
my_up() { # CONFIG: mariadbd on $RUN/fs-CONFIG/mysql, socket $RUN/my-CONFIG.sock; sbtest prepared
  local c=$1 d=$RUN/fs-$1/mysql s=$RUN/my-$1.sock i
  rm -rf "$d"; mkdir -p "$d"
  mariadb-install-db --no-defaults --user=root --datadir="$d" --auth-root-authentication-method=socket \
    --skip-test-db > "$RUN/my-install-$c.txt" 2>&1 || { tail -n 5 "$RUN/my-install-$c.txt"; return 1; }
  mariadbd --no-defaults --user=root --datadir="$d" --socket="$s" --skip-networking \
    --pid-file="$RUN/my-$c.pid" --innodb-buffer-pool-size=64M --innodb-flush-method=O_DIRECT \
    --innodb-log-file-size=64M --log-error="$RUN/my-$c.err" > /dev/null 2>&1 &
  MYSQLD_PIDS="$MYSQLD_PIDS $!"
  for i in $(seq 1 150); do [ -S "$s" ] && mariadb --socket="$s" -uroot -e 'select 1' > /dev/null 2>&1 && break; sleep 0.2; done
  mariadb --socket="$s" -uroot -e 'create database sbtest' || { tail -n 5 "$RUN/my-$c.err"; return 1; }
  sysbench oltp_read_write $SB --mysql-socket="$s" prepare > "$RUN/sb-prepare-$c.txt" 2>&1 \
    || { tail -n 5 "$RUN/sb-prepare-$c.txt"; return 1; }
}
my_down() { # CONFIG: shutdown, wait for mariadbd to exit
  local p; p=$(cat "$RUN/my-$1.pid" 2>/dev/null)
  mariadb-admin --socket="$RUN/my-$1.sock" -uroot shutdown > /dev/null 2>&1
  for _ in $(seq 1 150); do [ -n "$p" ] && kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  ! kill -0 "$p" 2>/dev/null
}
phase_mariadb() {
  local c r
  for c in $CONFIGS; do check "$c: mariadbd up, sysbench prepare (4 x 50000 rows)" my_up "$c"; done
  for r in $(seq 1 "$ROUNDS"); do
    for c in $(order "$r"); do
      check "$c: sysbench oltp_read_write $SB_SECS s (round $r)" run_timed "sb-$c-r$r" "$c" \
        sysbench oltp_read_write $SB --mysql-socket="$RUN/my-$c.sock" --threads="$THREADS" \
        --time="$SB_SECS" --percentile=95 run
      record sysbench "sb-$c-r$r" "$c" "$r"
    done
  done
  for c in $CONFIGS; do check "$c: mariadbd shut down" my_down "$c"; rm -rf "$RUN/fs-$c/mysql"; done
}

# ---------------------------------------------------------------- fio
phase_fio() {
  local c r j
  for c in $CONFIGS; do
    check "$c: fio lay out a 512 MiB file" sh -c "fio --name=lay --filename='$RUN/fs-$c/fio.dat' --size=512M \
      --rw=write --bs=1M --direct=1 --ioengine=libaio --iodepth=8 > '$RUN/fio-lay-$c.txt' 2>&1"
  done
  for r in $(seq 1 "$ROUNDS"); do
    for j in randread:4k randwrite:4k read:128k; do
      for c in $(order "$r"); do
        check "$c: fio ${j%:*} ${j#*:} QD 32 (round $r)" run_timed "fio-${j%:*}-$c-r$r" "$c" \
          fio --name="${j%:*}" --filename="$RUN/fs-$c/fio.dat" --size=512M --direct=1 --ioengine=libaio \
          --iodepth=32 --rw="${j%:*}" --bs="${j#*:}" --runtime="$FIO_SECS" --time_based --output-format=json
        record fio "fio-${j%:*}-$c-r$r" "$c" "$r"
      done
    done
  done
  for c in $CONFIGS; do rm -f "$RUN/fs-$c/fio.dat"; done
}

# ---------------------------------------------------------------- failover
# a 4 KiB O_DIRECT write every 10 ms to a file of the ext4 until $RUN/probe.stop: the
# longest gap between two completions, and the errors
probe() {
  python3 - "$RUN/fs-raid6/probe.dat" "$RUN/probe.stop" "$RUN/probe.json" << 'PY'
import json, mmap, os, sys, time
path, stop, out = sys.argv[1:4]
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
os.posix_fallocate(fd, 0, 1 << 20)
buf = mmap.mmap(-1, 4096)
last, worst, at, n, errs, i = time.time(), 0.0, 0.0, 0, [], 0
while not os.path.exists(stop):
    try:
        os.pwritev(fd, [buf], (i % 256) * 4096); os.fdatasync(fd)
        n += 1
    except OSError as e:
        errs.append(f"{time.time():.3f} {e}")
    now = time.time()
    if now - last > worst: worst, at = now - last, last
    last, i = now, i + 1
    time.sleep(0.01)
json.dump({"writes": n, "errors": errs, "longest_gap_s": round(worst, 3), "gap_from": at}, open(out, "w"))
PY
}
fo_move() { fpc_ccli 1 volume move vol --to c2 > "$RUN/fo-move.txt" 2>&1 || { cat "$RUN/fo-move.txt"; return 1; }; }
phase_failover() {
  local owner0 t0 ppid dpid rc tkill tmove newowner
  [[ " $CONFIGS " == *" raid6 "* ]] || cfg_up raid6 || { failed=$((failed + 1)); echo "FAIL raid6 up"; return; }
  [ -d "$RUN/fs-raid6/db" ] || check "raid6: db_bench fillrandom" db_fill raid6
  rm -f "$RUN/probe.stop"
  probe & ppid=$!
  t0=$(ts); echo "$t0" > "$RUN/fo.t0"
  db_run fo raid6 80 "$FO_SECS" --report_interval_seconds=1 --report_file="$RUN/fo.csv" & dpid=$!
  sleep "$FO_MOVE"
  fpc_wait_owner vol 5; owner0=$FPC_OWNER
  tmove=$(el "$t0")
  check "planned move of vol from $owner0 to c2 at ${tmove} s" fo_move
  sleep "$(awk -v a="$FO_KILL" -v b="$(el "$t0")" 'BEGIN{d = a - b; print (d > 0 ? d : 0)}')"
  fpc_wait_owner vol 5; tkill=$(el "$t0")
  fpc_kill "$FPC_OWNER"; echo "$FPC_OWNER $tkill" > "$RUN/fo.kill"
  check "kill -9 of the owner $FPC_OWNER at ${tkill} s; a survivor takes vol over" fpc_wait_owner vol 20 "$FPC_OWNER"
  newowner=$FPC_OWNER
  wait "$dpid"; rc=$?
  touch "$RUN/probe.stop"; wait "$ppid"
  echo "{\"move_at_s\": $tmove, \"kill_at_s\": $tkill, \"owners\": \"$owner0 -> c2 -> (kill) $newowner\"}" > "$RUN/fo.events.json"
  check "db_bench 80/20 ran through both without an error (exit $rc)" test "$rc" = 0
  record failover fo raid6 1
  check "ldb checkconsistency after the failovers" ldb_ok raid6
  check "the probe saw no I/O error" python3 -c "import json,sys; sys.exit(len(json.load(open('$RUN/probe.json'))['errors']) > 0)"
  echo "     longest probe stall: $(python3 -c "import json; print(json.load(open('$RUN/probe.json'))['longest_gap_s'])") s"
}

# ---------------------------------------------------------------- main
say "configurations: $CONFIGS; phases: $PHASES; $ROUNDS round(s); out $OUT"
for c in $CONFIGS; do
  check "$c: ext4 on a loop device up" cfg_up "$c" || finish
done
for p in $PHASES; do
  case $p in
    rocksdb|mariadb|fio|failover) say "phase $p"; others "$p"; "phase_$p";;
    *) echo "unknown phase $p (rocksdb mariadb fio failover)"; failed=$((failed + 1));;
  esac
done
echo "uptime-end $(uptime)" >> "$OUT/conditions.txt"
if [ "$CHECK" != 1 ]; then
  python3 docs/bench/apps-report.py report "$OUT" "$BIN" || failed=$((failed + 1))
fi
finish
