# shellcheck shell=bash
# tests/lib/harness.sh -- the host side every shell suite shares: tests/interop/run.sh,
# tests/interop/secure.sh, tests/failover/run.sh, tests/cluster/run.sh and tests/metrics/run.sh
# source it (bash) instead of each defining its own clock, ports, results, node TOML, QEMU
# launch, guest channel, initramfs build and report. The guest image itself is
# tests/interop/guest.sh; the guest's /init helpers are tests/interop/guest-lib.sh; the
# multi-node plumbing is tests/cluster/lib.sh.
#
#   clock, log        ts, el T0, say TEXT
#   ports             port_busy PORT, free_port PORT, assign_ports NAME=DEFAULT...
#   binaries          flashpool_bin [VALUE]: VALUE (a suite's knob) or the release build
#   results           hres NAME PASS|FAIL [DETAIL] (appends to $HR), abort_run N TEXT...
#   node TOML         toml_listener, toml_subsystem, toml_namespace, toml_drive
#   guest suites      suite_main ARG... (setup | build | run | all), do_setup, do_build,
#                     build_if_stale, do_run (then the suite's run_checks), pick_accel,
#                     qemu_accel, qemu_start, serial, has_marker, guest_progress, send_ctl,
#                     answer_guest, tally_results, report_results, dump_guest_logs
#   target            start_target, start_target_or_fail N, stop_target (flashpool serve),
#                     cleanup (the EXIT trap: QEMU, the target, the suite's cleanup_more)
#   keys              interchange_key, dhchap_key
#   reverse direction rev_bench, rev_pair, jget, verify_counts, bench_detail (flashpool bench
#                     against the guest kernel's nvmet)
#
# The caller sets (what it uses of): ROOT (the repository), RUN (the run's directory), HR
# (host results file), BIN (flashpool), BENCH_BIN, RUN_TIMEOUT,
# CTL_PORT, IO_PORT/DISC_PORT or TARGET_PORTS, CACHE/IRD/INITRD/GUEST_MODS/GUEST_BINS and the
# hooks build_files, build_stamp (do_build), SETUP_PKGS/USERLAND (do_setup), run_checks
# (do_run), suite_flag (suite_main); for rev_bench also REV_TGT, REV_HOSTNQN, REV_T0,
# REV_BUDGET. Knobs of the guest channel (defaults: the interop suites'): SERIAL_STAMPED=1
# (the serial log is $RUN/serial.log with an arrival time before each line, else
# $RUN/guest-serial.log as QEMU wrote it), ANSWER_TRIES=10, ANSWER_PAUSE=1.5, CTL_LINGER=0.5,
# ANSWER_EXACT=1 (the acknowledgement must be the whole line, else a prefix).

export PATH="$PATH:/usr/sbin:/sbin"   # ip, modprobe, mke2fs for a user without them on PATH

# ---------------------------------------------------------------- clock, log
ts() { date +%s.%N; }
el() { awk -v a="$1" -v b="$(ts)" 'BEGIN{printf "%.1f", b-a}'; }
say() { echo "[host $(date +%T)] $*"; }

# ---------------------------------------------------------------- ports
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() { local p=$1; while port_busy "$p"; do p=$((p+1)); done; echo "$p"; }
# assign_ports NAME=DEFAULT...: each NAME gets the first free port from its value in the
# environment (else DEFAULT) on that no earlier NAME took
assign_ports() {
  local a n p taken=" "
  for a in "$@"; do
    n=${a%%=*}; p=$(free_port "${!n:-${a#*=}}")
    while [[ "$taken" == *" $p "* ]]; do p=$(free_port $((p + 1))); done
    printf -v "$n" %s "$p"; taken="$taken$p "
  done
}

