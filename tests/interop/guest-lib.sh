# shellcheck shell=dash disable=SC3043
# tests/interop/guest-lib.sh -- shell functions for the /init of the interop guests (busybox
# sh; guest_stage in guest.sh installs it as /etc/guest-lib.sh). Used by the /init of
# tests/interop/run.sh, tests/interop/secure.sh and tests/failover/guest-init.sh.
#
# They read: K (kernel version), HOSTIP, IO (the target's port), CONN_OPTS, HOSTNQN, HOSTID,
# MEM_SIZE, RD_NR (brd), IOTMO (nvme-core timeouts), STEP. Results: "RESULT NAME PASS|FAIL
# (detail)" lines on the console, counted in NPASS/NFAIL.

up() { cut -d' ' -f1 /proc/uptime; }
log() { echo "@@ [$(up)] $*"; }
# (the marker twice: a kernel message on the console can land inside a line)
finish() { log "guest done"; echo "@@HOST guest-done"; sleep 0.2; echo "@@HOST guest-done"; sync; poweroff -f; }
# guest_boot: busybox applets, PATH, the pseudo file systems
guest_boot() {
  /bin/busybox --install -s
  export PATH=/usr/sbin:/usr/bin:/sbin:/bin
  mount -t proc proc /proc; mount -t sysfs sysfs /sys
  mount -t devtmpfs devtmpfs /dev; mount -t tmpfs tmpfs /tmp
}
# load_modules: /etc/modules.list in order (paths under /lib/modules/$K), then configfs
load_modules() {
  local m args out
  while read -r m; do
    args=""
    case $m in
      */brd.ko) args="rd_nr=${RD_NR:-1} rd_size=$((MEM_SIZE/1024))";;
      */nvme-core.ko) args="io_timeout=$IOTMO admin_timeout=$IOTMO";;
    esac
    out=$(insmod /lib/modules/$K/$m $args 2>&1) || log "insmod failed: $m: $out"
  done < /etc/modules.list
  mount -t configfs none /sys/kernel/config
}
# net_up: lo, eth0 as 10.0.2.15 (QEMU user networking), the host NQN and host ID files
net_up() {
  local i=0
  ip link set lo up
  while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
  ip addr add 10.0.2.15/24 dev eth0; ip link set eth0 up
  echo "$HOSTNQN" > /etc/nvme/hostnqn; echo "$HOSTID" > /etc/nvme/hostid
}

NPASS=0; NFAIL=0
# res NAME PASS|FAIL [detail]; on FAIL also the kernel log since the step began (unless
# RES_DMESG=0: a guest that streams its kernel log already)
res() {
  if [ "$2" = PASS ]; then NPASS=$((NPASS+1)); else
    NFAIL=$((NFAIL+1))
    if [ "${RES_DMESG:-1}" != 0 ]; then
      echo "---- $1 failed; kernel log since step '$STEP':"; dmesg | tail -n 30 | sed 's/^/  dmesg: /'
    fi
  fi
  echo "RESULT $1 $2${3:+ ($3)}" | tee -a /tmp/results.txt
}
# needs CHECK PREREQ: 0 if PREREQ passed; else CHECK fails here (a refusal proves nothing when
# the accepted case did not work either)
needs() {
  grep -q "^RESULT $2 PASS" /tmp/results.txt 2> /dev/null && return 0
  res $1 FAIL "not tried: $2 did not pass, so a refusal would prove nothing"; return 1
}
step() { { echo "== step ${STEP:-boot}"; dmesg -c; } >> /tmp/dmesg.all 2>/dev/null; STEP=$1; shift; log "STEP $STEP: $*"; }
# run a command under a timeout, its output indented; returns its status
t() { local s=$1 rc; shift; timeout "$s" "$@" > /tmp/t.out 2>&1; rc=$?; sed 's/^/  | /' /tmp/t.out; return $rc; }

