#!/usr/bin/env bash
# tests/failover/run.sh -- cluster failover against the unmodified Linux kernel NVMe/TCP host
# with native multipath, in a QEMU guest (TCG unless KVM works) built from Debian packages
# like tests/interop/run.sh (tests/interop/guest.sh builds both).
#
# The host side (tests/cluster/lib.sh): a 3-member etcd on the bridge address 10.77.0.1,
# six enclosures e1..e6 (namespaces 10.77.0.11..16) exporting one file drive each to the
# controller nodes, and three controller nodes c1..c3 (`flashpool serve` with [cluster],
# namespaces 10.77.0.17..19). Two volumes are made on c1 and served by every node under one
# NQN: vol (raid6 on the six d0 drives, nsid 1) and fsvol (FS_LAYOUT on the six d1 drives,
# nsid 2, the guest's ext4), each in its own ANA group; a volume's owner reports its group
# optimized, the others inaccessible. The guest reaches the nodes through QEMU's user
# networking (slirp connects from the root namespace, which has the bridge) and connects to
# each with --ctrl-loss-tmo=-1 --reconnect-delay=1 --keep-alive-tmo=$KATO, and sets each path
# device's I/O timeout to PATH_IO_TIMEOUT_MS: two multipath namespaces, three paths each. Its
# /init is tests/failover/guest-init.sh.
#
# Each fault case runs fio randwrite + crc32c verify rounds on the multipath device while
# the host does the fault; its RESULT needs fio exit 0 in every round, no verify error,
# exactly one owner of each volume afterwards (every node agrees, one node runs it, the guest
# sees one optimized path to it and it is the owner's), no I/O error in the guest's kernel
# log, the case's own condition, and no stale write on any node (GET /v1/audit). The faults
# hit vol's owner; fsvol moves with it only if that node owned it too. The detail gives
# the largest completion latency (the host-visible stall); no check fails on latency.
#
#   tests/failover/run.sh [all]   setup (apt packages, kernel; cached) + build + run
#   tests/failover/run.sh setup | build | run
#
# Knobs (env): CASES (comma/space list, default all, in this order: planned-move
#   kill9-owner sigstop-owner cut-owner claim-race etcd-leader-loss rejoin-rebuild
#   enclosure-and-owner owner-cut-from-enclosure-and-etcd),
#   RUNS=1 (each fault case that many times; names get #N), GUEST_SUITE=trixie (Debian 13's
#   kernel, 6.12; default Debian 12's, 6.1), KATO=1 (host keep-alive, s),
#   PATH_IO_TIMEOUT_MS=1000 (each path device's queue/io_timeout; 0: nvme-core's),
#   IO_TIMEOUT=0 / ADMIN_TIMEOUT=0 (nvme-core's, s; 0: the kernel's), CONNECT_OPTS (more
#   nvme connect options) -- docs/cluster.md, "Host settings for fast failover";
#   LEASE_MS=2000 (the nodes' lease_ttl_ms), STOP_S=3 (the frozen owner stays stopped this
#   long after the takeover), CUT_S=3 (same for the cut link), RACE_FREEZE_S=3.5,
#   CUT_ENC=3 (the enclosure of the double faults), BACK_S=60 (the volumes optimal again
#   within this after it is restored),
#   ETCD_DOWN_S=2, PRE_S=2 / POST_S=4 (I/O before the fault, after the host is done),
#   BS=16k QD=16 REGION_MB=16 (fio), GAP_MS=250 (shorter I/O gaps count as 0), FS=1 (ext4 on
#   fsvol, written during the faults, e2fsck at the end), FS_LAYOUT=ec4+2 (fsvol's layout on
#   e1..e6:d1; raid5, raid6, ecK+M with K+M <= 6), DRIVE_SIZE=64MiB, GUEST_MEM=1024,
#   GUEST_CPUS=2, ACCEL=auto|tcg|kvm, RUN_TIMEOUT=1800, STUCK_S=420 (no guest output this
#   long: the run is stuck, QEMU is killed), CTL_PORT=15655, FLASHPOOL_BIN,
#   FAILOVER_CACHE (default .cache/failover: initramfs, logs in run/, node state in
#   cluster/), FLASHPOOL_CACHE (the kernel, shared with the interop suite), FORCE=1.
# Output: RESULT lines, per-case timelines in $FAILOVER_CACHE/run/timeline.txt, and last
# "N passed, M failed"; exit 0 only if all passed. Needs root (namespaces).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# clock, ports, results, QEMU launch, guest channel, build, report: tests/lib/harness.sh
# (this suite's serial log carries arrival times, and it answers the guest more often)
# shellcheck source=tests/lib/harness.sh
. "$ROOT/tests/lib/harness.sh"
# shellcheck disable=SC2034   # (read by tests/lib/harness.sh)
SERIAL_STAMPED=1 ANSWER_TRIES=40 ANSWER_PAUSE=0.4 CTL_LINGER=0.3 ANSWER_EXACT=1
BIN=$(flashpool_bin "${FLASHPOOL_BIN:-}")
# GUEST_SUITE=trixie: Debian 13's kernel (6.12, shared with tests/interop/secure.sh's cache)
# with this host's userland (nvme-cli, fio: tests/interop/guest.sh, GUEST_USERLAND=host)
GUEST_SUITE=${GUEST_SUITE:-}; GUEST_USERLAND=host
if [ -n "$GUEST_SUITE" ]; then GUEST_CACHE=${FLASHPOOL_CACHE:-$ROOT/.cache/secure}
else GUEST_CACHE=${FLASHPOOL_CACHE:-$ROOT/.cache/interop}; fi
CACHE=${FAILOVER_CACHE:-$ROOT/.cache/failover${GUEST_SUITE:+-$GUEST_SUITE}}
IRD=$CACHE/initramfs; INITRD=$CACHE/initrd.img; RUN=$CACHE/run
ALL_CASES="planned-move kill9-owner sigstop-owner cut-owner claim-race etcd-leader-loss rejoin-rebuild enclosure-and-owner owner-cut-from-enclosure-and-etcd resv-follow resv-follow-thin"
CASES=$(echo "${CASES:-$ALL_CASES}" | tr , ' ')
RUNS=${RUNS:-1}; KATO=${KATO:-1}; LEASE_MS=${LEASE_MS:-2000}
# the host settings for fast failover (docs/cluster.md, "Host settings for fast failover"):
# nvme-core's I/O and admin timeouts (s; 0: the kernel's defaults, 30 and 60), extra
# `nvme connect` options
IO_TIMEOUT=${IO_TIMEOUT:-0}; ADMIN_TIMEOUT=${ADMIN_TIMEOUT:-0}; CONNECT_OPTS=${CONNECT_OPTS:-}
# the block layer's I/O timeout of each path device to the cluster (ms; 0: nvme-core's io_timeout);
# 1000 lets a silent path's I/O go after 1-2 s on both kernels
PATH_IO_TIMEOUT_MS=${PATH_IO_TIMEOUT_MS:-1000}
STOP_S=${STOP_S:-3}; CUT_S=${CUT_S:-3}; RACE_FREEZE_S=${RACE_FREEZE_S:-3.5}; ETCD_DOWN_S=${ETCD_DOWN_S:-2}
# the double faults: the enclosure cut (with the owner, or from the owner only), and how long
# after its restore every volume must be optimal again on its owner
CUT_ENC=${CUT_ENC:-3}; BACK_S=${BACK_S:-60}
GAP_MS=${GAP_MS:-250}; PRE_S=${PRE_S:-2}; POST_S=${POST_S:-4}; BS=${BS:-16k}; QD=${QD:-16}; REGION_MB=${REGION_MB:-16}; FS=${FS:-1}
DRIVE_SIZE=${DRIVE_SIZE:-64MiB}; RUN_TIMEOUT=${RUN_TIMEOUT:-1800}; STUCK_S=${STUCK_S:-420}
VOL=vol; FSVOL=fsvol; FS_NSID=2; FS_LAYOUT=${FS_LAYOUT:-ec4+2}; NQN=nqn.2026-01.io.flashpool:failover; NENC=6
export FPC_BIN=$BIN FPC_DIR=$CACHE/cluster FPC_LEASE_MS=$LEASE_MS FPC_CLUSTER=failover
FPC_EXPORT_HOSTS="c1 c2 c3"
# shellcheck disable=SC2034   # (do_setup, do_build: tests/lib/harness.sh)
SETUP_PKGS="etcd-server etcd-client e2fsprogs iproute2"
# shellcheck disable=SC2034
GUEST_MODS="crc32c_generic crc32c-intel nvme-core nvme-fabrics nvme-tcp virtio_pci virtio_net ext4"
# shellcheck disable=SC2034
GUEST_BINS="nvme fio mke2fs e2fsck"