# ---------------------------------------------------------------- binaries
# flashpool_bin [VALUE]: VALUE (an env knob) or the release build of the shared target dir,
# made absolute against $ROOT
flashpool_bin() {
  local b=${1:-${CARGO_TARGET_DIR:-$ROOT/target}/release/flashpool}
  case $b in /*) ;; *) b=$ROOT/$b;; esac
  echo "$b"
}

# ---------------------------------------------------------------- results
hres() { echo "RESULT $1 $2${3:+ ($3)}" | tee -a "$HR"; }
# tests/cluster/lib.sh reports through fpc_result: its RESULT lines go to $HR too
fpc_result() { hres "$@"; }
# abort_run N TEXT...: the suite cannot run: TEXT, then every one of its N checks failed
abort_run() { local n=$1; shift; printf '%s\n' "$@"; echo "0 passed, $n failed"; exit 1; }

# ---------------------------------------------------------------- node TOML
# toml_listener PORT KIND [TLS]: a [[listener]] on 127.0.0.1
toml_listener() {
  printf '\n[[listener]]\naddress = "127.0.0.1"\nport = %s\nkind = "%s"\n' "$1" "$2"
  if [ -n "${3:-}" ]; then printf 'tls = "%s"\n' "$3"; fi
}
# toml_subsystem NQN [LINE...]: a [[subsystem]] with more key lines
toml_subsystem() { printf '\n[[subsystem]]\nnqn = "%s"\n' "$1"; shift; [ $# -eq 0 ] || printf '%s\n' "$@"; }
# toml_namespace NSID BACKEND [LINE...]: a [[subsystem.namespace]] of the last subsystem
toml_namespace() {
  printf '\n[[subsystem.namespace]]\nnsid = %s\nbackend = "%s"\n' "$1" "$2"; shift 2
  [ $# -eq 0 ] || printf '%s\n' "$@"
}
# toml_drive NAME BACKEND SIZE [LINE...]: a [[drive]]
toml_drive() {
  printf '\n[[drive]]\nname = "%s"\nbackend = "%s"\nsize = "%s"\n' "$1" "$2" "$3"; shift 3
  [ $# -eq 0 ] || printf '%s\n' "$@"
}

# ---------------------------------------------------------------- guest (QEMU)
# the guest suites' knobs (env): ACCEL=auto|tcg|kvm GUEST_MEM=1024 (MiB) GUEST_CPUS=2
ACCEL=${ACCEL:-auto}; GUEST_MEM=${GUEST_MEM:-1024}; GUEST_CPUS=${GUEST_CPUS:-2}
pick_accel() {
  if [ "$ACCEL" != auto ]; then echo "$ACCEL"; return; fi
  # /dev/kvm may be "kvm_pvm" (nested PVM): only PVM guest kernels run there, a stock
  # Debian kernel hangs after "Probing EDD"
  if [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ] && grep -qE '\b(vmx|svm)\b' /proc/cpuinfo; then
    echo kvm; else echo tcg; fi
}
# qemu_accel: QEMU_ACCEL (kvm or tcg, pick_accel) and QEMU_CPU (its qemu options)
qemu_accel() {
  QEMU_ACCEL=$(pick_accel)
  if [ "$QEMU_ACCEL" = kvm ]; then QEMU_CPU="-accel kvm -cpu host"; else QEMU_CPU="-accel tcg,thread=multi -cpu max"; fi
}
# qemu_start KVER INITRD APPEND NETDEV [QEMU OPTION...]: the guest (kernel KVER of
# $GUEST_KROOT) in the background under `timeout -s KILL $RUN_TIMEOUT`, its pid in QPID; its
# console in $RUN/guest-serial.log, or (SERIAL_STAMPED=1) each line stamped in $RUN/serial.log
qemu_start() {
  local k=$1 initrd=$2 append=$3 netdev=$4; shift 4
  [ -n "${QEMU_CPU:-}" ] || qemu_accel
  if [ "${SERIAL_STAMPED:-0}" = 1 ]; then
    # shellcheck disable=SC2086   # $QEMU_CPU: several options
    timeout -s KILL "$RUN_TIMEOUT" qemu-system-x86_64 $QEMU_CPU -m "$GUEST_MEM" -smp "$GUEST_CPUS" \
      -nodefaults -display none -no-reboot -serial stdio "$@" \
      -kernel "$GUEST_KROOT/boot/vmlinuz-$k" -initrd "$initrd" -append "$append" \
      -netdev "$netdev" -device virtio-net-pci,netdev=n0 < /dev/null 2> "$RUN/qemu.stderr" > >(stamp_lines >> "$RUN/serial.log") &
    QPID=$!   # timeout's (a -pidfile option names QEMU's own)
  else
    # shellcheck disable=SC2086
    timeout -s KILL "$RUN_TIMEOUT" qemu-system-x86_64 $QEMU_CPU -m "$GUEST_MEM" -smp "$GUEST_CPUS" \
      -nodefaults -display none -no-reboot -serial "file:$RUN/guest-serial.log" "$@" \
      -kernel "$GUEST_KROOT/boot/vmlinuz-$k" -initrd "$initrd" -append "$append" \
      -netdev "$netdev" -device virtio-net-pci,netdev=n0 > "$RUN/qemu.stderr" 2>&1 &
    QPID=$!
    touch "$RUN/guest-serial.log"
  fi
}
# stamp_lines: each line of stdin as "EPOCH TEXT" (its arrival time; no CR)
stamp_lines() { local l; while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "${l//$'\r'/}"; done; }
# serial: the guest's console so far, as it printed it
# A kernel console message can land inside a line the guest writes: a "@@HOST" line with a
# kernel timestamp in it is such a line, and is left out (the guest says its requests again).
CORRUPT_MARKER='^@@HOST.*\[ *[0-9]+\.[0-9]{6}\]'
serial() {
  { if [ "${SERIAL_STAMPED:-0}" = 1 ]; then cut -d' ' -f2- "$RUN/serial.log" 2> /dev/null
    else tr -d '\r' 2>/dev/null < "$RUN/guest-serial.log"; fi; } | grep -avE "$CORRUPT_MARKER" || true
}
# (no 'grep -q' after a pipe: with pipefail an early exit of grep fails the pipe)
has_marker() { serial | grep -a "^$1" > /dev/null; }
# guest_progress: the guest's STEP and RESULT lines not shown yet (GUEST_SHOWN counts them)
GUEST_SHOWN=0
guest_progress() {
  local n; n=$(serial | grep -acE '^(@@ .*STEP|RESULT )' || true)
  [ "$n" -gt "$GUEST_SHOWN" ] || return 0
  serial | grep -aE '^(@@ .*STEP|RESULT )' | tail -n +"$((GUEST_SHOWN+1))" | sed 's/^@@ /[guest] /; s/^RESULT/[guest] RESULT/'
  GUEST_SHOWN=$n
}
# (bounded: a connect whose SYNs go unanswered would retry for two minutes, and the host's
# loop, which also watches the guest, would stand still meanwhile)
send_ctl() {  # message to the guest through hostfwd 127.0.0.1:CTL_PORT -> guest:5555
  timeout 10 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "%s\n" "$2" >&3 && sleep "$3"' \
    _ "$CTL_PORT" "$1" "${CTL_LINGER:-0.5}" 2>/dev/null || true
}
# answer_guest ACTION "STATUS [PAYLOAD]": repeat until the guest acknowledges (ANSWER_TRIES
# times, ANSWER_PAUSE s apart)
answer_guest() {
  local i=0
  while [ $i -lt "${ANSWER_TRIES:-10}" ]; do
    send_ctl "DONE $1 $2"
    sleep "${ANSWER_PAUSE:-1.5}"
    if [ "${ANSWER_EXACT:-0}" = 1 ]; then serial | grep -axF "@@HOST-ACK $1" > /dev/null && return 0
    else has_marker "@@HOST-ACK $1" && return 0; fi
    i=$((i+1))
  done
  say "guest did not acknowledge '$1'"
}

# suite_main ARG...: the suite's action, setup | build | run | all (the default: each in turn,
# stopping at the first that fails), and its own flags (hook suite_flag FLAG: 0 if it took
# FLAG; SUITE_FLAGS names them in the usage line); -h prints the script's header comment
suite_main() {
  local a action=all s rc
  for a in "$@"; do
    case $a in
      setup|build|run|all) action=$a;;
      -h|--help) sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
      *) if ! { declare -F suite_flag > /dev/null && suite_flag "$a"; }; then
           echo "usage: $0 [setup|build|run|all]${SUITE_FLAGS:+ [$SUITE_FLAGS]}"; exit 2
         fi;;
    esac
  done
  mkdir -p "$CACHE"
  case $action in
    all) for s in do_setup do_build do_run; do "$s"; rc=$?; [ "$rc" = 0 ] || exit "$rc"; done;;
    *) "do_$action";;
  esac
}
# do_setup: the host's packages (guest.sh's and $SETUP_PKGS) and the kernel; with a Debian
# suite of its own also the guest's $USERLAND packages
do_setup() {
  local rc
  # shellcheck disable=SC2086   # package lists
  guest_setup ${SETUP_PKGS:-}; rc=$?
  [ "$rc" = 0 ] || return "$rc"
  # shellcheck disable=SC2086
  if [ -n "${USERLAND:-}" ]; then guest_userland $USERLAND; fi
}
# do_run: T0 (the run's start), K (the guest kernel), a fresh initramfs, then the suite's
# run_checks
do_run() {
  # shellcheck disable=SC2034   # (run_checks reads T0)
  T0=$(ts); K=$(guest_kver)
  [ -n "$K" ] || abort_run 1 "no kernel: run '$0 setup' first"
  build_if_stale
  run_checks
}

# do_build: the suite's initramfs $INITRD: $GUEST_MODS and $GUEST_BINS (names on the host's
# PATH, or absolute paths) staged by guest_stage in $IRD, the suite's files (hook
# build_files: its /init ...), packed, and the stamp of its inputs (hook build_stamp) beside
# it. Optional hooks: build_prepare (before; exits when the build cannot be made),
# build_check (after).
# shellcheck disable=SC2153   # INITRD, IRD, CACHE: the caller's
do_build() {
  local t0 b bins=(); t0=$(ts)
  if declare -F build_prepare > /dev/null; then build_prepare; fi
  for b in $GUEST_BINS; do case $b in /*) bins+=("$b");; *) bins+=("$(command -v "$b")");; esac; done
  guest_stage "$IRD" "$GUEST_MODS" "${bins[@]}" || exit 1
  build_files
  guest_pack "$IRD" "$INITRD"
  build_stamp > "$CACHE/.built-from"   # run rebuilds when these changed
  if declare -F build_check > /dev/null; then build_check; fi
  say "modules: $(tr '\n' ' ' < "$IRD/etc/modules.list" | sed 's#[^ ]*/##g')"
  say "initramfs $(du -h "$INITRD" | cut -f1) built in $(el "$t0") s"
}
# build_if_stale: do_build unless $INITRD exists and was built from what build_stamp says now
build_if_stale() {
  if [ ! -f "$INITRD" ] || ! build_stamp | cmp -s - "$CACHE/.built-from"; then do_build; fi
}