CONN_OPTS="--ctrl-loss-tmo=10 --reconnect-delay=2"
# nvconnect NQN [nvme-connect args]: sets CTRL (nvmeX) and DEV (block device of nsid 1)
nvconnect() {
  local nqn=$1 before rc c n i p d; shift
  CTRL=""; DEV=""
  before=" $(ls /sys/class/nvme 2>/dev/null | tr '\n' ' ') "
  log "nvme connect -t tcp -a $HOSTIP -s $IO -n $nqn $CONN_OPTS $*"
  t 60 nvme connect -t tcp -a $HOSTIP -s $IO -n $nqn $CONN_OPTS "$@"; rc=$?
  log "nvme connect rc=$rc"
  [ $rc -eq 0 ] || return 1
  for c in /sys/class/nvme/nvme*; do
    n=${c##*/}
    case "$before" in *" $n "*) continue;; esac
    [ "$(cat $c/subsysnqn 2>/dev/null)" = "$nqn" ] && CTRL=$n
  done
  [ -n "$CTRL" ] || { log "no new controller for $nqn in /sys/class/nvme"; return 1; }
  i=0
  while [ $i -lt 75 ]; do     # namespace scan is asynchronous
    # multipath: nvme<subsys>c<ctrl>n<ns> is the path, nvme<subsys>n<ns> the block device
    p=$(ls /sys/class/nvme/$CTRL 2>/dev/null | grep -E '^nvme[0-9]+(c[0-9]+)?n1$' | head -n1)
    if [ -n "$p" ]; then
      d=$(echo $p | sed 's/c[0-9]*n/n/')
      [ -b /dev/$d ] && { DEV=$d; break; }
    fi
    sleep 0.2; i=$((i+1))
  done
  log "controller $CTRL state=$(cat /sys/class/nvme/$CTRL/state) cntlid=$(cat /sys/class/nvme/$CTRL/cntlid 2>/dev/null) block=${DEV:-none}"
  [ -n "$DEV" ]
}
nvdisconnect() {
  local i
  t 30 nvme disconnect -n $1
  i=0; while ls /sys/class/nvme 2>/dev/null | grep -q . && [ $i -lt 50 ]; do
    grep -qx "$1" /sys/class/nvme/*/subsysnqn 2>/dev/null || break; sleep 0.2; i=$((i+1)); done
}
# io-queue count of a controller: sysfs queue_count (admin + I/O) if present, else dmesg
ioqueues() {
  if [ -r /sys/class/nvme/$1/queue_count ]; then echo $(( $(cat /sys/class/nvme/$1/queue_count) - 1 ))
  else dmesg | grep "$1: creating" | tail -n1 | sed -n 's/.*creating \([0-9]*\) I\/O queues.*/\1/p'; fi
}
sha_dev() {  # dev offset_MiB count_MiB
  timeout 120 dd if=/dev/$1 bs=1M skip=$2 count=$3 iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1
}
# write_check dev offset_MiB count_MiB -> sets H (sha256 of what was written); 0 if read-back equal
write_check() {
  local t0 h
  dd if=/dev/urandom of=/tmp/pat bs=1M count=$3 2>/dev/null
  H=$(sha256sum < /tmp/pat | cut -d' ' -f1)
  t0=$(up)
  t 120 dd if=/tmp/pat of=/dev/$1 bs=1M seek=$2 oflag=direct conv=fsync,notrunc
  h=$(sha_dev $1 $2 $3)
  log "dd $3 MiB at ${2} MiB write+read on /dev/$1: $(awk -v a=$t0 -v b=$(up) 'BEGIN{print b-a}') s"
  echo "  sha256 written $H"; echo "  sha256 read    $h"
  [ "$H" = "$h" ]
}
trim() { sed -e 's/^[^:]*: *//' -e 's/ *$//'; }
# guards before shell arithmetic (a malformed number there would end /init)
ishex() { case $1 in ''|*[!0-9a-fA-F]*) return 1;; esac; }
isnum() { case $1 in ''|*[!0-9]*) return 1;; esac; }
# wait_host ACTION SECONDS [ARGS]: print the marker "@@HOST ACTION [ARGS]", wait for "DONE
# ACTION ok|fail ..." from the host (host -> 127.0.0.1:CTL_PORT -> QEMU hostfwd -> guest:5555,
# busybox nc -l; what the host sends piles up in /tmp/ctl), running $WAIT_HOOK (if set) at each
# poll; the host's line in HOSTSAYS, 0 if it said ok
wait_host() {
  local ncpid i
  rm -f /tmp/ctl; : > /tmp/ctl
  nc -l -p 5555 >> /tmp/ctl 2> /dev/null & ncpid=$!
  sleep 0.1
  echo "@@HOST $1${3:+ $3}"
  i=0; HOSTSAYS=""
  while [ $i -lt $(($2 * 10)) ]; do
    if grep -q "^DONE $1 " /tmp/ctl; then HOSTSAYS=$(grep "^DONE $1 " /tmp/ctl | head -n1); break; fi
    # again every 5 s: a kernel message on the console can land inside the line, and the
    # host reads only lines that begin with the marker (it acts on each action once)
    [ $i -gt 0 ] && [ $((i % 50)) = 0 ] && echo "@@HOST $1${3:+ $3}"
    [ -z "$WAIT_HOOK" ] || $WAIT_HOOK
    if ! kill -0 $ncpid 2> /dev/null; then nc -l -p 5555 >> /tmp/ctl 2> /dev/null & ncpid=$!; fi
    sleep 0.1; i=$((i+1))
  done
  kill $ncpid 2> /dev/null
  log "host says: ${HOSTSAYS:-nothing (timeout ${2}s)}"
  echo "@@HOST-ACK $1"
  case "$HOSTSAYS" in "DONE $1 ok"*) return 0;; esac; return 1
}

# ---- DH-HMAC-CHAP
auth_io() {  # check nqn [detail]: 1 MiB written and read back on the new controller
  if write_check $DEV 0 1; then res $1 PASS "$CTRL${3:+, $3}, 1 MiB read back equal"
  else res $1 FAIL "$CTRL: the data read back differs"; fi
  nvdisconnect $2
}
# auth_ok CHECK NQN DETAIL [secret options]: connect, then as auth_io
auth_ok() {
  local c=$1 n=$2 d=$3; shift 3
  if nvconnect $n "$@"; then auth_io $c $n "$d"; else res $c FAIL "nvme connect failed"; fi
}
auth_refused() {  # check nqn [secret options]: the connect must fail and leave no controller
  # (the detail: the last kernel line matching $REFUSE_LOG, default auth|dhchap)
  local c=$1 n=$2 rc ok=FAIL; shift 2
  timeout 60 nvme connect -t tcp -a $HOSTIP -s $IO -n $n $CONN_OPTS "$@" > /tmp/auth.txt 2>&1; rc=$?
  sed 's/^/  | /' /tmp/auth.txt
  dmesg | grep -iE 'nvme|auth' | tail -n 5 | sed 's/^/  dmesg: /'
  [ $rc -ne 0 ] && ok=PASS
  grep -qx "$n" /sys/class/nvme/*/subsysnqn 2>/dev/null && { ok=FAIL; nvdisconnect $n; }
  res $c $ok "nvme connect rc=$rc: $(dmesg | grep -iE "${REFUSE_LOG:-auth|dhchap}" | tail -n1 | sed 's/^\[[^]]*\] //')"
}
