#!/bin/busybox sh
# shellcheck shell=dash disable=SC2039,SC3043,SC2013,SC2002,SC2010,SC2046,SC2086,SC2012,SC2015
# PID 1 of the failover guest (tests/failover/run.sh copies it into the initramfs as /init).
# The unmodified Linux NVMe/TCP host with native multipath (nvme_core multipath=Y, Debian's
# default) connects to every controller node of the cluster: one subsystem with two
# multipath namespaces (nsid 1: the cluster volume vol; nsid 2: fsvol, with ext4 on it),
# one path per node each. For each fault case fio writes and verifies (crc32c) on nsid 1's
# multipath device, and small files go to the ext4 on nsid 2, while the host, asked by a
# marker "@@HOST fault:NAME" on ttyS0, does the fault;
# then "@@HOST check:NAME key=value..." hands the host what the guest saw (fio rounds,
# verify errors, the largest completion latency, I/O errors in the kernel log, the paths'
# ANA states) and the host prints the case's RESULT. The host answers a marker through
# QEMU hostfwd 127.0.0.1:CTL_PORT -> guest:5555 ("DONE ACTION ok|fail ..."), as in
# tests/interop/run.sh. Kernel log lines (nvme, block errors) are streamed as "@@K ..." and
# I/O stalls as "@@IO ..." lines; the host stamps every serial line with its arrival time.
. /etc/guest-lib.sh     # tests/interop/guest-lib.sh: guest_boot, log, finish, res, wait_host
# shellcheck disable=SC1091
. /etc/resv-guest.sh    # tests/failover/resv-guest.sh: the resv-follow case (resv_case)
guest_boot
trap finish EXIT
K=$(cat /etc/kver)

NQN=""; CTRLS=""; NAMES=""; PORT=4420; KATO=1; IOTMO=0; ADMINTMO=0; CONNOPTS=""; PATHTMO=0; CASES=""; RUNS=1; HOSTNQN=""; HOSTID=""
BS=16k; QD=16; REGION_MB=16; PRE_S=2; POST_S=4; FS=1; FS_NSID=2; ROUND_TMO=180; GAP_MS=250
for x in $(cat /proc/cmdline); do v=${x#*=}; case $x in
  fp_nqn=*) NQN=$v;; fp_ctrls=*) CTRLS=$v;; fp_names=*) NAMES=$v;; fp_port=*) PORT=$v;;
  fp_kato=*) KATO=$v;; fp_cases=*) CASES=$v;; fp_runs=*) RUNS=$v;;
  fp_hostnqn=*) HOSTNQN=$v;; fp_hostid=*) HOSTID=$v;; fp_bs=*) BS=$v;; fp_qd=*) QD=$v;;
  fp_region=*) REGION_MB=$v;; fp_pre=*) PRE_S=$v;; fp_post=*) POST_S=$v;; fp_fs=*) FS=$v;;
  fp_gap=*) GAP_MS=$v;; fp_fsnsid=*) FS_NSID=$v;;
  # -- host settings for fast failover (docs/cluster.md): nvme-core timeouts, connect options
  fp_iotmo=*) IOTMO=$v;; fp_admintmo=*) ADMINTMO=$v;; fp_connopts=*) CONNOPTS=$(echo "$v" | tr , ' ');;
  fp_pathtmo=*) PATHTMO=$v;;
esac; done
log "init start, kernel $(uname -r), cpus $(nproc), controllers $CTRLS ($NAMES) port $PORT, KATO $KATO s"

# -- host settings: nvme-core's io_timeout/admin_timeout (0: the kernel's default)
NVME_CORE_ARGS=""
[ "${IOTMO:-0}" = 0 ] || NVME_CORE_ARGS="io_timeout=$IOTMO"
[ "${ADMINTMO:-0}" = 0 ] || NVME_CORE_ARGS="$NVME_CORE_ARGS admin_timeout=$ADMINTMO"
while read -r m; do
  case $m in */nvme-core.ko) a=$NVME_CORE_ARGS;; *) a="";; esac
  out=$(insmod "/lib/modules/$K/$m" $a 2>&1) || log "insmod failed: $m: $out"