# tally_results CHECK...: the last RESULT line of each check, from the guest's console and
# $HR, in $RUN/summary.txt (a check without one fails "not reached", also noted in
# $RUN/results.txt); N_PASS, N_FAIL, FAILED (" name..."). A suite may define
# result_override NAME LINE to print a failing check's line anew.
tally_results() {
  local c line
  N_PASS=0; N_FAIL=0; FAILED=""
  { serial | grep -a '^RESULT ' || true; cat "$HR"; } > "$RUN/results.txt"
  : > "$RUN/summary.txt"
  for c in "$@"; do
    line=$(grep -a "^RESULT $c " "$RUN/results.txt" | tail -n1 || true)
    if [ -z "$line" ]; then line="RESULT $c FAIL (no result: not reached)"; echo "$line" >> "$RUN/results.txt"; fi
    if [[ "$line" != "RESULT $c PASS"* ]] && declare -F result_override > /dev/null; then line=$(result_override "$c" "$line"); fi
    if [[ "$line" == "RESULT $c PASS"* ]]; then N_PASS=$((N_PASS+1)); else N_FAIL=$((N_FAIL+1)); FAILED="$FAILED $c"; fi
    echo "$line" >> "$RUN/summary.txt"
  done
}
# report_results: after the suite's notes, the failed checks and "N passed, N failed"; its
# status 0 only if none failed
report_results() {
  [ -z "$FAILED" ] || echo "failed:$FAILED"
  echo "$N_PASS passed, $N_FAIL failed"
  [ "$N_FAIL" -eq 0 ]
}
# dump_guest_logs: the guest's console (ANSI stripped) and QEMU's stderr
dump_guest_logs() {
  echo "----- guest serial log ($RUN/guest-serial.log, ANSI stripped) -----"
  sed -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' -e 's/\r//g' "$RUN/guest-serial.log" 2>/dev/null || true
  if [ -s "$RUN/qemu.stderr" ]; then echo "----- qemu stderr -----"; cat "$RUN/qemu.stderr"; fi
}

