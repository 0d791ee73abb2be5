#!/usr/bin/env bash
# `flashpool attach` on a cluster subsystem (root: network namespaces, FUSE): etcd, three
# enclosures with one file drive each, two controller nodes c1 c2 in cluster mode
# (tests/cluster/lib.sh, its own prefix and network 10.94.0.0/24), a raid1 volume owned by
# c1 and exported by both. The volume is attached through discovery (two paths, ANA), a
# 32 MiB pattern is being written through DIR/disk with O_DIRECT when c1 is killed
# (kill -9): the write must finish without an error on c2 and the pattern read back
# whole; then c1 comes back and the volume is moved to it (`flashpool volume move`): the
# attach follows the ANA change and a second pattern goes through c1. Ends with
# "N passed, N failed"; everything is undone on any exit.
#
#   tests/attach/failover.sh          # needs etcd, iproute2, openssl, a release build
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
# shellcheck source=tests/lib/harness.sh
. tests/lib/harness.sh
BIN=$(flashpool_bin "${BIN:-}")
RUN=$(mktemp -d /tmp/flashpool-attach-fo.XXXXXX) || { echo "mktemp failed (is the disk full?)" >&2; exit 1; }
export FPC_BIN=$BIN FPC_DIR=$RUN/cluster FPC_PREFIX=fpa FPC_NET=10.94.0 FPC_ETCD_BASE=12600
export FPC_CLUSTER=attach FPC_LEASE_MS=2000 FPC_EXPORT_HOSTS="c1 c2"
# shellcheck source=tests/cluster/lib.sh
. tests/cluster/lib.sh
# shellcheck source=tests/lib/attach.sh
. tests/lib/attach.sh
NQN=nqn.2026-01.io.flashpool:attach-fo
DIR=$RUN/mnt
APID=""
QPID=""
TPID=""

passed=0
failed=0
check() { # what, command...
  local what=$1; shift
  if "$@"; then passed=$((passed + 1)); echo "ok   $what"; else failed=$((failed + 1)); echo "FAIL $what"; fi
}
finish() {
  if [ "$failed" -gt 0 ]; then
    echo "----- attach.log -----"; tail -n 40 "$RUN/attach-fo.log" 2>/dev/null
    for n in c1 c2; do echo "----- $n -----"; tail -n 15 "$(fpc_log "$n")" 2>/dev/null; done
  fi
  echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit $?
}
cleanup_more() {
  if [ -n "$APID" ]; then kill -KILL "$APID" 2>/dev/null; wait "$APID" 2>/dev/null; fi
  grep -qs " $DIR " /proc/self/mountinfo && umount -l "$DIR"
  fpc_etcd_down; fpc_cleanup
  if [ "$failed" -gt 0 ]; then echo "(kept $RUN)"; else rm -rf "$RUN"; fi
}
trap cleanup EXIT

fpc_preflight || { echo "cannot run here: $FPC_WHY"; failed=1; finish; }
[ -e /dev/fuse ] || { echo "/dev/fuse missing"; failed=1; finish; }
mkdir -p "$DIR" "$FPC_DIR"
setup() { att_cluster_up 3 2 file:64MiB raid1 "$NQN" vol; }
check "cluster up: etcd, e1..e3, c1 c2; raid1 volume owned by c1" setup || finish

URL="tcp://$(fpc_cip 1):$FPC_PORT/$NQN?nsid=1"
check "attach through discovery" att_start fo "$URL" "$DIR" --discovery "$(fpc_cip 1):$FPC_DISC_PORT" --fail-after 30s || finish
APID=$(att_pid fo)
check "two paths, I/O to c1 (Optimized)" sh -c \
  "grep -q 'multipath (2 paths' '$RUN/attach-fo.log' && grep -q 'I/O now goes to remote tcp://$(fpc_cip 1):' '$RUN/attach-fo.log'"

# kill -9 of the owner while a writer rewrites a 16 MiB pattern in 4 KiB O_DIRECT writes
head -c $((16 << 20)) /dev/urandom > "$RUN/p1"
(
  n=0
  while [ ! -e "$RUN/stop" ] || [ "$n" -lt 2 ]; do
    dd if="$RUN/p1" of="$DIR/disk" bs=4k oflag=direct conv=notrunc status=none 2>>"$RUN/dd1.err" || exit 1
    n=$((n + 1))
  done
  echo "$n" > "$RUN/passes"
) &
WRITER=$!
sleep 2
fpc_kill c1
t0=$(ts)
sleep 4
touch "$RUN/stop"
wait "$WRITER"; rc=$?
check "the writer goes on through the kill of c1 without an error (exit $rc, $(cat "$RUN/passes" 2>/dev/null) passes)" \
  test "$rc" = 0
sw=$(grep -m1 "I/O now goes to remote tcp://$(fpc_cip 2):" "$RUN/attach-fo.log" | cut -d' ' -f1)
after=""
[ -n "$sw" ] && after=$(awk -v a="$t0" -v b="$(date -d "$sw" +%s.%N)" 'BEGIN{printf "%.2f s after the kill", b-a}')
check "the attach moved to c2 (${after:-never})" test -n "$sw"
check "the pattern reads back whole" sh -c "dd if='$DIR/disk' bs=1M count=16 iflag=direct status=none | cmp - '$RUN/p1'"

# c1 back, the volume moved to it: a planned ANA change, followed without an error
check "c1 restarts" fpc_start_ctl 1
movec1() {
  for _ in $(seq 1 100); do [ "$(fpc_cluster_nodes)" = "c1 c2" ] && break; sleep 0.3; done
  fpc_ccli 2 volume move vol --to c1 > "$RUN/move.txt" 2>&1 || { cat "$RUN/move.txt"; return 1; }
}
check "volume move vol --to c1" movec1
follow() {
  for _ in $(seq 1 50); do
    [ "$(grep -c "I/O now goes to remote tcp://$(fpc_cip 1):" "$RUN/attach-fo.log")" -ge 2 ] && return 0
    sleep 0.2
  done
  return 1
}
check "the attach follows the move back to c1" follow
head -c $((8 << 20)) /dev/urandom > "$RUN/p2"
check "a second pattern through c1 reads back" sh -c \
  "dd if='$RUN/p2' of='$DIR/disk' bs=64k seek=256 oflag=direct conv=notrunc status=none &&
   dd if='$DIR/disk' bs=64k skip=256 count=128 iflag=direct status=none | cmp - '$RUN/p2'"
check "no I/O error reported by the attach" sh -c "! grep -q 'failed again\|EIO\|every path' '$RUN/attach-fo.log'"
kill -TERM "$APID"
for _ in $(seq 1 100); do kill -0 "$APID" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$APID" 2>/dev/null; then
  for t in /proc/"$APID"/task/*; do echo "     $(cat "$t/comm") $(cat "$t/wchan" 2>/dev/null)"; done
  rc=124
else
  wait "$APID"; rc=$?; APID=""
fi
check "SIGTERM: exit 0 (exit $rc)" test "$rc" = 0
finish