done < /etc/modules.list
ip link set lo up
i=0; while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
ip addr add 10.0.2.15/24 dev eth0; ip link set eth0 up; ip route add default via 10.0.2.2
echo "$HOSTNQN" > /etc/nvme/hostnqn; echo "$HOSTID" > /etc/nvme/hostid
log "modules loaded, nvme_core multipath=$(cat /sys/module/nvme_core/parameters/multipath) io_timeout=$(cat /sys/module/nvme_core/parameters/io_timeout) admin_timeout=$(cat /sys/module/nvme_core/parameters/admin_timeout), hostnqn $HOSTNQN"
# the kernel's own console output could split a marker line: only emergencies go there;
# the lines the host wants come through /dev/kmsg, one write each
dmesg -n 1
# the kernel says when it learns an ANA state only at debug level (multipath.c dev_dbg)
mount -t debugfs none /sys/kernel/debug 2> /dev/null \
  && echo 'file drivers/nvme/host/multipath.c +pt' > /sys/kernel/debug/dynamic_debug/control 2> /dev/null \
  || log "no dynamic debug: ANA state changes will not show in the kernel log"
( cat /dev/kmsg | while IFS= read -r l; do
    case $l in " "*) continue;; esac
    case $l in *nvme*|*"I/O error"*|*blk_update*|*"Buffer I/O"*|*EXT4*|*critical*) echo "@@K $l";; esac
  done ) &

# ---- host orchestration: wait_host (the marker, then "DONE ACTION ..." from the host) is
# the one of /etc/guest-lib.sh
# res (guest-lib.sh) without its kernel log dump: the kernel's lines stream as "@@K"
# shellcheck disable=SC2034
RES_DMESG=0