# ---------------------------------------------------------------- target (flashpool serve)
TPID=""; QPID=""; TSTART_LINE=0
# cleanup (a run's EXIT trap): QEMU (QPID) and the target (TPID) killed, then the suite's
# hook cleanup_more (its nodes, namespaces, files)
cleanup() {
  if [ -n "$QPID" ]; then kill "$QPID" 2>/dev/null || true; wait "$QPID" 2>/dev/null || true; fi
  if [ -n "$TPID" ]; then kill -KILL "$TPID" 2>/dev/null || true; wait "$TPID" 2>/dev/null || true; fi
  QPID=""; TPID=""
  if declare -F cleanup_more > /dev/null; then cleanup_more; fi
}
tlog_since() { tail -n +"$((TSTART_LINE+1))" "$RUN/target.log" 2>/dev/null || true; }
# start_target: `$BIN serve -c $RUN/target.toml` in the background, its log appended to
# $RUN/target.log; 0 once it logged "listening on" for every port of $TARGET_PORTS (default
# $IO_PORT and $DISC_PORT)
start_target() {
  TSTART_LINE=$(wc -l < "$RUN/target.log" 2>/dev/null || echo 0)
  echo "=== start $(date +%T.%N) ===" >> "$RUN/target.log"
  TSTART_LINE=$((TSTART_LINE+1))
  "$BIN" serve -c "$RUN/target.toml" >> "$RUN/target.log" 2>&1 &
  TPID=$!
  local i=0 p up ports=${TARGET_PORTS:-$IO_PORT $DISC_PORT}
  while [ $i -lt 100 ]; do
    if ! kill -0 "$TPID" 2>/dev/null; then say "flashpool exited during start-up"; return 1; fi
    up=1
    for p in $ports; do tlog_since | grep -F "listening on 127.0.0.1:$p (" > /dev/null || up=0; done
    if [ $up = 1 ]; then say "flashpool pid $TPID listening on $(echo $ports | sed 's/\([0-9]*\)/:\1/g')"; return 0; fi
    sleep 0.1; i=$((i+1))
  done
  say "flashpool did not log 'listening on' for every port ($ports) within 10 s"; return 1
}
stop_target() {    # SIGTERM, wait up to 15 s; 0 if it exited 0 and logged "stopped cleanly"
  local i=0 rc=0
  [ -n "$TPID" ] || return 1
  kill -TERM "$TPID" 2>/dev/null || true
  while kill -0 "$TPID" 2>/dev/null && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done
  if kill -0 "$TPID" 2>/dev/null; then
    say "flashpool still running 15 s after SIGTERM: SIGKILL"; kill -KILL "$TPID" 2>/dev/null || true
    wait "$TPID" 2>/dev/null || true; TPID=""; STOP_DETAIL="hung after SIGTERM"; return 1
  fi
  wait "$TPID" || rc=$?
  TPID=""
  STOP_DETAIL="exit status $rc after $(awk -v i=$i 'BEGIN{print i/10}') s"
  if ! tlog_since | grep 'stopped cleanly' > /dev/null; then STOP_DETAIL="$STOP_DETAIL, no 'stopped cleanly' in log"; return 1; fi
  [ "$rc" -eq 0 ]
}
# start_target_or_fail N: start_target, or print its log and config and fail all N checks
start_target_or_fail() {
  start_target && return 0
  echo "----- target log -----"; cat "$RUN/target.log"; echo "----- config -----"; cat "$RUN/target.toml"
  abort_run "$1" "RESULT target-start FAIL (every check fails: no target)"
}
# ---------------------------------------------------------------- keys
# interchange_key PREFIX HH BYTES: a random secret in the NVMe interchange format,
# "PREFIX:HH:base64(key || crc32 of key, little-endian):" (DHHC-1 for DH-HMAC-CHAP,
# NVMeTLSkey-1 for a TLS PSK)
interchange_key() {
  python3 -c 'import base64,os,sys,zlib; k=os.urandom(int(sys.argv[3]));
print("%s:%s:%s:" % (sys.argv[1], sys.argv[2], base64.b64encode(k + zlib.crc32(k).to_bytes(4, "little")).decode()))' "$1" "$2" "$3"
}
# dhchap_key HH BYTES: a random DHHC-1 secret
dhchap_key() { interchange_key DHHC-1 "$1" "$2"; }