. "$ROOT/tests/interop/guest.sh"
. "$ROOT/tests/cluster/lib.sh"
# shellcheck source=tests/failover/cases.sh
. "$HERE/cases.sh"
# shellcheck source=tests/failover/resv.sh
. "$HERE/resv.sh"       # the resv-follow case (host side)

# ---------------------------------------------------------------- build
# (do_build: tests/lib/harness.sh, with these hooks)
build_files() {
  install -m 0755 "$HERE/guest-init.sh" "$IRD/init"
  install -m 0644 "$HERE/resv-guest.sh" "$IRD/etc/resv-guest.sh"   # resv-follow (guest side)
  [ -f /etc/mke2fs.conf ] && install -m 0644 /etc/mke2fs.conf "$IRD/etc/mke2fs.conf"   # defines "ext4"
  return 0
}
build_stamp() { guest_stamp "$0" "$HERE/guest-init.sh" "$ROOT/tests/interop/guest.sh" "$HERE/resv-guest.sh" "$GUEST_KROOT/.extracted"; }

# ---------------------------------------------------------------- run
HR=$RUN/host-results.txt
# the guest's serial lines are "EPOCH TEXT" in serial.log (arrival time; serial strips it)
# hev TEXT: a harness event on the timeline clock
hev() { printf '%s %s\n' "$EPOCHREALTIME" "$*" >> "$RUN/events.log"; say "$*"; }