# ---- the paths: one controller per node, all in one subsystem, a path to each namespace
# head_of NSID: the multipath device (nvmeSnH) of namespace NSID of $NQN
head_of() {
  local d
  for d in /sys/class/nvme-subsystem/*/nvme*n*; do
    [ "$(cat "${d%/*}/subsysnqn" 2> /dev/null)" = "$NQN" ] && [ "$(cat "$d/nsid" 2> /dev/null)" = "$1" ] \
      && { echo "${d##*/}"; return 0; }
  done
  return 1
}
ctrls() {  # H: "nvmeY ADDR STATE PATH ANA" per controller of $NQN, PATH its path to nvmeSnH
  local c n a p
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2> /dev/null)" = "$NQN" ] || continue
    n=${c##*/}
    a=$(sed -n 's/.*traddr=\([^,]*\).*/\1/p' "$c/address" 2> /dev/null)
    p=$(ls "$c" | grep -E "^nvme[0-9]+c[0-9]+n${1:-1}\$" | head -n1)
    echo "$n ${a:-?} $(cat "$c/state" 2> /dev/null) ${p:-none} $(cat "$c/$p/ana_state" 2> /dev/null || echo none)"
  done
}
# paths: for nsid 1 (head H1) NLIVE, NOPT (optimized among live controllers), OPT (their
# addresses), PSUM (all); for the filesystem's nsid (head H2, if any) NPATHS2 (controllers
# with a path to it), NOPT2, OPT2, NINAC2 (inaccessible paths), PSUM2
paths() {
  NLIVE=0; NOPT=0; OPT=""
  PSUM=$(ctrls "$H1" | awk '{printf "%s%s:%s/%s", (NR>1?" ":""), $2, $3, $5}')
  set -- $(ctrls "$H1" | awk '$3=="live"{l++} $3=="live" && $5=="optimized"{o++; a=a (a?",":"") $2} END{print l+0, o+0, (a?a:"-")}')
  NLIVE=$1; NOPT=$2; OPT=$3
  NPATHS2=0; NOPT2=1; OPT2=-; NINAC2=0; PSUM2=""
  [ -n "$H2" ] || return 0
  PSUM2=$(ctrls "$H2" | awk '{printf "%s%s:%s/%s", (NR>1?" ":""), $2, $3, $5}')
  set -- $(ctrls "$H2" | awk '$4!="none"{n++} $5=="inaccessible"{i++} $3=="live" && $5=="optimized"{o++; a=a (a?",":"") $2} END{print n+0, o+0, (a?a:"-"), i+0}')
  NPATHS2=$1; NOPT2=$2; OPT2=$3; NINAC2=$4
}
# wait_paths SECONDS: until every controller is live and exactly one path to each
# namespace is optimized
wait_paths() {
  local i=0
  while [ $i -lt $(($1 * 5)) ]; do
    paths
    [ "$NLIVE" = "$NCTRL" ] && [ "$NOPT" = 1 ] && [ "$NOPT2" = 1 ] && return 0
    sleep 0.2; i=$((i+1))
  done
  return 1
}
# the completions on every path (the 6.1 multipath head keeps no I/O statistics)
iosum() {
  local s=0 f r w
  for f in $STATS; do
    read -r r _ _ _ w _ < "$f" 2> /dev/null || continue
    s=$((s + r + w))
  done
  echo $s
}
# iomon: "@@IO resume ..." when I/O completes again after a gap of GAP_MS or more inside
# one fio round (load() arms it once the round's I/O flows and disarms it at the round's
# end: the gaps between rounds are fio starting and ending, not stalls); uptime in
# centiseconds
iomon() {
  local prev=-1 c u since=0 now
  while [ ! -e /tmp/iomon-stop ]; do
    c=$(iosum); read -r u _ < /proc/uptime; now=${u%.*}${u#*.}
    if [ "$c" != "$prev" ]; then
      [ -e /tmp/io-armed ] && [ "$prev" != -1 ] && [ $(( (now - since) * 10 )) -ge "$GAP_MS" ] \
        && echo "@@IO resume at $u after $(( (now - since) * 10 )) ms without a completion (since $((since / 100)).$((since % 100 / 10))$((since % 10)))"
      prev=$c; since=$now
    fi
    sleep 0.05
  done
}
# the largest clat of a fio JSON output, in ms (reads and writes)
clat_ms() { awk '/"clat_ns"/{f=1} f && /"max"/{gsub(/[^0-9.]/, "", $3); if ($3 + 0 > m) m = $3 + 0; f=0} END{printf "%d", m / 1000000}' "$1" 2> /dev/null; }
# fio_round TAG OFFSET_MB SEED [extra args]: one write+verify pass of a region
fio_round() {
  local tag=$1 off=$2 seed=$3; shift 3
  timeout "$ROUND_TMO" fio --name="$tag" --filename="/dev/$DEV" --direct=1 --ioengine=libaio \
    --iodepth="$QD" --rw=randwrite --bs="$BS" --offset="${off}M" --size="${REGION_MB}M" \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --randseed="$seed" "$@" --disk_util=0 \
    --output-format=json --output="/tmp/fio-$tag.json" > "/tmp/fio-$tag.err" 2>&1
}
# load NAME OFFSET_MB SEED0: fio rounds (each with a new seed: a lost write cannot hide behind the
# same data of an earlier round) until /tmp/load-stop; /tmp/load-NAME.res: rounds failed
# verify_errors clat_max_ms crashed; /tmp/seed-OFFSET: the seed of the region's last round
load() {
  local name=$1 off=$2 seed0=$3 n=0 f=0 ve=0 mx=0 k=0 last=ok extra=0 rc c v base fpid
  while [ ! -e /tmp/load-stop ] || { [ "$last" = crashed ] && [ $extra = 0 ]; }; do
    # a round that follows a crash after the stop runs once: its region must end written and
    # verified whole under the seed the final check reads, but a tool that keeps dying must not
    # keep the case waiting (one such round at most)
    [ -e /tmp/load-stop ] && extra=1
    n=$((n+1)); echo $((seed0 + n)) > "/tmp/seed-$off"
    # armed once this round's I/O flows (two queue depths completed), disarmed at its end
    rm -f /tmp/io-armed; base=$(iosum)
    fio_round "r$n" "$off" $((seed0 + n)) & fpid=$!
    while kill -0 $fpid 2> /dev/null && [ "$(iosum)" -lt $((base + 2 * QD)) ]; do sleep 0.05; done
    kill -0 $fpid 2> /dev/null && : > /tmp/io-armed
    wait $fpid; rc=$?; rm -f /tmp/io-armed
    c=$(clat_ms "/tmp/fio-r$n.json"); [ "${c:-0}" -gt $mx ] && mx=$c
    v=$(grep -ciE 'verify|bad magic|crc32c' "/tmp/fio-r$n.err")
    ve=$((ve + v))
    if [ $rc = 0 ]; then
      log "$name round $n ok, clat max $c ms"; last=ok
    elif tool_crash $rc "/tmp/fio-r$n.err" "$v"; then
      # fio itself died of SIGABRT/SIGSEGV/SIGBUS/SIGILL without printing an I/O or verify
      # error (seen once in ~20 runs: fio of a Debian 13 guest, exit 134, its region verified
      # whole afterwards): the tool's fault, not an error the host saw. Counted apart and shown
      # on the host's RESULT line; the next round rewrites and verifies the region
      k=$((k+1)); last=crashed; log "$name round $n: fio crashed (exit $rc, signal $((rc - 128))), no I/O or verify error printed"
      { tail -n 4 "/tmp/fio-r$n.err"; dmesg | grep -E 'traps:|segfault' | tail -n 2; } | sed 's/^/  fio: /'
      [ -s "/tmp/load-$name.crash" ] || echo "signal_$((rc - 128))_in_round_$n" > "/tmp/load-$name.crash"
    else
      f=$((f+1)); last=failed; log "$name round $n FAILED: fio exit $rc, $v verify lines"
      sed 's/^/  fio: /' "/tmp/fio-r$n.err" | head -n 8
      # the first error fio printed, for the host's RESULT line (no spaces)
      [ -s "/tmp/load-$name.why" ] || { grep -m1 -iE 'err|fail' "/tmp/fio-r$n.err" || echo "exit $rc"; } \
        | tr -c 'A-Za-z0-9=:,._/-' '_' | cut -c1-160 > "/tmp/load-$name.why"
    fi
    cp "/tmp/fio-r$n.json" "/tmp/last-$name.json" 2> /dev/null
  done
  echo "$n $f $ve $mx $k" > "/tmp/load-$name.res"
}
# tool_crash RC ERRFILE VERIFY_LINES: fio was killed by SIGILL, SIGABRT, SIGBUS or SIGSEGV
# (not by the round's timeout, 124) and printed no error and no verify line
tool_crash() {
  case $1 in 132|134|135|139) ;; *) return 1;; esac
  [ "$3" = 0 ] && ! grep -qiE 'err|fail' "$2"
}
# fs_writer PREFIX: small files on the ext4 (nsid 2) while a load runs, each one synced and
# its sha256 in /tmp/fs.sha; /tmp/fs-PREFIX.res: files, failed writes or syncs
fs_writer() {
  local n=0 f=0
  while [ ! -e /tmp/load-stop ]; do
    n=$((n+1))
    if dd if=/dev/urandom of="/mnt/$1-$n" bs=64k count=1 2> /dev/null && timeout 120 sync; then
      sha256sum "/mnt/$1-$n" >> /tmp/fs.sha
    else f=$((f+1)); log "file /mnt/$1-$n: write or sync failed (or sync took over 120 s)"; fi
    sleep 0.5
  done
  echo "$n $f" > "/tmp/fs-$1.res"
}
KERR='I/O error|Buffer I/O|blk_update_request|critical (medium|target|nexus|space)|EXT4-fs error|no available path - failing|(transport|reservation conflict|protection|timeout|offline|not supported) error, dev'
kerr() { dmesg | grep -E "$KERR"; }