# ---------------------------------------------------------------- reverse direction
REV_T0=""
# rev_bench NAME TIMEOUT ARGS...: one bench run, output in $RUN/rev-NAME.{txt,json}; its status
rev_bench() {
  local n=$1 s=$2 rc=0 t; shift 2
  local left; left=$(awk -v a="$REV_T0" -v b="$(ts)" -v B="$REV_BUDGET" 'BEGIN{printf "%d", B-(b-a)}')
  if [ "$left" -le 0 ]; then
    echo "not run: the reverse-direction budget (REV_BUDGET=$REV_BUDGET s) is spent" > "$RUN/rev-$n.txt"
    say "bench $n: not run (REV_BUDGET spent)"; return 124
  fi
  [ "$s" -gt "$left" ] && s=$left
  rm -f "$RUN/rev-$n.json"
  t=$(ts)
  echo "\$ $BENCH_BIN bench --target $REV_TGT --hostnqn $REV_HOSTNQN -q --json $RUN/rev-$n.json $*" > "$RUN/rev-$n.txt"
  timeout -k 5 "$s" "$BENCH_BIN" bench --target "$REV_TGT" --hostnqn "$REV_HOSTNQN" -q \
      --json "$RUN/rev-$n.json" "$@" >> "$RUN/rev-$n.txt" 2>&1 || rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "(killed by timeout after $s s)" >> "$RUN/rev-$n.txt"
  say "bench $n: exit $rc in $(el "$t") s: $*"
  sed '1d; s/^/    | /' "$RUN/rev-$n.txt"
  return $rc
}
# jget FILE EXPR: a field of a bench --json summary (python expression on d), "" if none
PY3=""   # set by run_reverse: the interpreter itself, not a version-manager shim (~0.3 s a call)
jget() {
  "${PY3:-python3}" - "$1" "$2" <<'PY' 2>/dev/null || true
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    v = eval(sys.argv[2], {"d": d})
    print("" if v is None else v)
except Exception:
    pass
PY
}
# verify_counts NAME: "checked=C readback=R mismatches=M" from rev-NAME.json
verify_counts() {
  local v; v=$(jget "$RUN/rev-$1.json" '"checked=%d readback=%d mismatches=%d" % tuple(d["verify"][k] for k in ("checked_blocks", "readback_blocks", "mismatches"))')
  echo "${v:-no verify summary in rev-$1.json}"
}
# rev_pair NAME SEED BYTES TIMEOUT WRITE_RW ARGS...: a verified WRITE_RW pass over the first
# BYTES, then a verified sequential read pass with the same seed; 0 if both exit 0, the
# write pass read back every block and the read pass checked every block again, without
# mismatches. Sets PAIR_DETAIL.
rev_pair() {
  local n=$1 seed=$2 size=$3 s=$4 wrw=$5 wrc=0 rrc=0 wv rv blocks; shift 5
  rev_bench "$n-write" "$s" --rw "$wrw" "$@" --verify --size "$size" --seed "$seed" || wrc=$?
  rev_bench "$n-read" "$s" --rw read "$@" --verify --size "$size" --seed "$seed" || rrc=$?
  wv=$(verify_counts "$n-write"); rv=$(verify_counts "$n-read")
  blocks=$(( size / ${REV_LBA:-512} ))
  PAIR_DETAIL="write exit $wrc ($wv), read exit $rrc ($rv), $blocks blocks"
  [ $wrc -eq 0 ] && [ $rrc -eq 0 ] || return 1
  [[ "$wv" == "checked="*" readback=$blocks mismatches=0" ]] || { PAIR_DETAIL="$PAIR_DETAIL: the write pass did not read back every block"; return 1; }
  [[ "$rv" == "checked=$blocks readback="*" mismatches=0" ]] || { PAIR_DETAIL="$PAIR_DETAIL: the read pass did not check every block"; return 1; }
}
bench_detail() { jget "$RUN/rev-$1.json" 'd["target_detail"]'; }
