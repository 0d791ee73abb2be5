# shellcheck shell=bash
# tests/interop/harness.sh -- the host side shared by the guest suites (tests/interop/run.sh,
# tests/interop/secure.sh): accelerator, free ports, the guest's serial log and its markers,
# the control channel to the guest, `flashpool serve` start and stop, `flashpool bench` runs
# against the guest kernel's nvmet and their --json summaries, random keys. Sourced (bash).
#
# The caller sets: RUN (the run's directory: guest-serial.log, target.log, rev-*), HR (host
# results file), BIN (flashpool), BENCH_BIN, ACCEL, CTL_PORT, IO_PORT/DISC_PORT or
# TARGET_PORTS; for rev_bench also REV_TGT, REV_HOSTNQN, REV_T0, REV_BUDGET.

pick_accel() {
  if [ "$ACCEL" != auto ]; then echo "$ACCEL"; return; fi
  # /dev/kvm may be "kvm_pvm" (nested PVM): only PVM guest kernels run there, a stock
  # Debian kernel hangs after "Probing EDD"
  if [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ] && grep -qE '\b(vmx|svm)\b' /proc/cpuinfo; then
    echo kvm; else echo tcg; fi
}
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

hres() { echo "RESULT $1 $2${3:+ ($3)}" | tee -a "$HR"; }
serial() { tr -d '\r' 2>/dev/null < "$RUN/guest-serial.log" || true; }
# (no 'grep -q' after a pipe: with pipefail an early exit of grep fails the pipe)
has_marker() { serial | grep -a "^$1" > /dev/null; }

TPID=""; QPID=""; TSTART_LINE=0
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
send_ctl() {  # message to the guest through hostfwd 127.0.0.1:CTL_PORT -> guest:5555
  (exec 3<>"/dev/tcp/127.0.0.1/$CTL_PORT" && printf '%s\n' "$1" >&3 && sleep 0.5) 2>/dev/null || true
}
answer_guest() {  # ACTION STATUS: repeat until the guest acknowledges (or 20 s)
  local i=0
  while [ $i -lt 10 ]; do
    send_ctl "DONE $1 $2"
    sleep 1.5
    has_marker "@@HOST-ACK $1" && return 0
    i=$((i+1))
  done
  say "guest did not acknowledge '$1'"
}

# interchange_key PREFIX HH BYTES: a random secret in the NVMe interchange format,
# "PREFIX:HH:base64(key || crc32 of key, little-endian):" (DHHC-1 for DH-HMAC-CHAP,
# NVMeTLSkey-1 for a TLS PSK)
interchange_key() {
  python3 -c 'import base64,os,sys,zlib; k=os.urandom(int(sys.argv[3]));
print("%s:%s:%s:" % (sys.argv[1], sys.argv[2], base64.b64encode(k + zlib.crc32(k).to_bytes(4, "little")).decode()))' "$1" "$2" "$3"
}
# dhchap_key HH BYTES: a random DHHC-1 secret
dhchap_key() { interchange_key DHHC-1 "$1" "$2"; }

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