# ================================================================ the run
wait_host fo-up 600 || { log "no cluster: $HOSTSAYS"; exit 0; }

# ---- connect to every node
NCTRL=0; i=0
for a in $(echo "$CTRLS" | tr , ' '); do
  i=$((i+1))
  log "nvme connect -t tcp -a $a -s $PORT -n $NQN --ctrl-loss-tmo=-1 --reconnect-delay=1 --keep-alive-tmo=$KATO $CONNOPTS"
  timeout 60 nvme connect -t tcp -a "$a" -s "$PORT" -n "$NQN" --ctrl-loss-tmo=-1 --reconnect-delay=1 \
    --keep-alive-tmo="$KATO" $CONNOPTS 2>&1 | sed 's/^/  | /'
  NCTRL=$((NCTRL+1))
done
# the multipath devices: nvmeSnH, H the kernel's head instance (not the nsid)
DEV=""; DEV2=""; i=0
while [ $i -lt 150 ]; do
  DEV=$(head_of 1); [ "$FS" = 0 ] || DEV2=$(head_of "$FS_NSID")
  [ -n "$DEV" ] && { [ "$FS" = 0 ] || [ -n "$DEV2" ]; } && break
  sleep 0.2; i=$((i+1))
done
H1=${DEV##*n}; H2=""; [ -n "$DEV2" ] && H2=${DEV2##*n}
wait_paths 30
ctrls "$H1" | sed 's/^/  ctrl nsid 1: /'
[ -n "$H2" ] && ctrls "$H2" | sed "s/^/  ctrl nsid $FS_NSID: /"
SUB=$(ls -d /sys/class/nvme-subsystem/*/"$DEV" 2> /dev/null | cut -d/ -f5)
# -- host settings: the block layer's I/O timeout of each path device (ms), what the udev
# rule of docs/cluster.md sets; it persists across the controllers' reconnects
if [ "${PATHTMO:-0}" != 0 ]; then
  for p in $(ctrls "$H1" | awk '{print $1 "/" $4}') $([ -n "$H2" ] && ctrls "$H2" | awk '{print $1 "/" $4}'); do
    f=/sys/class/nvme/$p/queue/io_timeout
    echo "$PATHTMO" > "$f" 2> /dev/null || log "cannot set $f"
    log "path ${p#*/}: queue/io_timeout $(cat "$f" 2> /dev/null) ms"
  done
fi
STATS=$(ctrls "$H1" | awk '$4!="none"{print "/sys/class/nvme/" $1 "/" $4 "/stat"}')
SIZE_MB=0; [ -b "/dev/$DEV" ] && SIZE_MB=$(( $(cat "/sys/block/$DEV/size") / 2048 ))
SIZE2_MB=0; [ -b "/dev/$DEV2" ] && SIZE2_MB=$(( $(cat "/sys/block/$DEV2/size") / 2048 ))
log "multipath devices /dev/${DEV:-none} (nsid 1, $SIZE_MB MiB), /dev/${DEV2:-none} (nsid $FS_NSID, $SIZE2_MB MiB) in ${SUB:-?}, iopolicy $(cat "/sys/class/nvme-subsystem/$SUB/iopolicy" 2> /dev/null)"
ninac=$(ctrls "$H1" | awk '$5=="inaccessible"' | wc -l)
paths
wait_host connected 60 "nctrl=$NCTRL live=$NLIVE opt=$OPT nopt=$NOPT inaccessible=$ninac dev=${DEV:-none} size_mb=$SIZE_MB subsys=${SUB:-none} paths=$(echo "$PSUM" | tr ' ' ,) dev2=${DEV2:-none} size2_mb=$SIZE2_MB npaths2=$NPATHS2 opt2=$OPT2 nopt2=$NOPT2 inaccessible2=$NINAC2 paths2=$(echo "$PSUM2" | tr ' ' ,)" \
  || { log "not connected as expected: no fault cases"; exit 0; }

# ---- a region written before the faults (final-sha256), the filesystem (final-fsck)
PRE_OFF=0; PRE_MB=4
dd if=/dev/urandom of=/tmp/pre bs=1M count=$PRE_MB 2> /dev/null
PRE_SHA=$(sha256sum < /tmp/pre | cut -d' ' -f1)
timeout 120 dd if=/tmp/pre of="/dev/$DEV" bs=1M seek=$PRE_OFF oflag=direct conv=fsync,notrunc 2>&1 | tail -n 1
log "pre-fault region: $PRE_MB MiB at $PRE_OFF MiB, sha256 $PRE_SHA"
if [ "$FS" = 1 ] && [ "$SIZE2_MB" -lt 32 ]; then FS_NOTE="no namespace $FS_NSID for the filesystem (/dev/${DEV2:-none}, $SIZE2_MB MiB)"; FS=2; fi
if [ "$FS" = 1 ]; then
  # ext4 on the whole of nsid 2 (the cluster volume fsvol). -b 4096: the volume's blocks
  # (mke2fs would pick 1 KiB blocks for a small fs). -E nodiscard, and no discard mount
  # option: a discard on a redundant volume writes zeroes through the stripe engine (parity
  # must cover them), the whole volume's worth under TCG (see tests/failover/README.md)
  t=$(up)
  if timeout 300 /usr/sbin/mke2fs -q -t ext4 -b 4096 -F -E nodiscard "/dev/$DEV2" > /tmp/mkfs.txt 2>&1 \
     && mkdir -p /mnt && mount -t ext4 "/dev/$DEV2" /mnt; then
    log "ext4 on /dev/$DEV2 (nsid $FS_NSID, $SIZE2_MB MiB) mounted on /mnt, mke2fs+mount $(awk -v a="$t" -v b="$(up)" 'BEGIN{printf "%.1f", b-a}') s"
  else
    FS_NOTE="mke2fs/mount of /dev/$DEV2 failed: $(tail -n 2 /tmp/mkfs.txt | tr '\n' ' ')"; FS=2
  fi
fi

# ---- the fault cases
IDX=0
# (each case its own REGION_MB region of vol, in this order, after the pre-fault region at 0)
for c in planned-move kill9-owner sigstop-owner cut-owner claim-race etcd-leader-loss rejoin-rebuild \
    enclosure-and-owner owner-cut-from-enclosure-and-etcd; do
  IDX=$((IDX+1)); eval "OFF_$(echo $c | tr - _)=$((IDX * REGION_MB))"
done
rm -f /tmp/iomon-stop; iomon &
NRUN=0
for name in $(echo "$CASES" | tr , ' '); do
  eval "off=\${OFF_$(echo "$name" | tr - _):-}"
  [ -n "$off" ] || { log "unknown case $name"; continue; }
  r=0
  while [ $r -lt "$RUNS" ]; do
    r=$((r+1)); tag=$name; [ "$RUNS" -gt 1 ] && tag="$name#$r"
    # ---- resv-follow: its own steps (tests/failover/resv-guest.sh), no fio load
    case $name in resv-follow|resv-follow-thin) resv_case "$tag"; continue;; esac
    # ---- end resv-follow
    log "STEP $tag: prepare (every node up, every path live)"
    wait_host "prep:$tag" 240 || log "host: prepare $tag: $HOSTSAYS"
    wait_paths 60 || log "paths not settled before $tag: $PSUM"
    dmesg -c >> /tmp/dmesg.all
    rm -f /tmp/load-stop "/tmp/load-$tag.res"; touch /tmp/load-on
    NRUN=$((NRUN+1))
    load "$tag" "$off" $((NRUN * 1000)) & lp=$!
    [ "$FS" = 1 ] && { fs_writer "c$NRUN" & fp=$!; }
    sleep "$PRE_S"
    log "STEP $tag: fault (fio randwrite $BS qd$QD crc32c verify rounds on /dev/$DEV at $off MiB)"
    wait_host "fault:$tag" 300 || log "host: fault $tag: $HOSTSAYS"
    sleep "$POST_S"
    touch /tmp/load-stop; wait $lp; [ "$FS" = 1 ] && wait $fp; rm -f /tmp/load-on
    fsr="0 0"; [ "$FS" = 1 ] && fsr=$(cat "/tmp/fs-c$NRUN.res" 2> /dev/null || echo "0 -1")
    set -- $(cat "/tmp/load-$tag.res" 2> /dev/null || echo 0 -1 -1 -1 0) $fsr
    i=0; while [ $i -lt 75 ]; do paths; [ "$NOPT" = 1 ] && [ "$NOPT2" = 1 ] && break; sleep 0.2; i=$((i+1)); done
    ioerr=$(kerr | wc -l)
    kerr | head -n 5 | sed 's/^/  kernel: /'
    dmesg -c >> /tmp/dmesg.all
    why=$(cat "/tmp/load-$tag.why" 2> /dev/null)
    crash=$(cat "/tmp/load-$tag.crash" 2> /dev/null)
    wait_host "check:$tag" 240 "fioerr=${why:--} rounds=$1 failed=$2 verr=$3 clat_ms=$4 crashed=$5 crash=${crash:--} fsfiles=$6 fsfail=$7 ioerr=$ioerr live=$NLIVE nopt=$NOPT opt=$OPT paths=$(echo "$PSUM" | tr ' ' ,) nopt2=$NOPT2 opt2=$OPT2 paths2=$(echo "$PSUM2" | tr ' ' ,)"
  done