# the QEMU of a crashed earlier run (its pid file, if that pid still is our QEMU)
kill_old_qemu() {
  local p; p=$(cat "$CACHE/qemu.pid" 2> /dev/null) || return 0
  grep -qaF "$INITRD" "/proc/$p/cmdline" 2> /dev/null && { say "killing the QEMU of an earlier run (pid $p)"; kill -KILL "$p"; }
  rm -f "$CACHE/qemu.pid"
}
QPID=""; F_FAULT_ERR=""; OWNER0=""; EPOCH0=""; FS_OWNER0=""; FS_EPOCH0=""; T_FAULT=$EPOCHREALTIME; F_DETAIL=""
# (cleanup, the EXIT trap: tests/lib/harness.sh) etcd, the nodes and the network
cleanup_more() { fpc_etcd_down; fpc_cleanup; }

# handle ACTION ARGS: one guest request; the answer goes back through the control port
handle() {
  local action=$1 args=$2 st=ok pay=""
  case $action in
    fo-up) fo_up || st=fail; pay="owner=${OWNER0:-none} fsowner=${FS_OWNER0:-none}";;
    connected) fo_connected "$args" || st=fail;;
    prep:*) fo_prep "${action#prep:}" || st=fail; pay="owner=${OWNER0:-none} epoch=${EPOCH0:-none} fsowner=${FS_OWNER0:-none} fsepoch=${FS_EPOCH0:-none}";;
    fault:*) F_FAULT_ERR=""; fo_fault "${action#fault:}" || { st=fail; F_FAULT_ERR=1; };;
    resv:*|check:resv-follow*) resv_handle "$action" "$args" || st=fail; pay=$RESV_PAY;;   # resv-follow
    check:*) fo_check "${action#check:}" "$args" || st=fail;;
    final) fo_final "$args" || st=fail;;
    *) return 0;;
  esac
  answer_guest "$action" "$st${pay:+ $pay}"
}