done
touch /tmp/iomon-stop

# ---- final checks
log "STEP final: verify every region, the pre-fault sha256, the kernel log, the filesystem"
ok=PASS; d=""
for name in $(echo "$CASES" | tr , ' '); do
  eval "off=\${OFF_$(echo "$name" | tr - _):-}"
  [ -n "$off" ] && [ -f "/tmp/seed-$off" ] || continue
  case " $d " in *" $off:"*) continue;; esac
  if fio_round "v$off" "$off" "$(cat "/tmp/seed-$off")" --verify_only=1; then d="$d $off:ok"
  else ok=FAIL; d="$d $off:FAILED"; sed 's/^/  fio: /' "/tmp/fio-v$off.err" | head -n 8; fi
done
res final-verify $ok "fio --verify_only crc32c of each case's region (MiB offset:result):${d:- none}"
h=$(timeout 120 dd if="/dev/$DEV" bs=1M skip=$PRE_OFF count=$PRE_MB iflag=direct 2> /dev/null | sha256sum | cut -d' ' -f1)
ok=FAIL; [ "$h" = "$PRE_SHA" ] && ok=PASS
res final-sha256 $ok "$PRE_MB MiB written before the faults: now $h, then $PRE_SHA"
if [ "$FS" = 1 ]; then
  ok=PASS; d=""
  nf=$(wc -l < /tmp/fs.sha 2> /dev/null || echo 0)
  umount /mnt || { ok=FAIL; d="umount failed; "; }
  timeout 300 /usr/sbin/e2fsck -fn "/dev/$DEV2" > /tmp/fsck.txt 2>&1; frc=$?
  tail -n 3 /tmp/fsck.txt | sed 's/^/  | /'
  [ $frc = 0 ] || { ok=FAIL; d="${d}e2fsck -fn exit $frc; "; }
  if mount -t ext4 -o ro "/dev/$DEV2" /mnt; then
    bad=0; [ -s /tmp/fs.sha ] && bad=$(sha256sum -c /tmp/fs.sha 2>&1 | grep -vc ': OK$')   # no file written (no load case ran): none to check
    [ "$bad" = 0 ] || { ok=FAIL; sha256sum -c /tmp/fs.sha 2>&1 | grep -v ': OK$' | head -n 5 | sed 's/^/  | /'; }
    umount /mnt
  else ok=FAIL; bad="?"; d="${d}remount failed; "; fi
  res final-fsck $ok "${d}ext4 (mke2fs -b 4096 -E nodiscard) on /dev/$DEV2 (nsid $FS_NSID): e2fsck -fn exit $frc, $nf files written and synced during the faults, $bad not as written"
elif [ "$FS" = 2 ]; then
  res final-fsck FAIL "$FS_NOTE"
fi
dmesg -c >> /tmp/dmesg.all
bad=$(grep -E "$KERR" /tmp/dmesg.all | grep -c .)
grep -E "$KERR" /tmp/dmesg.all | head -n 10 | sed 's/^/  kernel: /'
ok=FAIL; [ "$bad" = 0 ] && ok=PASS
res final-dmesg $ok "$bad I/O error lines (I/O error, Buffer I/O, blk_update_request, critical ..., EXT4-fs error) in the guest kernel log of the whole run"
paths
wait_host final 240 "live=$NLIVE nopt=$NOPT opt=$OPT paths=$(echo "$PSUM" | tr ' ' ,) nopt2=$NOPT2 opt2=$OPT2 paths2=$(echo "$PSUM2" | tr ' ' ,)${FS_NOTE:+ fsnote=$(echo "$FS_NOTE" | tr ' ' _)}"
log "guest checks: $NPASS passed, $NFAIL failed"