# run_checks (do_run: tests/lib/harness.sh)
run_checks() {
  local t0=$T0 accel tb="" done_t="" last=0 n line action args handled=" " lastout quiet
  local expect="fo-up fo-connect" c r
  for c in $CASES; do
    case " $ALL_CASES " in *" $c "*) ;; *) echo "unknown case '$c' (cases: $ALL_CASES)"; exit 2;; esac
    if [ "$RUNS" -gt 1 ]; then for r in $(seq 1 "$RUNS"); do expect="$expect $c#$r"; done
    else expect="$expect $c"; fi
  done
  expect="$expect final-verify final-sha256 $([ "$FS" = 1 ] && echo final-fsck) final-dmesg final-one-owner final-stale-writes fo-teardown"
  local nexp; nexp=$(echo "$expect" | wc -w)
  fpc_preflight || abort_run "$nexp" "cannot run here: $FPC_WHY"
  for c in qemu-system-x86_64 etcd etcdctl python3 nvme fio mke2fs; do
    command -v "$c" > /dev/null || abort_run "$nexp" "missing $c: run '$0 setup'"
  done
  [ -x "$BIN" ] || abort_run "$nexp" "no flashpool binary at $BIN (cargo build --release, or FLASHPOOL_BIN)"
  mkdir -p "$FPC_DIR/pids"
  # a crashed earlier run: its QEMU (pid file), nodes, etcd, namespaces, bridge
  kill_old_qemu; fpc_etcd_down; fpc_cleanup
  rm -rf "$RUN"; mkdir -p "$RUN"; : > "$HR"; : > "$RUN/events.log"; : > "$RUN/serial.log"; : > "$RUN/timeline.txt"
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  CTL_PORT=$(free_port "${CTL_PORT:-15655}")
  local hostuuid; hostuuid=$(cat /proc/sys/kernel/random/uuid)
  HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$hostuuid
  qemu_accel; accel=$QEMU_ACCEL
  local append="console=ttyS0 panic=-1 quiet fp_nqn=$NQN fp_port=$FPC_PORT fp_kato=$KATO"
  append="$append fp_ctrls=$(fpc_cip 1),$(fpc_cip 2),$(fpc_cip 3) fp_names=c1,c2,c3"
  append="$append fp_cases=$(echo "$CASES" | tr ' ' ,) fp_runs=$RUNS fp_hostnqn=$HOSTNQN fp_hostid=$hostuuid"
  append="$append fp_iotmo=$IO_TIMEOUT fp_admintmo=$ADMIN_TIMEOUT fp_connopts=$(echo "$CONNECT_OPTS" | tr ' ' ,) fp_pathtmo=$PATH_IO_TIMEOUT_MS"
  append="$append fp_bs=$BS fp_qd=$QD fp_region=$REGION_MB fp_pre=$PRE_S fp_post=$POST_S fp_fs=$FS fp_fsnsid=$FS_NSID fp_gap=$GAP_MS"
  say "accel=$accel kernel=$K initrd=$(du -h "$INITRD" | cut -f1) cases: $CASES (x$RUNS); KATO $KATO s, lease $LEASE_MS ms, nvme_core io_timeout=$IO_TIMEOUT admin_timeout=$ADMIN_TIMEOUT, path io_timeout $PATH_IO_TIMEOUT_MS ms (0: the kernel's)${CONNECT_OPTS:+, connect $CONNECT_OPTS}; logs in $RUN"
  # QPID: timeout's; QEMU's own pid is in $CACHE/qemu.pid (for the clean-up after a crash)
  qemu_start "$K" "$INITRD" "$append" "user,id=n0,ipv6=off,hostfwd=tcp:127.0.0.1:$CTL_PORT-10.0.2.15:5555" \
    -pidfile "$CACHE/qemu.pid"
  lastout=$(ts)
  while kill -0 "$QPID" 2> /dev/null; do
    [ -z "$tb" ] && has_marker '@@ .*init start' && { tb=$(el "$t0"); say "guest /init started after $tb s"; }
    n=$(wc -l < "$RUN/serial.log")
    if [ "$n" -gt "$last" ]; then
      lastout=$(ts)
      tail -n +"$((last + 1))" "$RUN/serial.log" | head -n "$((n - last))" | cut -d' ' -f2- \
        | grep -aE '^(@@ .*(STEP|FAILED|guest checks)|RESULT )' | sed 's/^@@ /[guest] /; s/^RESULT/[guest] RESULT/'
      # new requests of the guest, in order
      while IFS= read -r line; do
        action=${line#@@HOST }; action=${action%% *}; args=${line#"@@HOST $action"}; args=${args# }
        case "$handled" in *" $action "*) continue;; esac
        handled="$handled$action "
        [ "$action" = guest-done ] && { done_t=$(ts); continue; }
        handle "$action" "$args"
        lastout=$(ts)
      done < <(tail -n +"$((last + 1))" "$RUN/serial.log" | head -n "$((n - last))" | cut -d' ' -f2- | grep -a '^@@HOST [^-]' | grep -av '^@@HOST-ACK' | grep -avE "$CORRUPT_MARKER")
      last=$n
    fi
    [ -n "$done_t" ] && { say "guest powered off after $(el "$t0") s"; break; }
    quiet=$(awk -v a="$lastout" -v b="$(ts)" 'BEGIN{printf "%d", b-a}')
    if [ "$quiet" -ge "$STUCK_S" ]; then say "no guest output for $quiet s: stuck, killing QEMU"; break; fi
    sleep 0.2
  done
  # a guest that powered off at once: its last lines may not have been looked at
  [ -z "$done_t" ] && serial | grep -ax '@@HOST guest-done' > /dev/null && { done_t=$(ts); say "guest powered off after $(el "$t0") s"; }
  sleep 1; kill "$QPID" 2> /dev/null; wait "$QPID" 2> /dev/null; QPID=""
  [ -n "$done_t" ] || say "QEMU ended without the guest-done marker (guest crash, stuck, or RUN_TIMEOUT=$RUN_TIMEOUT)"
  fo_teardown
  trap - EXIT
  fpc_etcd_down; fpc_cleanup

  # ---- report
  # shellcheck disable=SC2086   # $expect: the checks, one word each
  tally_results $expect
  if [ -n "$FAILED" ] || [ "${VERBOSE:-0}" = 1 ]; then
    echo "----- guest serial log ($RUN/serial.log), without kernel lines -----"
    serial | grep -av '^@@K ' | tail -n 150
    [ -s "$RUN/qemu.stderr" ] && { echo "----- qemu stderr -----"; cat "$RUN/qemu.stderr"; }
    for c in c1 c2 c3; do
      [ -f "$FPC_DIR/$c.log" ] && { echo "----- $FPC_DIR/$c.log (WARN/ERROR, tail) -----"; grep -aE 'WARN|ERROR|panic' "$FPC_DIR/$c.log" | tail -n 25; }
    done
  fi
  echo "----- summary (kernel $K, accel $accel, guest /init at ${tb:-?} s, total $(el "$t0") s; timelines: $RUN/timeline.txt) -----"
  cat "$RUN/summary.txt"
  report_results
}

suite_main "$@"
