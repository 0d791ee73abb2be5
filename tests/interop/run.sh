#!/usr/bin/env bash
# tests/interop/run.sh -- interop suite: the Linux kernel NVMe/TCP initiator (Debian's
# kernel, nvme-cli 2.x, fio) in a QEMU guest against `flashpool serve` on the host's
# loopback. The guest reaches host 127.0.0.1 as 10.0.2.2 (slirp). In the same boot, the
# reverse direction: our user-space host (`flashpool bench`) against the guest kernel's
# nvmet-tcp target (brd /dev/ram0), through QEMU hostfwd 127.0.0.1:REV_PORT -> guest:4420.
# Against flashpool also: NVMe reservations between two hosts in the guest (own host NQN,
# host ID and source address each; nvme_core reloaded with multipath=N for that part, see
# "12. reservations") and, with $PTPL_READY present, a PTPL registration across a restart.
#
#   tests/interop/run.sh setup              apt packages + Debian kernel (dpkg -x), cached
#   tests/interop/run.sh build              initramfs (busybox, modules, nvme-cli, fio, /init)
#   tests/interop/run.sh run                the checks against ${FLASHPOOL_BIN}
#   tests/interop/run.sh run --self-test    the same guest checks against the guest's own
#                                           kernel nvmet-tcp (reference; no flashpool needed)
#   tests/interop/run.sh run --mock-target  harness test of the host-side checks: the
#                                           target is mock-target.py, a relay to the
#                                           guest's nvmet that prints flashpool's log lines
#   tests/interop/run.sh [all] [--self-test]   setup + build + run (default)
#
# The caller builds flashpool first (cargo build --release); this script never does.
# Output ends with "N passed, N failed"; the exit status is 0 only if all passed.
#
# Env knobs:
#   FLASHPOOL_BIN   target binary (default target/release/flashpool, relative to repo root)
#   FLASHPOOL_CACHE cache dir (default <repo>/.cache/interop); logs of the last run in $CACHE/run
#   SELFTEST=1      same as --self-test
#   IO_PORT=14420 DISC_PORT=18009 CTL_PORT=15555 REV_PORT=14430   host 127.0.0.1 ports (a
#                   busy default is replaced by the next free one)
#   REV=1           the reverse-direction checks (host-*: flashpool bench -> guest nvmet-tcp);
#                   REV=0 skips them (not counted). In flashpool mode they always count; in
#                   self-test and mock modes they run when BENCH_BIN is executable, else they
#                   are skipped (not counted) with a note in the summary.
#   BENCH_BIN       the initiator binary (default: FLASHPOOL_BIN; `BENCH_BIN bench ...`)
#   REV_BUDGET=240  seconds for all the host-* bench runs together (each also has a timeout)
#   ACCEL=auto|tcg|kvm  GUEST_MEM=1024 GUEST_CPUS=2 RUN_TIMEOUT=600  REACTORS=2
#   KATO=5 (seconds, the poweroff-without-disconnect check)  KATO_MARGIN=10
#   FORCE=1         setup: re-download and re-extract the kernel
#   VERBOSE=1       print the whole guest serial log even when all passed
#   PTPL_READY=/tmp/ptpl-ready  the check resv-ptpl-restart runs (and counts) only if this
#                   file exists when the run starts (the target build keeps PTPL records);
#                   otherwise the summary prints a SKIP line for it
#   CLUSTER=auto|1|0  the cluster phase (tests/cluster/lib.sh: enclosure nodes in network
#                   namespaces 10.77.0.0/24, an owner node with raid6 + ec4+2 volumes on
#                   their drives, fio verify in the guest while enclosures are killed, links
#                   cut and a drive replaced). auto: in flashpool mode when this machine can
#                   (root, iproute2); otherwise skipped and not counted, with a note. 1: always
#                   (counted, fails if it cannot run). 0: never.
#   CL_IO=14520 CL_DISC=18109 CL_API=19510  the owner's host 127.0.0.1 ports (next free one)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE=${FLASHPOOL_CACHE:-$ROOT/.cache/interop}
# shellcheck source=tests/lib/harness.sh
. "$ROOT/tests/lib/harness.sh"   # clock, ports, results, node TOML, QEMU, build, report
BIN=$(flashpool_bin "${FLASHPOOL_BIN:-}")
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
REACTORS=${REACTORS:-2}
KATO=${KATO:-5}
KATO_MARGIN=${KATO_MARGIN:-10}
SELFTEST=${SELFTEST:-0}
MOCK=${MOCK:-0}
VERBOSE=${VERBOSE:-0}
PTPL_READY=${PTPL_READY:-/tmp/ptpl-ready}
FORCE=${FORCE:-0}
REV=${REV:-1}
REV_BUDGET=${REV_BUDGET:-240}
BENCH_BIN=$(flashpool_bin "${BENCH_BIN:-$BIN}")
CLUSTER=${CLUSTER:-auto}

KROOT=$CACHE/kroot          # dpkg -x of linux-image-*.deb
IRD=$CACHE/initramfs        # staging tree
INITRD=$CACHE/initrd.img
RUN=$CACHE/run              # logs of the last run

# What the target is configured with (and what the guest checks).
NQN_MEM=nqn.2026-01.io.flashpool:interop-mem
NQN_FILE=nqn.2026-01.io.flashpool:interop-file
NQN_DENIED=nqn.2026-01.io.flashpool:interop-denied
NQN_REV=nqn.2026-01.io.flashpool:interop-guest-nvmet   # the guest kernel's target (reverse)
NQN_R6=nqn.2026-01.io.flashpool:interop-raid6          # a raid6 volume on 6 mem drives
NQN_RESV=nqn.2026-01.io.flashpool:interop-resv         # two guest hosts share its namespace
NQN_CL=nqn.2026-01.io.flashpool:interop-cluster        # the cluster owner's r6 (nsid 1) and ec (nsid 2)
NQN_AUTH=nqn.2026-01.io.flashpool:interop-auth         # DH-HMAC-CHAP required (+ -h2, -h3)
OTHER_HOST=nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555
SERIAL=FPIOP-7731-QEMU
MODEL=flashpool-interop-model-x7
MEM_SIZE=$((256 << 20))
FILE_SIZE=$((128 << 20))
DENIED_SIZE=$((16 << 20))
RESV_SIZE=$((64 << 20))
FILE_IMG=$CACHE/interop-file.img

# Every check, in order; a check with no RESULT line counts as failed.
GUEST_CHECKS="discover discover-hides-denied connect-plain identify-list identify-ctrl identify-ns
  cc-css-110b id-ctrl-ver ns-descs-csi dd-sha256 fio-randwrite-verify fio-seq128k-verify connect-digest reconnect-persist digest-io
  connect-ioq2 ioq2-io file-write restart-persist denied-host kato-connect"
HOST_CHECKS="target-restart denied-host-log kato-timeout target-alive-after-run target-clean-stop"
# volumes (flashpool only): the guest runs fio on a raid6 volume while it asks the host to
# fail, replace and rebuild drives with the `flashpool` CLI ("@@HOST cli:NAME ARGS")
VOL_CHECKS="raid6-fio-degraded raid6-fio-rebuild raid6-verify-rebuilt ns-add-aen ns-remove-aen ns-grow-aen
  fs-grow-online snap-during-fio snap-ro-mount clone-rw-fsck"
# reservations (flashpool only): two hosts in the guest (own host NQN, host ID and source
# address) share the namespace of $NQN_RESV; each step of the sequence is a check
RESV_CHECKS="resv-connect-2hosts resv-register resv-report-2 resv-acquire-we resv-we-b-write-conflict
  resv-we-b-read-ok resv-we-a-fio resv-preempt-abort resv-preempted-a-write-conflict
  resv-holder-b-write-ok resv-report-b-holder resv-release resv-bad-crkey resv-bad-racqa resv-clear
  resv-dmesg"
# Persist Through Power Loss: a registration with --cptpl=3 on the file namespace survives the
# target restart. Counted only when $PTPL_READY exists at the start of the run (the target
# build keeps the record); otherwise a SKIP line.
PTPL_CHECKS="resv-ptpl-restart"
# cluster (flashpool, root): the guest's checks; the host's are FPC_CHECKS_HOST in
# tests/cluster/lib.sh (cluster-up, one per fault step, cluster-teardown)
CLUSTER_GUEST_CHECKS="cluster-connect cluster-fio-r6 cluster-fio-ec cluster-dmesg"
# DH-HMAC-CHAP (flashpool, and a guest kernel with CONFIG_NVME_AUTH; else a SKIP line):
# $NQN_AUTH has require_auth with this guest's host secret (hh 01) and a controller secret;
# $NQN_AUTH-h2 / -h3 take secrets transformed with SHA-384 / SHA-512 (hh 02, 03). The keys
# are made on the host (random, DHHC-1 = base64(key || crc32 LE)), files mode 0600.
# auth-target-log (host): the target log names the refused host and the reason, and holds
# no secret.
AUTH_CHECKS="auth-uni auth-bidi auth-hmac2 auth-hmac3 auth-wrong-secret auth-no-secret auth-target-log"
# reverse direction: flashpool bench (host) -> guest kernel nvmet-tcp; results printed by the host
REV_CHECKS="host-connect-identify host-verify-nodigest host-verify-digest host-r2t-large host-remote-verify
  host-remote-reconnect host-remote-no-resv host-data-on-ramdisk"


# ---------------------------------------------------------------- setup, build
# (the kernel and the initramfs staging are shared with tests/failover: guest.sh; do_build:
# tests/lib/harness.sh)
GUEST_CACHE=$CACHE
. "$HERE/guest.sh"
# modules: dependency order resolved on the host by kmod, loaded by busybox insmod
# (nvme-auth and the crypto it asks for by name: only where the kernel has them as modules;
# a module the kernel lacks is left out)
# shellcheck disable=SC2034   # (GUEST_MODS, GUEST_BINS: do_build)
GUEST_MODS="configfs crc32c_generic crc32c-intel libcrc32c nvme-auth dh_generic hmac
            sha256_generic sha512_generic nvme-core nvme-fabrics nvme-tcp
            nvmet nvmet-tcp brd virtio_pci virtio_net ext4"
# shellcheck disable=SC2034
GUEST_BINS="nvme fio mke2fs e2fsck resize2fs"
# shellcheck disable=SC2034   # (do_setup: tests/lib/harness.sh) the guest's mke2fs, e2fsck, resize2fs
SETUP_PKGS="e2fsprogs"
build_files() {
  write_guest_init > "$IRD/init"; chmod 0755 "$IRD/init"
  [ -f /etc/mke2fs.conf ] && install -m 0644 /etc/mke2fs.conf "$IRD/etc/mke2fs.conf"   # defines "ext4"
  return 0
}
build_stamp() { guest_stamp "$0" "$HERE/guest.sh"; }

# ---------------------------------------------------------------- guest /init
write_guest_init() {
cat <<'GUEST_INIT'
#!/bin/busybox sh
# PID 1 of the interop guest (generated by tests/interop/run.sh). Runs the checks,
# prints "RESULT <name> PASS|FAIL" lines and markers "@@HOST <action>" for the host
# orchestration on ttyS0, then powers off (without disconnecting the last controller).
. /etc/guest-lib.sh     # tests/interop/guest-lib.sh: boot, results, connects, I/O checks
guest_boot
trap finish EXIT
K=$(cat /etc/kver)

MODE=flashpool; HOSTIP=10.0.2.2; IO=14420; DISC=18009; IOTMO=15; NVMET=0; REV=0; REV_WAIT=300
RESV=0; PTPL=0; EXPECT_VER=0x10400; AUTH=0
for x in $(cat /proc/cmdline); do v=${x#*=}; case $x in
  fp_mode=*) MODE=$v;; fp_nvmet=*) NVMET=$v;; fp_io=*) IO=$v;; fp_disc=*) DISC=$v;;
  fp_nqn_mem=*) NQN_MEM=$v;; fp_nqn_file=*) NQN_FILE=$v;; fp_nqn_denied=*) NQN_DENIED=$v;;
  fp_other_host=*) OTHER_HOST=$v;; fp_hostnqn=*) HOSTNQN=$v;; fp_hostid=*) HOSTID=$v;;
  fp_sn=*) SN=$v;; fp_mn=*) MN=$v;; fp_mem_size=*) MEM_SIZE=$v;; fp_file_size=*) FILE_SIZE=$v;;
  fp_denied_size=*) DENIED_SIZE=$v;; fp_kato=*) KATO=$v;; fp_iotmo=*) IOTMO=$v;;
  fp_rev=*) REV=$v;; fp_nqn_rev=*) NQN_REV=$v;; fp_rev_wait=*) REV_WAIT=$v;;
  fp_vol=*) VOL=$v;; fp_nqn_r6=*) NQN_R6=$v;;
  fp_resv=*) RESV=$v;; fp_nqn_resv=*) NQN_RESV=$v;; fp_resv_size=*) RESV_SIZE=$v;; fp_ptpl=*) PTPL=$v;;
  fp_expect_ver=*) EXPECT_VER=$v;;
  fp_auth=*) AUTH=$v;; fp_nqn_auth=*) NQN_AUTH=$v;; fp_ak1=*) AUTH_K1=$v;; fp_akc=*) AUTH_KC=$v;;
  fp_ak2=*) AUTH_K2=$v;; fp_ak3=*) AUTH_K3=$v;;
  fp_cluster=*) CLUSTER=$v;; fp_nqn_cl=*) NQN_CL=$v;; fp_cl_io=*) CL_IO=$v;; fp_cl_steps=*) CL_STEPS=$v;;
esac; done
log "init start, kernel $(uname -r), cpus $(nproc), mode $MODE, target $HOSTIP io:$IO discovery:$DISC"

load_modules; net_up     # (module order precomputed on the host by modprobe --show-depends)
log "modules loaded, eth0 up, hostnqn $HOSTNQN"

# kernel complaints about NVMe seen so far, outside the steps where they are expected
kernel_notes() {
  { cat /tmp/dmesg.all; echo "== step $STEP"; dmesg; } | awk '/^== step /{s=$3; next} s!="denied-host" && s !~ /^resv-/ && s !~ /^auth-/' \
    | grep -iE 'nvme|nvmet' \
    | grep -iE 'err|fail|invalid|timeout|timed out|ignor|warn|reset|reconnect|unsupported|not supported|mismatch|digest|term|abort|refus' \
    | { if [ -n "$KN_EXPECTED" ]; then grep -vE "$KN_EXPECTED"; else cat; fi; } \
    | sed 's/^/KERNEL-NOTE /'
}

# ---- self-test: the guest's own kernel nvmet-tcp is the target, reached through host
# 127.0.0.1 (QEMU hostfwd 127.0.0.1:IO -> guest:4420, :DISC -> guest:8009), so the guest
# runs exactly the same commands against the same addresses as against flashpool.
CFS=/sys/kernel/config/nvmet
nvmet_subsys() {  # nqn backing-path buffered(0|1)
  S=$CFS/subsystems/$1
  mkdir $S
  echo -n "$SN" > $S/attr_serial; echo -n "$MN" > $S/attr_model
  mkdir $S/namespaces/1
  echo -n "$2" > $S/namespaces/1/device_path
  [ "$3" = 1 ] && echo 1 > $S/namespaces/1/buffered_io
  echo 1 > $S/namespaces/1/enable
}
nvmet_link() { for p in 1 2; do ln -s $CFS/subsystems/$1 $CFS/ports/$p/subsystems/$1; done; }
nvmet_unlink() { for p in 1 2; do rm $CFS/ports/$p/subsystems/$1; done; }
[ "$MODE" = selftest ] && NVMET=1
if [ "$NVMET" = 1 ]; then
  # with nvmet file/bdev backends over tmpfs/brd: buffered I/O on the tmpfs files
  dd if=/dev/zero of=/tmp/file.img bs=1M count=0 seek=$((FILE_SIZE>>20)) 2>/dev/null
  dd if=/dev/zero of=/tmp/denied.img bs=1M count=0 seek=$((DENIED_SIZE>>20)) 2>/dev/null
  nvmet_subsys $NQN_MEM /dev/ram0 0
  echo 1 > $CFS/subsystems/$NQN_MEM/attr_allow_any_host
  nvmet_subsys $NQN_FILE /tmp/file.img 1
  echo 1 > $CFS/subsystems/$NQN_FILE/attr_allow_any_host
  nvmet_subsys $NQN_DENIED /tmp/denied.img 1
  echo 0 > $CFS/subsystems/$NQN_DENIED/attr_allow_any_host
  mkdir $CFS/hosts/$OTHER_HOST
  ln -s $CFS/hosts/$OTHER_HOST $CFS/subsystems/$NQN_DENIED/allowed_hosts/$OTHER_HOST
  for p in 1:4420 2:8009; do
    P=$CFS/ports/${p%:*}; mkdir $P
    echo tcp > $P/addr_trtype; echo ipv4 > $P/addr_adrfam
    echo 0.0.0.0 > $P/addr_traddr; echo ${p#*:} > $P/addr_trsvcid
  done
  for s in $NQN_MEM $NQN_FILE $NQN_DENIED; do nvmet_link $s; done
  log "kernel nvmet-tcp on guest :4420 and :8009, $(ls $CFS/subsystems | wc -l) subsystems"
fi

# ---- helpers (nvconnect, write_check, ...: guest-lib.sh)
fio_run() {  # name timeout args...
  local n=$1 s=$2 t0 frc; shift 2
  t0=$(up)
  timeout $s fio --name=$n --direct=1 --ioengine=libaio --group_reporting --verify_fatal=1 "$@" > /tmp/fio-$n.txt 2>&1; frc=$?
  grep -E 'err=|write:|read:|verify|bad|fail' /tmp/fio-$n.txt | head -n 8 | sed 's/^/  | /'
  log "fio $n rc=$frc in $(awk -v a=$t0 -v b=$(up) 'BEGIN{print b-a}') s"
  [ $frc -eq 0 ] || tail -n 15 /tmp/fio-$n.txt | sed 's/^/  fio: /'
  return $frc
}
# ---- reservations
# nvs ARGS: an nvme-cli command under a timeout, output indented; NVOUT = its output on
# one line; returns its exit status
nvs() { local rc; timeout 30 nvme "$@" > /tmp/nv.out 2>&1; rc=$?; sed 's/^/  | /' /tmp/nv.out; NVOUT=$(tr '\n' ' ' < /tmp/nv.out | sed 's/ *$//'); return $rc; }
# the NVMe status nvme-cli printed ("NVMe status: NAME: text(0xSTATUS)") as "NAME (0xSTATUS)"
nvstatus() { echo "$NVOUT" | sed -n 's/.*NVMe status: \([^:]*\):.*(\(0x[0-9a-fA-F]*\)).*/\1 (\2)/p'; }
is_status() { case "$NVOUT" in *"NVMe status: $1:"*) return 0;; esac; return 1; }
# a block-layer write refused with Reservation Conflict: the kernel maps it (alone) to
# BLK_STS_NEXUS, EBADE to user space. (Its "sc 0x83" log line is rate limited: after
# A's fio meets the preempt there may be none left for the next refused write.)
is_ebade() { case "$1" in *"Invalid exchange"*) return 0;; esac; return 1; }
# resv_report DEV: nvme resv-report --eds -o json (extended data structure: fabrics hosts
# have 128-bit host IDs, so a report without EDS fails with Host Identifier Inconsistent
# Format). Sets RGEN RTYPE RREGCTL RPTPLS, and RREGS: one sorted line per registrant,
# "HOSTID RKEY RCSTS" (host ID as 32 hex digits, key in decimal, RCSTS 1 = holder)
resv_report() {
  RGEN=""; RTYPE=""; RREGCTL=""; RPTPLS=""; RREGS=""
  timeout 30 nvme resv-report /dev/$1 --eds -o json > /tmp/rr.json 2>&1 \
    || { sed 's/^/  | /' /tmp/rr.json; log "resv-report /dev/$1 failed"; return 1; }
  awk -F: '{ gsub(/[ \t",]/, "") } $1=="gen"{g=$2} $1=="rtype"{t=$2} $1=="regctl"{n=$2}
    $1=="ptpls"{p=$2} $1=="rcsts"{s=$2} $1=="rkey"{k=$2} $1=="hostid"{print "REG " $2 " " k " " s}
    END{print "HDR " g " " t " " n " " p}' /tmp/rr.json > /tmp/rr.txt
  set -- $(grep '^HDR' /tmp/rr.txt); RGEN=$2; RTYPE=$3; RREGCTL=$4; RPTPLS=$5
  RREGS=$(grep '^REG' /tmp/rr.txt | cut -d' ' -f2- | sort)
  log "resv-report: gen=$RGEN rtype=$RTYPE regctl=$RREGCTL ptpls=$RPTPLS registrants [hostid rkey rcsts]: $(echo $RREGS)"
}
# regl UUID KEY RCSTS: a registrant line as resv_report writes it
regl() { echo "$(echo $1 | tr -d -) $(($2)) $3"; }
regs() { while [ $# -ge 3 ]; do regl $1 $2 $3; shift 3; done | sort; }
# write_conflict CHECK DEV WHAT: /tmp/wb written to DEV at $W (LBA $WL) by nvme write and by
# dd O_DIRECT must both fail with Reservation Conflict (EBADE for dd) and leave WHAT at 2 MiB
# ($HWA, read through $DB) unchanged
write_conflict() {
  local c=$1 dev=$2 rc1 st1 c1 rc2 e2 k2 h ok
  nvs write /dev/$dev -s $WL -c $((B4 - 1)) -z 4096 -d /tmp/wb; rc1=$?; st1=$(nvstatus); c1=FAIL; is_status "Reservation Conflict" && c1=PASS
  t 30 dd if=/tmp/wb of=/dev/$dev bs=4096 seek=$W oflag=direct conv=notrunc; rc2=$?; e2=$(grep -i error /tmp/t.out | head -n1)
  k2=$(dmesg | grep -c "$dev: I/O Cmd(0x1) @ LBA $WL, $B4 blocks, I/O Error (sct 0x0 / sc 0x83)")
  h=$(sha4k $DB $W)
  ok=FAIL; [ $rc1 -ne 0 ] && [ $c1 = PASS ] && [ $rc2 -ne 0 ] && is_ebade "$e2" && [ "$h" = "$HWA" ] && ok=PASS
  res $c $ok "nvme write: exit $rc1, ${st1:-$NVOUT}; dd oflag=direct: exit $rc2 (${e2:-no error}), kernel 'sc 0x83' on $dev x$k2; $3 at 2 MiB $([ "$h" = "$HWA" ] && echo unchanged || echo CHANGED)"
}
sha4k() { timeout 30 dd if=/dev/$1 bs=4096 skip=$2 count=${3:-1} iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1; }
# nvme_core_reload Y|N: unload nvme-tcp, nvme-fabrics, nvme-core (no host controller may
# be left) and load them again with multipath=Y|N (nvmet does not depend on nvme-core)
nvme_core_reload() {
  local m a
  rmmod nvme_tcp && rmmod nvme_fabrics && rmmod nvme_core \
    || { log "rmmod of the nvme host modules failed (controllers: $(ls /sys/class/nvme 2>/dev/null | tr '\n' ' '))"; return 1; }
  for m in nvme-core nvme-fabrics nvme-tcp; do
    a=""; [ $m = nvme-core ] && a="multipath=$1 io_timeout=$IOTMO admin_timeout=$IOTMO"
    insmod /lib/modules/$K/$(grep "/$m.ko\$" /etc/modules.list) $a || { log "insmod $m $a failed"; return 1; }
  done
  log "nvme-tcp, nvme-fabrics, nvme-core reloaded: multipath=$(cat /sys/module/nvme_core/parameters/multipath)"
  [ "$(cat /sys/module/nvme_core/parameters/multipath)" = "$1" ]
}
# ask_cli NAME ARGS: the host runs `flashpool ARGS --api ...` and answers ok/fail
ask_cli() { local n=$1; shift; wait_host "cli:$n" 180 "$*"; }
# ns_bdev NSID: the block device of namespace NSID of controller $R6C (waits up to 10 s)
ns_bdev() {
  local i=0 n
  while [ $i -lt 50 ]; do
    n=$(ls /sys/class/nvme/$R6C | grep -E "^nvme[0-9]+(c[0-9]+)?n$1\$" | head -n 1 | sed 's/c[0-9]*n/n/')
    [ -n "$n" ] && [ -b "/dev/$n" ] && { echo "$n"; return 0; }
    sleep 0.2; i=$((i+1)); done
  return 1
}
# Snapshots and clones of the thin volume tg (nsid 2 of $NQN_R6, 12 MiB after ns-grow-aen),
# as a Linux host uses them: ext4 on tg grown online with resize2fs while fio writes; a
# snapshot taken while fio writes with crc32c verify; the snapshot exported (nsid 3) is
# write-protected and mounts read-only with the files of before; a clone (nsid 4) mounts
# read-write, takes a file the origin never sees, and passes e2fsck -fn.
snapshot_checks() {
  local tg s1 c1 a b ok d w fpid
  step fs-grow-online "ext4 on tg (12 MiB), mounted; grown to 32 MiB (volume grow) and resize2fs online while fio writes"
  ok=FAIL; d=""
  tg=$(ns_bdev 2) || tg=""
  mkdir -p /mnt/tg /mnt/s1 /mnt/c1
  if [ -n "$tg" ] && timeout 120 /usr/sbin/mke2fs -q -t ext4 -b 4096 -F -E nodiscard /dev/$tg > /tmp/mkfs.txt 2>&1 \
     && mount -t ext4 /dev/$tg /mnt/tg; then
    head -c 2097152 /dev/urandom > /mnt/tg/a.bin; sync
    a=$(md5sum < /mnt/tg/a.bin | cut -c1-32)
    b0=$(df -k /mnt/tg | awk 'NR==2{print $2}')
    fio_run grow 300 --filename=/mnt/tg/f1.dat --size=2M --rw=randwrite --bs=4k --iodepth=8 \
      --verify=crc32c --do_verify=1 > /dev/null 2>&1 & fpid=$!
    w=FAIL
    if ask_cli fs-grow "volume grow tg --size 32MiB"; then
      i=0; while [ $i -lt 50 ]; do [ "$(cat /sys/block/$tg/size)" = 65536 ] && break; sleep 0.2; i=$((i+1)); done
      timeout 120 /usr/sbin/resize2fs /dev/$tg > /tmp/resize.txt 2>&1 && w=PASS
      sed 's/^/  | /' /tmp/resize.txt
    fi
    wait $fpid && f=PASS || f=FAIL
    b1=$(df -k /mnt/tg | awk 'NR==2{print $2}')
    d="df: $b0 -> $b1 KiB; resize2fs $w; fio verify during it $f"
    [ "$w" = PASS ] && [ "$f" = PASS ] && [ "${b1:-0}" -gt $((b0 * 2)) ] && ok=PASS
  else d="no tg device (${tg:-none}) or mke2fs/mount failed: $(tail -n 2 /tmp/mkfs.txt 2> /dev/null | tr '\n' ' ')"; fi
  res fs-grow-online $ok "$d"

  step snap-during-fio "snapshot create tg tg-s1 while fio randwrite with crc32c verify runs on tg's ext4"
  ok=FAIL; d=""
  if grep -q ' /mnt/tg ' /proc/mounts; then
    fio_run snap 300 --filename=/mnt/tg/f2.dat --size=4M --rw=randwrite --bs=4k --iodepth=8 \
      --verify=crc32c --do_verify=1 > /dev/null 2>&1 & fpid=$!
    sleep 1
    ask_cli snap-create "snapshot create tg tg-s1" && w=PASS || w=FAIL
    wait $fpid && f=PASS || f=FAIL
    d="snapshot $w, fio verify $f"
    [ "$w" = PASS ] && [ "$f" = PASS ] && ok=PASS
  else d="tg is not mounted"; fi
  res snap-during-fio $ok "$d"

  step snap-ro-mount "volume export tg-s1 as nsid 3: the kernel sees it write-protected; mounted ro, a.bin as before"
  ok=FAIL; d=""
  if ask_cli snap-export "volume export tg-s1 --nqn $NQN_R6 --nsid 3" && s1=$(ns_bdev 3); then
    ro=$(cat /sys/block/$s1/ro)
    dd if=/dev/zero of=/dev/$s1 bs=4096 count=1 oflag=direct 2> /dev/null && wr=accepted || wr=refused
    if mount -t ext4 -o ro,noload /dev/$s1 /mnt/s1; then
      b=$(md5sum < /mnt/s1/a.bin | cut -c1-32)
    else b="mount failed"; fi
    d="/dev/$s1 ro=$ro, a write was $wr, a.bin $b (origin $a)"
    [ "$ro" = 1 ] && [ "$wr" = refused ] && [ "$b" = "$a" ] && ok=PASS
  else d="export of tg-s1 failed or nsid 3 not seen"; fi
  res snap-ro-mount $ok "$d"

  step clone-rw-fsck "volume clone tg-s1 tg-c1 as nsid 4: mounted rw, a.bin as before, a new file the origin never sees; e2fsck -fn clean"
  ok=FAIL; d=""
  if ask_cli clone "volume clone tg-s1 tg-c1 --export $NQN_R6 --nsid 4" && c1=$(ns_bdev 4); then
    if mount -t ext4 /dev/$c1 /mnt/c1; then
      b=$(md5sum < /mnt/c1/a.bin | cut -c1-32)
      echo "clone only" > /mnt/c1/new.txt; sync
      umount /mnt/c1
      timeout 120 /usr/sbin/e2fsck -fn /dev/$c1 > /tmp/fsck.txt 2>&1; rc=$?
      tail -n 3 /tmp/fsck.txt | sed 's/^/  | /'
      [ -e /mnt/tg/new.txt ] && seen=yes || seen=no
      d="a.bin $b (origin $a), e2fsck -fn rc=$rc, new.txt in the origin: $seen"
      [ "$b" = "$a" ] && [ $rc = 0 ] && [ $seen = no ] && ok=PASS
    else d="mount of /dev/$c1 failed"; fi
  else d="clone of tg-s1 failed or nsid 4 not seen"; fi
  res clone-rw-fsck $ok "$d"
  umount /mnt/s1 2> /dev/null; umount /mnt/tg 2> /dev/null
}

# ================================================================ checks
# 1. discovery
step discover "nvme discover -t tcp -a $HOSTIP -s $DISC"
timeout 60 nvme discover -t tcp -a $HOSTIP -s $DISC > /tmp/disc.txt 2>&1; rc=$?
sed 's/^/  | /' /tmp/disc.txt
nq=$(grep -E '^subnqn:' /tmp/disc.txt | awk '{print $2}' | tr '\n' ' ')
log "discover rc=$rc, subnqns: $nq"
ok=FAIL; case " $nq " in *" $NQN_MEM "*) case " $nq " in *" $NQN_FILE "*) ok=PASS;; esac;; esac
[ $rc -eq 0 ] || ok=FAIL
res discover $ok "rc=$rc"
ok=PASS; case " $nq " in *" $NQN_DENIED "*) ok=FAIL;; esac
[ $rc -eq 0 ] && [ -n "$nq" ] || ok=FAIL
res discover-hides-denied $ok

# 2-6. mem subsystem: plain connect, identify, dd, fio
step connect-plain "connect without digests to $NQN_MEM"
H_MEM=""
if nvconnect $NQN_MEM; then
  res connect-plain PASS "$CTRL $DEV, $(ioqueues $CTRL) I/O queues"

  step identify "nvme list / id-ctrl / id-ns on $CTRL $DEV"
  timeout 30 nvme list > /tmp/list.txt 2>&1; sed 's/^/  | /' /tmp/list.txt
  ok=FAIL; line=$(grep "/dev/$DEV " /tmp/list.txt)
  case "$line" in *"$SN"*"$MN"*) ok=PASS;; esac
  res identify-list $ok "expect sn=$SN mn=$MN on /dev/$DEV"

  timeout 30 nvme id-ctrl /dev/$CTRL > /tmp/idc.txt 2>&1
  grep -E '^(vid|sn|mn|fr|mdts|cntlid|ver|kas|sgls|ioccsz|iorcsz|maxcmd|nn|subnqn|cmic|ctratt) ' /tmp/idc.txt | sed 's/^/  /'
  sn=$(grep -E '^sn ' /tmp/idc.txt | trim); mn=$(grep -E '^mn ' /tmp/idc.txt | trim)
  sq=$(grep -E '^subnqn ' /tmp/idc.txt | trim)
  ok=PASS
  [ "$sn" = "$SN" ] || { ok=FAIL; echo "  sn '$sn' != '$SN'"; }
  [ "$mn" = "$MN" ] || { ok=FAIL; echo "  mn '$mn' != '$MN'"; }
  [ "$sq" = "$NQN_MEM" ] || { ok=FAIL; echo "  subnqn '$sq' != '$NQN_MEM'"; }
  res identify-ctrl $ok "sn='$sn' mn='$mn' subnqn='$sq'"

  timeout 30 nvme id-ns /dev/$DEV > /tmp/idn.txt 2>&1
  grep -E '^(nsze|ncap|nuse|nlbaf|flbas|nmic|nguid|eui64)|in use' /tmp/idn.txt | sed 's/^/  /'
  nsze=$(grep -E '^nsze ' /tmp/idn.txt | trim)
  lbads=$(grep 'in use' /tmp/idn.txt | sed -n 's/.*lbads:\([0-9]*\).*/\1/p' | head -n1)
  bytes=0; [ -n "$nsze" ] && [ -n "$lbads" ] && bytes=$(( nsze * (1 << lbads) ))
  sys=$(( $(cat /sys/block/$DEV/size) * 512 ))
  ok=FAIL; [ "$bytes" = "$MEM_SIZE" ] && [ "$sys" = "$MEM_SIZE" ] && ok=PASS
  res identify-ns $ok "nsze=$nsze lbads=$lbads -> $bytes bytes, sysfs $sys, expect $MEM_SIZE"

  # CAP.CSS bit 43 (one or more I/O command sets): Linux 6.1 then enables the controller
  # with CC.CSS = 110b, and scans namespaces only if Identify CNS 03h names their command
  # set (else "Command set not reported for nsid" and no block device)
  step css "CAP/CC/VS properties, id-ctrl ver, ns-descs on $CTRL $DEV"
  prop() { timeout 30 nvme get-property /dev/$CTRL --offset=$1 2>&1 | sed -n 's/.*value: *//p' | sed 's/^0[xX]//' | head -n1; }
  cap=$(prop 0); cc=$(prop 0x14); vs=$(prop 0x8)
  timeout 30 nvme get-property /dev/$CTRL --offset=0x14 -H 2>&1 | grep -E '^cc|\((CSS|EN)\)' | sed 's/^/  | /'
  ok=FAIL; b43=?; b37=?; css=?; en=?
  if ishex "$cap" && ishex "$cc"; then
    b43=$(( (0x$cap >> 43) & 1 )); b37=$(( (0x$cap >> 37) & 1 )); css=$(( (0x$cc >> 4) & 7 )); en=$(( 0x$cc & 1 ))
    [ $b43 = 1 ] && [ $b37 = 1 ] && [ $css = 6 ] && [ $en = 1 ] && ok=PASS
  fi
  res cc-css-110b $ok "CAP=0x${cap:-?} (CSS bit 37 NVM=$b37, bit 43 I/O command sets=$b43), CC=0x${cc:-?} (EN=$en, CSS=$css, expect 6 = 110b)"
  ver=$(grep -E '^ver ' /tmp/idc.txt | trim)
  ok=FAIL
  ishex "${ver#0x}" && ishex "$vs" && [ $((0x${ver#0x})) = $(($EXPECT_VER)) ] && [ $((0x$vs)) = $((0x${ver#0x})) ] && ok=PASS
  res id-ctrl-ver $ok "id-ctrl ver=${ver:-?}, VS property=0x${vs:-?}, expect $EXPECT_VER"
  timeout 30 nvme ns-descs /dev/$DEV > /tmp/nsd.txt 2>&1; sed 's/^/  | /' /tmp/nsd.txt
  csi=$(grep -E '^csi ' /tmp/nsd.txt | trim)
  nrep=$( { cat /tmp/dmesg.all; dmesg; } | grep -c 'Command set not reported')
  ok=FAIL; [ "$csi" = 0 ] && [ "$nrep" = 0 ] && ok=PASS
  res ns-descs-csi $ok "CSI descriptor: ${csi:-none} (expect 0 = NVM); kernel 'Command set not reported' x$nrep"

  step dd-sha256 "4 MiB random, O_DIRECT, at 0 on /dev/$DEV"
  ok=FAIL; write_check $DEV 0 4 && ok=PASS; H_MEM=$H
  res dd-sha256 $ok

  step fio-randwrite-verify "fio randwrite 4k qd32 16MiB crc32c verify"
  ok=FAIL
  fio_run randwrite 240 --filename=/dev/$DEV --iodepth=32 --rw=randwrite --bs=4k \
      --offset=8M --size=16M --verify=crc32c --do_verify=1 && ok=PASS
  res fio-randwrite-verify $ok

  step fio-seq128k-verify "fio write 128k qd8 32MiB then verify-read"
  ok=FAIL
  fio_run seq128k 240 --filename=/dev/$DEV --iodepth=8 --rw=write --bs=128k \
      --offset=32M --size=32M --verify=crc32c --do_verify=1 && ok=PASS
  res fio-seq128k-verify $ok
  step disconnect "nvme disconnect -n $NQN_MEM"
  nvdisconnect $NQN_MEM
else
  res connect-plain FAIL
  for c in identify-list identify-ctrl identify-ns cc-css-110b id-ctrl-ver ns-descs-csi dd-sha256 \
      fio-randwrite-verify fio-seq128k-verify; do
    res $c FAIL "no connection"; done
fi

# 2+7. reconnect with header+data digests (one I/O queue): data still there, digest I/O
step connect-digest "connect --hdr-digest --data-digest --nr-io-queues 1 to $NQN_MEM"
if nvconnect $NQN_MEM --hdr-digest --data-digest --nr-io-queues 1; then
  q=$(ioqueues $CTRL)
  ok=PASS; [ "$q" = 1 ] || ok=FAIL
  res connect-digest $ok "$CTRL, $q I/O queue(s), expect 1"
  step reconnect-persist "sha256 of the first 4 MiB after disconnect+reconnect"
  h=$(sha_dev $DEV 0 4); echo "  sha256 before $H_MEM"; echo "  sha256 now    $h"
  ok=FAIL; [ -n "$H_MEM" ] && [ "$h" = "$H_MEM" ] && ok=PASS
  res reconnect-persist $ok
  step digest-io "dd + fio verify with CRC32C header and data digests"
  ok=FAIL
  if write_check $DEV 128 4; then
    fio_run digest 180 --filename=/dev/$DEV --iodepth=16 --rw=randwrite --bs=4k \
        --offset=136M --size=8M --verify=crc32c --do_verify=1 && ok=PASS
  fi
  dmesg | grep -i digest | head -n 5
  dmesg | grep -qi 'digest error' && ok=FAIL
  res digest-io $ok
  step disconnect "nvme disconnect -n $NQN_MEM"
  nvdisconnect $NQN_MEM
else
  res connect-digest FAIL; res reconnect-persist FAIL "no connection"; res digest-io FAIL "no connection"
fi

# 2. two I/O queues, used by two fio jobs on two CPUs
step connect-ioq2 "connect --nr-io-queues 2 to $NQN_MEM"
if nvconnect $NQN_MEM --nr-io-queues 2; then
  q=$(ioqueues $CTRL)
  dmesg | grep -E "$CTRL: (creating|mapped)" | sed 's/^/  /'
  ok=PASS; [ "$q" = 2 ] || ok=FAIL
  res connect-ioq2 $ok "$CTRL, $q I/O queues, expect 2"
  step ioq2-io "fio 2 jobs (one per CPU) randwrite 4k verify"
  ok=FAIL
  fio_run ioq2 180 --filename=/dev/$DEV --iodepth=16 --rw=randwrite --bs=4k --numjobs=2 \
      --cpus_allowed=0-$(( $(nproc) - 1 )) --cpus_allowed_policy=split \
      --offset=160M --size=4M --offset_increment=8M --verify=crc32c --do_verify=1 && ok=PASS
  res ioq2-io $ok
  step disconnect "nvme disconnect -n $NQN_MEM"
  nvdisconnect $NQN_MEM
else
  res connect-ioq2 FAIL; res ioq2-io FAIL "no connection"
fi

# 7. file namespace survives a target restart
step file-write "connect $NQN_FILE, write 4 MiB, disconnect"
H_FILE=""
ok=FAIL
if nvconnect $NQN_FILE; then
  sys=$(( $(cat /sys/block/$DEV/size) * 512 ))
  echo "  size $sys bytes (expect $FILE_SIZE)"
  write_check $DEV 4 4 && [ "$sys" = "$FILE_SIZE" ] && ok=PASS && H_FILE=$H
  if [ "$PTPL" = 1 ]; then   # resv-ptpl-restart: register with PTPL on before the restart
    log "PTPL: this host ($HOSTID) registers key 0xC3 with cptpl 3 on $NQN_FILE"
    PTPL_BEFORE=""
    if nvs resv-register /dev/$DEV --nrkey=0xC3 --rrega=0 --cptpl=3; then
      resv_report $DEV; PTPL_BEFORE="before the restart: ptpls=$RPTPLS gen=$RGEN registrants $(echo $RREGS)"
    else PTPL_BEFORE="register --cptpl=3 failed: $NVOUT"; fi
  fi
  nvdisconnect $NQN_FILE
fi
res file-write $ok
step restart-persist "target restart (host: SIGTERM + start), reconnect, sha256"
if [ "$MODE" = selftest ]; then   # the kernel target's equivalent of a restart
  nvmet_unlink $NQN_FILE; echo 0 > $CFS/subsystems/$NQN_FILE/namespaces/1/enable
  echo 1 > $CFS/subsystems/$NQN_FILE/namespaces/1/enable; nvmet_link $NQN_FILE
  log "self-test: $NQN_FILE unlinked, namespace disabled+enabled, relinked"
fi
ok=FAIL; detail=""; DEV=""
if wait_host restart-target 120; then
  end=$(( $(cut -d. -f1 /proc/uptime) + 25 ))
  while :; do   # the target may need a moment: retry connect for up to 25 s
    nvconnect $NQN_FILE && break
    [ "$(cut -d. -f1 /proc/uptime)" -lt $end ] || break
    sleep 2
  done
  if [ -n "$DEV" ]; then
    h=$(sha_dev $DEV 4 4); echo "  sha256 before restart $H_FILE"; echo "  sha256 after restart  $h"
    [ -n "$H_FILE" ] && [ "$h" = "$H_FILE" ] && ok=PASS
  else detail="reconnect failed"; fi
else detail="host did not restart the target: $HOSTSAYS"; fi
res restart-persist $ok "$detail"
if [ "$PTPL" = 1 ]; then
  step resv-ptpl-restart "after the restart: the registration with PTPL on is still there; unregister"
  ok=FAIL
  if [ -n "$DEV" ]; then
    if resv_report $DEV && [ "$RPTPLS" = 1 ] && [ "$RREGS" = "$(regs $HOSTID 0xC3 0)" ]; then
      nvs resv-register /dev/$DEV --crkey=0xC3 --rrega=1 && resv_report $DEV && [ "$RREGCTL" = 0 ] && ok=PASS
      detail="after: ptpls=1, registrant $(echo $(regs $HOSTID 0xC3 0)); unregister: $NVOUT, regctl now $RREGCTL"
    else
      detail="after: ptpls=$RPTPLS gen=$RGEN registrants: $(echo $RREGS) (expect ptpls=1, $(echo $(regs $HOSTID 0xC3 0)))"
    fi
  else detail="no reconnect after the restart"; fi
  res resv-ptpl-restart $ok "$PTPL_BEFORE; $detail"
fi
[ -n "$DEV" ] && nvdisconnect $NQN_FILE

# 8. a host not in hosts= is refused
step denied-host "connect to $NQN_DENIED (allowed: only $OTHER_HOST)"
timeout 60 nvme connect -t tcp -a $HOSTIP -s $IO -n $NQN_DENIED $CONN_OPTS > /tmp/deny.txt 2>&1; rc=$?
sed 's/^/  | /' /tmp/deny.txt
dmesg | grep -iE 'nvme|not allowed' | tail -n 5 | sed 's/^/  dmesg: /'
ok=FAIL
[ $rc -ne 0 ] && dmesg | grep -qiE 'not allowed|invalid host' && ok=PASS
grep -qx "$NQN_DENIED" /sys/class/nvme/*/subsysnqn 2>/dev/null && { ok=FAIL; nvdisconnect $NQN_DENIED; }
res denied-host $ok "nvme connect rc=$rc"

# 13. DH-HMAC-CHAP: $NQN_AUTH requires this host's secret; -h2/-h3 take SHA-384/512 secrets
if [ "$AUTH" = 1 ]; then
  step auth-uni "connect $NQN_AUTH with --dhchap-secret (host secret, hh 01)"
  auth_ok auth-uni $NQN_AUTH "unidirectional" --dhchap-secret=$AUTH_K1
  step auth-bidi "connect $NQN_AUTH with --dhchap-secret and --dhchap-ctrl-secret (bidirectional)"
  auth_ok auth-bidi $NQN_AUTH "bidirectional" --dhchap-secret=$AUTH_K1 --dhchap-ctrl-secret=$AUTH_KC
  for h in 2 3; do
    eval k=\$AUTH_K$h
    step auth-hmac$h "connect $NQN_AUTH-h$h with a secret transformed by hmac $h (hh 0$h)"
    auth_ok auth-hmac$h $NQN_AUTH-h$h "hh 0$h" --dhchap-secret=$k
  done
  step auth-wrong-secret "connect $NQN_AUTH with another secret: refused"
  auth_refused auth-wrong-secret $NQN_AUTH --dhchap-secret=$AUTH_K2
  step auth-no-secret "connect $NQN_AUTH without a secret: refused"
  auth_refused auth-no-secret $NQN_AUTH
fi

# 12. reservations (flashpool only): two hosts share the namespace of $NQN_RESV.
# Two hosts in one guest: A and B connect with their own host NQN and host ID (the kernel
# refuses one host ID under two NQNs) and their own source address, 10.0.2.15 and
# 10.0.2.16 (nvme-cli 2.3 refuses a second connect to the same address, port and
# subsystem NQN as "already connected" whatever the host NQN, and its --duplicate-connect
# does not lift that check; a different --host-traddr does).
# Each host needs a path of its own. With native multipath (nvme_core multipath=Y, the
# suite's default) the two controllers join one nvme-subsys and the shared namespace has a
# single head, /dev/nvmeXnY and /dev/ngXnY; the per-controller paths nvmeXcYnZ are hidden
# disks with no device node in 6.1, so one host's path is reachable only through the
# deprecated NVME_IOCTL_IO_CMD on the controller char device (nvme-cli passthrough
# only: no block I/O, no fio), and I/O on the head goes down whichever path the kernel
# picks. So for this part nvme_core is reloaded with multipath=N (nvmet does not depend on
# it): each controller then has a block device of its own (the kernel says "Found shared
# namespace 1, but multipathing not supported"), and multipath=Y is back afterwards.
if [ "$RESV" = 1 ]; then
  step resv-connect "reload nvme_core with multipath=N; hosts A (10.0.2.15) and B (10.0.2.16) connect to $NQN_RESV"
  UA=$(cat /proc/sys/kernel/random/uuid); UB=$(cat /proc/sys/kernel/random/uuid)
  HA=nqn.2014-08.org.nvmexpress:uuid:$UA; HB=nqn.2014-08.org.nvmexpress:uuid:$UB
  CA=""; CB=""; DA=""; DB=""; detail=""
  ip addr add 10.0.2.16/24 dev eth0
  if nvme_core_reload N; then
    nvconnect $NQN_RESV --hostnqn=$HA --hostid=$UA --host-traddr=10.0.2.15 && { CA=$CTRL; DA=$DEV; }
    nvconnect $NQN_RESV --hostnqn=$HB --hostid=$UB --host-traddr=10.0.2.16 && { CB=$CTRL; DB=$DEV; }
  else detail="nvme_core reload with multipath=N failed"; fi
  ok=FAIL
  if [ -n "$DA" ] && [ -n "$DB" ] && [ "$DA" != "$DB" ]; then
    ca=$(cat /sys/class/nvme/$CA/cntlid); cb=$(cat /sys/class/nvme/$CB/cntlid)
    sa=$(ls -d /sys/class/nvme-subsystem/*/$CA 2>/dev/null | cut -d/ -f5)
    sb=$(ls -d /sys/class/nvme-subsystem/*/$CB 2>/dev/null | cut -d/ -f5)
    detail="A: $CA /dev/$DA cntlid $ca $(cat /sys/class/nvme/$CA/hostnqn) in ${sa:-?}; B: $CB /dev/$DB cntlid $cb $(cat /sys/class/nvme/$CB/hostnqn) in ${sb:-?}"
    [ "$(cat /sys/class/nvme/$CA/hostnqn)" = "$HA" ] && [ "$(cat /sys/class/nvme/$CB/hostnqn)" = "$HB" ] \
      && [ "$ca" != "$cb" ] && [ -n "$sa" ] && [ "$sa" = "$sb" ] && ok=PASS
  else
    detail="${detail:+$detail; }A: ${CA:-no controller} ${DA:-no block device}, B: ${CB:-no controller} ${DB:-no block device}"
  fi
  res resv-connect-2hosts $ok "$detail"
  if [ $ok = PASS ]; then
    LBS=$(cat /sys/block/$DA/queue/logical_block_size); B4=$((4096 / LBS))   # LBAs in 4 KiB
    # where: 4 KiB at 2 MiB (written by A, then refused to B / to A once preempted),
    # 64 KiB at 3 MiB (written by B as holder), fio on A at 8 MiB + 4 MiB
    W=512; WL=$((W * B4))

    step resv-register "A registers key 0xA1, B registers 0xB2 (rrega 0); resv-report --eds from A"
    resv_report $DA; G0=$RGEN
    oka=FAIL; okb=FAIL
    nvs resv-register /dev/$DA --nrkey=0xA1 --rrega=0 && oka=PASS; na=$NVOUT
    nvs resv-register /dev/$DB --nrkey=0xB2 --rrega=0 && okb=PASS; nb=$NVOUT
    ok=FAIL; [ $oka = PASS ] && [ $okb = PASS ] && ok=PASS
    res resv-register $ok "A: $oka ($na); B: $okb ($nb)"
    ok=FAIL
    if resv_report $DA && isnum "$G0" && [ "$RGEN" = $((G0 + 2)) ] && [ "$RREGCTL" = 2 ] && [ "$RTYPE" = 0 ] \
       && [ "$RREGS" = "$(regs $UA 0xA1 0 $UB 0xB2 0)" ]; then ok=PASS; fi
    res resv-report-2 $ok "gen ${G0:-?} -> ${RGEN:-?} (expect +2), regctl=$RREGCTL, rtype=$RTYPE, registrants: $(echo $RREGS) (expect A=$UA key 0xA1, B=$UB key 0xB2)"

    step resv-acquire-we "A acquires Write Exclusive (rtype 1, racqa 0) with key 0xA1"
    G1=$RGEN; ok=FAIL
    # A writes the 4 KiB that B will try to overwrite (before: A is not yet the holder)
    dd if=/dev/urandom of=/tmp/wa bs=4096 count=1 2>/dev/null; HWA=$(sha256sum < /tmp/wa | cut -d' ' -f1)
    t 30 dd if=/tmp/wa of=/dev/$DA bs=4096 seek=$W oflag=direct conv=notrunc
    if nvs resv-acquire /dev/$DA --crkey=0xA1 --rtype=1 --racqa=0; then
      na=$NVOUT
      resv_report $DA && [ "$RTYPE" = 1 ] && [ "$RGEN" = "$G1" ] && [ "$RREGS" = "$(regs $UA 0xA1 1 $UB 0xB2 0)" ] && ok=PASS
      res resv-acquire-we $ok "$na; rtype=$RTYPE, gen $G1 -> $RGEN (an acquire keeps it), registrants: $(echo $RREGS) (expect A holder: rcsts 1)"
    else
      res resv-acquire-we FAIL "$NVOUT"
    fi

    step resv-we-b "A holds Write Exclusive: B's writes fail with Reservation Conflict, B's reads work"
    dd if=/dev/urandom of=/tmp/wb bs=4096 count=1 2>/dev/null
    write_conflict resv-we-b-write-conflict $DB "A's 4 KiB"
    hb=$(sha4k $DB $W)
    nvs read /dev/$DB -s $WL -c $((B4 - 1)) -z 4096 -d /tmp/rb; rc=$?; hr=$(sha256sum < /tmp/rb | cut -d' ' -f1)
    ok=FAIL; [ "$hb" = "$HWA" ] && [ $rc = 0 ] && [ "$hr" = "$HWA" ] && ok=PASS
    res resv-we-b-read-ok $ok "B reads A's 4 KiB at 2 MiB: dd sha256 ${hb:-none}, nvme read exit $rc sha256 $hr; A wrote $HWA"

    step resv-we-a-fio "A (the holder) runs fio randwrite 4k qd16 crc32c verify; meanwhile B keeps trying writes"
    # B's writes go to 4 MiB (outside A's fio region); each must fail with Reservation Conflict
    ( n=0; c=0; while [ ! -e /tmp/fio-done ]; do
        if ! timeout 30 nvme write /dev/$DB -s $((1024 * B4)) -c $((B4 - 1)) -z 4096 -d /tmp/wb > /tmp/bw.out 2>&1; then
          grep -q 'NVMe status: Reservation Conflict:' /tmp/bw.out && c=$((c + 1)); fi
        n=$((n + 1)); sleep 0.3
      done; echo "$n $c" > /tmp/bw.count ) &
    bpid=$!
    rm -f /tmp/fio-done; ok=FAIL
    fio_run resv-a 180 --filename=/dev/$DA --iodepth=16 --rw=randwrite --bs=4k --offset=8M --size=4M \
        --verify=crc32c --do_verify=1 && ok=PASS
    touch /tmp/fio-done; wait $bpid; set -- $(cat /tmp/bw.count 2>/dev/null || echo 0 -1)
    [ "$1" -ge 1 ] && [ "$1" = "$2" ] || ok=FAIL
    kn=$(dmesg | grep -iE 'nvme|nexus' | grep -ciE 'err|fail|reset|reconnect|timeout|timed out|abort|nexus|conflict|warn')
    [ "$kn" = 0 ] || { ok=FAIL; dmesg | grep -iE 'nvme|nexus' | sed 's/^/  dmesg: /'; }
    res resv-we-a-fio $ok "fio on /dev/$DA (see above); B's writes meanwhile: $2 of $1 refused with Reservation Conflict; kernel error/reset lines during the run: $kn"
    rm -f /tmp/fio-done

    step resv-preempt "B preempts A and aborts (racqa 2, prkey 0xA1) while A writes: B holds, A is no longer registered"
    G2=$RGEN
    # A's fio writes (randwrite 4k qd16, time-based) at 16 MiB + 4 MiB while B preempts and
    # aborts; A's fio must then end on a Reservation Conflict (EBADE, "Invalid exchange"),
    # and the 4 MiB B writes there right after the preempt completed must stay as B wrote
    # them: no write of A lands after the preempt
    w0=$(awk '{print $5}' /sys/block/$DA/stat)
    timeout 60 fio --name=resv-a-inflight --filename=/dev/$DA --direct=1 --ioengine=libaio --iodepth=16 \
        --rw=randwrite --bs=4k --offset=16M --size=4M --time_based --runtime=30 > /tmp/fio-inflight.txt 2>&1 &
    fpid=$!
    i=0; while [ $i -lt 75 ] && [ $(( $(awk '{print $5}' /sys/block/$DA/stat) - w0 )) -lt 200 ]; do sleep 0.2; i=$((i+1)); done
    wa=$(( $(awk '{print $5}' /sys/block/$DA/stat) - w0 ))
    okp=FAIL; nvs resv-acquire /dev/$DB --crkey=0xB2 --prkey=0xA1 --rtype=1 --racqa=2 && okp=PASS; np=$NVOUT
    dd if=/dev/urandom of=/tmp/wp bs=1M count=4 2>/dev/null; HWP=$(sha256sum < /tmp/wp | cut -d' ' -f1)
    t 60 dd if=/tmp/wp of=/dev/$DB bs=1M seek=16 oflag=direct conv=notrunc; rcp=$?
    i=0; while kill -0 $fpid 2>/dev/null && [ $i -lt 100 ]; do sleep 0.2; i=$((i+1)); done
    kill -0 $fpid 2>/dev/null && { log "A's fio still running 20 s after the preempt: stopping it"; kill $fpid; }
    wait $fpid; frc=$?
    grep -E 'err=|error' /tmp/fio-inflight.txt | head -n 4 | sed 's/^/  | /'
    ferr=$(grep -E 'err=' /tmp/fio-inflight.txt | sed -n 's/.*err= *\([0-9]*\).*/\1/p' | head -n1)
    h=$(sha4k $DB 4096 1024)
    ok=FAIL
    [ $okp = PASS ] && [ $wa -ge 200 ] && [ $frc -ne 0 ] && [ "$ferr" = 52 ] && [ $rcp = 0 ] && [ "$h" = "$HWP" ] && ok=PASS
    res resv-preempt-abort $ok "preempt: $np; A's fio had $wa writes done before it, then exit $frc err=${ferr:-?} (expect 52 = EBADE, Reservation Conflict); B's 4 MiB over A's fio region: dd exit $rcp, read back $([ "$h" = "$HWP" ] && echo intact || echo "CHANGED ($h, B wrote $HWP)")"
    write_conflict resv-preempted-a-write-conflict $DA "the 4 KiB"
    dd if=/dev/urandom of=/tmp/wh bs=64k count=1 2>/dev/null; HWH=$(sha256sum < /tmp/wh | cut -d' ' -f1)
    t 30 dd if=/tmp/wh of=/dev/$DB bs=64k seek=48 oflag=direct conv=notrunc; rc=$?
    h=$(sha4k $DA 768 16)
    ok=FAIL; [ $rc = 0 ] && [ "$h" = "$HWH" ] && ok=PASS
    res resv-holder-b-write-ok $ok "B's 64 KiB at 3 MiB: dd exit $rc; A reads back sha256 ${h:-none}, B wrote $HWH"
    ok=FAIL
    resv_report $DB && isnum "$G2" && [ "$RGEN" = $((G2 + 1)) ] && [ "$RTYPE" = 1 ] && [ "$RREGCTL" = 1 ] \
      && [ "$RREGS" = "$(regs $UB 0xB2 1)" ] && ok=PASS
    res resv-report-b-holder $ok "gen ${G2:-?} -> ${RGEN:-?} (expect +1: A unregistered), rtype=$RTYPE, regctl=$RREGCTL, registrants: $(echo $RREGS) (expect only B, holder)"

    step resv-release "B releases (rrela 0); a wrong key and an unknown action are refused; clear (rrela 1)"
    G3=$RGEN; ok=FAIL
    if nvs resv-release /dev/$DB --crkey=0xB2 --rtype=1 --rrela=0; then
      na=$NVOUT
      resv_report $DB && [ "$RTYPE" = 0 ] && [ "$RGEN" = "$G3" ] && [ "$RREGS" = "$(regs $UB 0xB2 0)" ] && ok=PASS
      res resv-release $ok "$na; rtype=$RTYPE, gen $G3 -> $RGEN (a release keeps it), registrants: $(echo $RREGS) (expect B, not holder)"
    else res resv-release FAIL "$NVOUT"; fi
    nvs resv-acquire /dev/$DB --crkey=0xB3 --rtype=1 --racqa=0; rc=$?
    ok=FAIL; [ $rc -ne 0 ] && is_status "Reservation Conflict" && ok=PASS
    res resv-bad-crkey $ok "B acquires with crkey 0xB3 (its key is 0xB2): exit $rc [$NVOUT]"
    nvs resv-acquire /dev/$DB --crkey=0xB2 --rtype=1 --racqa=5; rc=$?
    ok=FAIL; [ $rc -ne 0 ] && is_status "Invalid Field in Command" && ok=PASS
    na="$NVOUT"; G4=$RGEN
    # neither changed anything
    resv_report $DB && [ "$RTYPE" = 0 ] && [ "$RGEN" = "$G4" ] && [ "$RREGS" = "$(regs $UB 0xB2 0)" ] || ok=FAIL
    res resv-bad-racqa $ok "B acquires with racqa 5 (reserved): exit $rc [$na]; then rtype=$RTYPE gen=$RGEN registrants: $(echo $RREGS)"
    ok=FAIL; G5=$RGEN
    nvs resv-register /dev/$DA --nrkey=0xA1 --rrega=0; rca=$?
    if nvs resv-release /dev/$DB --crkey=0xB2 --rtype=1 --rrela=1; then
      na=$NVOUT
      t 30 dd if=/tmp/wb of=/dev/$DA bs=4096 seek=$W oflag=direct conv=notrunc; rc=$?
      resv_report $DA && [ $rca = 0 ] && isnum "$G5" && [ "$RGEN" = $((G5 + 2)) ] && [ "$RTYPE" = 0 ] \
        && [ "$RREGCTL" = 0 ] && [ -z "$RREGS" ] && [ $rc = 0 ] && ok=PASS
      res resv-clear $ok "A registered again (exit $rca), B clears: $na; gen ${G5:-?} -> ${RGEN:-?} (expect +2: register, clear), regctl=$RREGCTL rtype=$RTYPE; A's write afterwards: dd exit $rc"
    else res resv-clear FAIL "A registered again (exit $rca); B's clear: $NVOUT"; fi
  else
    for c in resv-register resv-report-2 resv-acquire-we resv-we-b-write-conflict resv-we-b-read-ok \
        resv-we-a-fio resv-preempt-abort resv-preempted-a-write-conflict resv-holder-b-write-ok \
        resv-report-b-holder resv-release resv-bad-crkey resv-bad-racqa resv-clear; do
      res $c FAIL "no two hosts"; done
  fi

  step resv-cleanup "disconnect A and B; reload nvme_core with multipath=Y"
  nvdisconnect $NQN_RESV
  ip addr del 10.0.2.16/24 dev eth0
  nvme_core_reload Y || log "nvme_core is not back to multipath=Y: the next checks run without native multipath"

  # the kernel's log of all resv-* steps: nothing but the conflicts the checks provoked
  step resv-dmesg "guest kernel log of the reservation steps"
  bad=$(awk -v da="$DA" -v db="$DB" '
    /^== step /{s=$3; next}
    s !~ /^resv-/ || !/nvme|nexus/ {next}
    !/[Ee]rr|[Ff]ail|[Ii]nvalid|[Tt]imeout|timed out|[Ii]gnor|[Ww]arn|[Rr]eset|[Rr]econnect|[Uu]nsupported|not supported|[Mm]ismatch|[Dd]igest|[Tt]erm|[Aa]bort|[Rr]efus|[Nn]exus|[Cc]onflict|[Dd]eprecated/ {next}
    s == "resv-connect" && /Found shared namespace|shared namespaces without CONFIG_NVME_MULTIPATH/ {next}
    # the rate limiter of the conflict lines below, when many writes are refused at once
    (s == "resv-we-b" || s == "resv-preempt") && /nvme_log_error: [0-9]+ callbacks suppressed/ {next}
    s == "resv-we-b" && db != "" && (index($0, db ": I/O Cmd(0x1) @ LBA ") && index($0, "(sct 0x0 / sc 0x83)") || index($0, "critical nexus error, dev " db ",")) {next}
    s == "resv-preempt" && da != "" && (index($0, da ": I/O Cmd(0x1) @ LBA ") && index($0, "(sct 0x0 / sc 0x83)") || index($0, "critical nexus error, dev " da ",")) {next}
    {print "[" s "] " $0}' /tmp/dmesg.all)
  [ -n "$bad" ] && echo "$bad" | sed 's/^/  unexpected: /'
  ok=FAIL; [ -z "$bad" ] && [ -n "$DA" ] && ok=PASS
  res resv-dmesg $ok "$(echo "$bad" | grep -c .) unexpected nvme kernel lines (allowed: the shared-namespace notice at connect, Reservation Conflict on B's writes under A's reservation and on A's after the preempt, and the rate limiter's notice of those)"
fi

# 11. volumes (flashpool only): a raid6 volume on 6 mem drives keeps every fio verify
# while the host fails two drives, replaces both (rebuild throttled so it overlaps I/O),
# and still reads back after two of the original drives fail in turn. Then a volume
# created through the API appears as nsid 2 (Namespace Attribute Changed AEN) and goes.
if [ "${VOL:-0}" = 1 ]; then
  R6A="--iodepth=16 --rw=randwrite --bs=4k --offset=0 --size=12M --verify=crc32c"
  R6B="--iodepth=16 --rw=randwrite --bs=4k --offset=40M --size=12M --verify=crc32c"
  step raid6-fio-degraded "connect $NQN_R6; fio randwrite 4k crc32c verify while drives d1, then d4 fail"
  if nvconnect $NQN_R6; then
    R6=$DEV; R6C=$CTRL
    ok=PASS
    fio_run r6a 300 --filename=/dev/$R6 $R6A --do_verify=1 > /tmp/r6a.out 2>&1 & fpid=$!
    sleep 1
    ask_cli r6-fail-d1 "drive fail d1" || ok=FAIL
    sleep 1
    ask_cli r6-fail-d4 "drive fail d4" || ok=FAIL
    wait $fpid || ok=FAIL
    cat /tmp/r6a.out
    res raid6-fio-degraded $ok
    step raid6-fio-rebuild "fio randwrite verify while d1 -> s0, then d4 -> s1 are replaced and rebuilt"
    ok=PASS
    fio_run r6b 300 --filename=/dev/$R6 $R6B --do_verify=1 > /tmp/r6b.out 2>&1 & fpid=$!
    ask_cli r6-replace-d1 "drive replace d1 --with s0" || ok=FAIL
    ask_cli r6-rebuilt-1 "volume rebuild-status r6 --wait" || ok=FAIL
    ask_cli r6-replace-d4 "drive replace d4 --with s1" || ok=FAIL
    ask_cli r6-rebuilt-2 "volume rebuild-status r6 --wait" || ok=FAIL
    wait $fpid || ok=FAIL
    cat /tmp/r6b.out
    res raid6-fio-rebuild $ok
    step raid6-verify-rebuilt "fail original drives d0 and d2: both regions verify from the rebuilt s0 and s1"
    ok=PASS
    ask_cli r6-fail-d0 "drive fail d0" || ok=FAIL
    ask_cli r6-fail-d2 "drive fail d2" || ok=FAIL
    fio_run r6a 120 --filename=/dev/$R6 $R6A --verify_only=1 || ok=FAIL
    fio_run r6b 120 --filename=/dev/$R6 $R6B --verify_only=1 || ok=FAIL
    res raid6-verify-rebuilt $ok
    step ns-add-aen "host: volume create extra --export $NQN_R6 --nsid 2; the kernel finds nsid 2"
    ok=FAIL
    if ask_cli r6-ns-add "volume create extra --layout raid1 --drives e0,e1 --export $NQN_R6 --nsid 2"; then
      i=0; while [ $i -lt 50 ]; do
        ls /sys/class/nvme/$R6C | grep -qE '^nvme[0-9]+(c[0-9]+)?n2$' && { ok=PASS; break; }
        sleep 0.2; i=$((i+1)); done
    fi
    log "namespaces of $R6C: $(ls /sys/class/nvme/$R6C | grep -E 'n[0-9]+$' | tr '\n' ' ')"
    res ns-add-aen $ok
    step ns-remove-aen "host: volume unexport extra; nsid 2 goes away"
    ok=FAIL
    if ask_cli r6-ns-remove "volume unexport extra --force"; then
      i=0; while [ $i -lt 50 ]; do
        ls /sys/class/nvme/$R6C | grep -qE '^nvme[0-9]+(c[0-9]+)?n2$' || { ok=PASS; break; }
        sleep 0.2; i=$((i+1)); done
    fi
    res ns-remove-aen $ok
    # online growth: a thin volume grows while connected; the kernel sees the new size by
    # itself (Namespace Attribute Changed) and a write past the old end works
    # The pool is encrypted and compressed (LZ4): this check and the snapshot checks after
    # it (ext4, fio verify, snapshot, clone) run on compressed chunks under AES-XTS.
    step ns-grow-aen "host: a thin volume (encrypted LZ4 pool on e0,e1) as nsid 2, 8 MiB, grown to 12 MiB; the kernel sees it"
    ok=FAIL; d=""
    if ask_cli r6-extra-delete "volume delete extra --force" \
      && ask_cli r6-pool "volume create pl --layout raid1 --drives e0,e1 --thin-pool --encrypt --compression lz4" \
      && ask_cli r6-thin "volume create tg --pool pl --size 8MiB --export $NQN_R6 --nsid 2"; then
      nsd=""; i=0; while [ $i -lt 50 ]; do
        nsd=$(ls /sys/class/nvme/$R6C | grep -E '^nvme[0-9]+(c[0-9]+)?n2$' | head -n 1)
        [ -n "$nsd" ] && [ "$(cat /sys/class/nvme/$R6C/$nsd/size 2> /dev/null)" = 16384 ] && break
        sleep 0.2; i=$((i+1)); done
      s0=$(cat /sys/class/nvme/$R6C/$nsd/size 2> /dev/null)
      if [ -n "$nsd" ] && ask_cli r6-grow "volume grow tg --size 12MiB"; then
        i=0; while [ $i -lt 50 ]; do
          [ "$(cat /sys/class/nvme/$R6C/$nsd/size 2> /dev/null)" = 24576 ] && break
          sleep 0.2; i=$((i+1)); done
        s1=$(cat /sys/class/nvme/$R6C/$nsd/size 2> /dev/null)
        bdev=$(echo "$nsd" | sed 's/c[0-9]*n/n/')
        [ -b "/dev/$bdev" ] || bdev=$nsd
        # the block past the old end (8 MiB = 2048 blocks of 4 KiB), written and read back
        head -c 4096 /dev/urandom > /tmp/grow.blk
        dd if=/tmp/grow.blk of=/dev/$bdev bs=4096 seek=2050 count=1 oflag=direct 2> /tmp/grow.dd \
          && dd if=/dev/$bdev of=/tmp/grow.back bs=4096 skip=2050 count=1 iflag=direct 2>> /tmp/grow.dd \
          && cmp -s /tmp/grow.blk /tmp/grow.back && w=ok || w="failed: $(tail -n 1 /tmp/grow.dd)"
        d="$nsd: $s0 -> $s1 sectors; write+read past the old end on /dev/$bdev: $w"
        [ "$s0" = 16384 ] && [ "$s1" = 24576 ] && [ "$w" = ok ] && ok=PASS
      else d="nsid 2 not seen at 8 MiB (size ${s0:-none}) or the grow failed"; fi
    else d="making the pool or the thin volume failed"; fi
    res ns-grow-aen $ok "$d"
    snapshot_checks
    nvdisconnect $NQN_R6
  else
    for c in raid6-fio-degraded raid6-fio-rebuild raid6-verify-rebuilt ns-add-aen ns-remove-aen ns-grow-aen \
      fs-grow-online snap-during-fio snap-ro-mount clone-rw-fsck; do
      res $c FAIL "no connection to $NQN_R6"; done
  fi
fi

# 13. cluster (flashpool, root, iproute2): the host runs enclosure nodes in network
# namespaces and an owner node on its loopback (tests/cluster/lib.sh) whose raid6 (nsid 1)
# and ec4+2 (nsid 2) volumes are made of the enclosures' drives. fio write+verify loops run
# on both namespaces while the host, one step at a time ("@@HOST cluster:STEP"), kills
# enclosures, cuts links and brings them back, and replaces a drive; the host prints each
# step's RESULT. Never more than two enclosures away: no I/O error may reach this host.
if [ "${CLUSTER:-0}" = 1 ]; then
  step cluster-setup "host: enclosures in network namespaces, owner on $HOSTIP:$CL_IO with r6 (raid6) and ec (ec4+2) on their drives"
  if wait_host cluster-up 300; then
    IO_SAVED=$IO; IO=$CL_IO; C_R6=""; C_EC=""
    step cluster-connect "connect to $NQN_CL on the owner (:$CL_IO): nsid 1 = r6, nsid 2 = ec"
    if nvconnect $NQN_CL; then
      C_R6=$DEV; C_EC=${DEV%n1}n2; C_CTRL=$CTRL
      i=0; while [ ! -b /dev/$C_EC ] && [ $i -lt 50 ]; do sleep 0.2; i=$((i+1)); done
    fi
    ok=FAIL; [ -n "$C_R6" ] && [ -b "/dev/$C_EC" ] && ok=PASS
    res cluster-connect $ok "${C_CTRL:-no controller}: r6 /dev/${C_R6:-none} $( [ -n "$C_R6" ] && echo $(( $(cat /sys/block/$C_R6/size) / 2048 )) MiB), ec /dev/${C_EC:-none} $( [ -b "/dev/$C_EC" ] && echo $(( $(cat /sys/block/$C_EC/size) / 2048 )) MiB)"
    if [ $ok = PASS ]; then
      # cl_load DEV TAG: rounds of fio randwrite 16k qd16 over 8 MiB, each verified (crc32c,
      # its own seed: a stale block from an earlier round fails), until /tmp/cl-stop
      cl_load() {
        local n=0 f=0 rc
        while [ ! -e /tmp/cl-stop ]; do
          n=$((n+1))
          timeout 240 fio --name=cl-$2 --filename=/dev/$1 --direct=1 --ioengine=libaio --iodepth=16 \
            --rw=randwrite --bs=16k --size=8M --verify=crc32c --do_verify=1 --verify_fatal=1 \
            --randseed=$((7000 + n)) > /tmp/fio-cl-$2.txt 2>&1; rc=$?
          if [ $rc -ne 0 ]; then
            f=$((f+1)); log "cluster fio $2 round $n FAILED (rc $rc)"
            grep -E 'err=|verify|bad|error' /tmp/fio-cl-$2.txt | head -n 6 | sed 's/^/  fio: /'
          fi
        done
        echo "$n $f" > /tmp/cl-$2.count
      }
      rm -f /tmp/cl-stop /tmp/cl-r6.count /tmp/cl-ec.count
      cl_load $C_R6 r6 & clp1=$!
      cl_load $C_EC ec & clp2=$!
      sleep 2
      for s in $(echo $CL_STEPS | tr , ' '); do
        step cluster-$s "host: $s (fio keeps writing and verifying on both volumes)"
        wait_host cluster:$s 200 || log "host: step $s did not pass ($HOSTSAYS)"
        sleep 1
      done
      step cluster-fio "stop the fio rounds; each round verified what it wrote"
      touch /tmp/cl-stop; wait $clp1; wait $clp2
      for v in r6 ec; do
        set -- $(cat /tmp/cl-$v.count 2>/dev/null || echo 0 -1)
        ok=FAIL; [ "$1" -ge 2 ] && [ "$2" = 0 ] && ok=PASS
        res cluster-fio-$v $ok "$1 rounds of fio randwrite 16k qd16 8 MiB crc32c verify across all the steps, $2 failed"
      done
      # every cluster step's kernel log: no I/O error, timeout or reset on the owner's paths
      step cluster-dmesg "guest kernel log of the cluster steps"
      bad=$(awk '/^== step /{s=$3; next} s ~ /^cluster-/ && /nvme|blk_|I\/O|Buffer/ \
        && /[Ee]rr|[Ff]ail|[Tt]imeout|timed out|[Rr]eset|[Rr]econnect|[Aa]bort|critical|[Ii]nvalid/ {print "[" s "] " $0}' /tmp/dmesg.all)
      [ -n "$bad" ] && echo "$bad" | head -n 30 | sed 's/^/  unexpected: /'
      ok=FAIL; [ -z "$bad" ] && ok=PASS
      res cluster-dmesg $ok "$(echo "$bad" | grep -c .) nvme/block error, timeout or reset lines while both volumes stayed within redundancy"
    else
      for c in cluster-fio-r6 cluster-fio-ec cluster-dmesg; do res $c FAIL "no connection"; done
    fi
    [ -n "$C_R6" ] && nvdisconnect $NQN_CL
    IO=$IO_SAVED
  else
    for c in cluster-connect cluster-fio-r6 cluster-fio-ec cluster-dmesg; do res $c FAIL "no cluster: $HOSTSAYS"; done
  fi
  wait_host cluster-down 120
fi

# 10. reverse direction: this guest's kernel nvmet-tcp is the TARGET and the host's
# `flashpool bench` (our user-space initiator) connects to it through QEMU hostfwd
# 127.0.0.1:REV_PORT -> guest:4420. The host runs the host-* checks and prints their
# RESULT lines; the guest only serves, then hashes the region the host names in its
# "DONE rev-target-ready ok OFFSET LENGTH mapfail=N" answer (host-data-on-ramdisk compares).
if [ "$REV" = 1 ]; then
  step rev-target "kernel nvmet-tcp target $NQN_REV (ns 1 = /dev/ram0, any host) on :4420 for the host's flashpool bench"
  S=$CFS/subsystems/$NQN_REV; P=$CFS/ports/1
  mkdir $S && echo 1 > $S/attr_allow_any_host && mkdir $S/namespaces/1 \
    && echo -n /dev/ram0 > $S/namespaces/1/device_path && echo 1 > $S/namespaces/1/enable \
    || log "configfs: setting up $NQN_REV failed"
  if [ ! -d $P ]; then   # flashpool mode: no nvmet port yet (self-test/mock: port 1 is :4420)
    mkdir $P; echo tcp > $P/addr_trtype; echo ipv4 > $P/addr_adrfam
    echo 0.0.0.0 > $P/addr_traddr; echo 4420 > $P/addr_trsvcid
  fi
  ln -s $S $P/subsystems/$NQN_REV || log "configfs: linking $NQN_REV to port 1 failed"
  log "nvmet: port 1 $(cat $P/addr_trtype) $(cat $P/addr_traddr):$(cat $P/addr_trsvcid), $NQN_REV ns 1 $(cat $S/namespaces/1/device_path) enable=$(cat $S/namespaces/1/enable), /dev/ram0 $(( $(cat /sys/block/ram0/size) / 2048 )) MiB"
  dmesg | grep -E 'nvmet' | tail -n 3 | sed 's/^/  dmesg: /'
  # wait_host rev-target-ready, and meanwhile (its WAIT_HOOK) carry out the host's "FLAP ID
  # SECONDS" requests (host-remote-reconnect): the port link of $NQN_REV goes away (nvmet
  # deletes its controllers, their TCP connections close; a port left with no subsystem stops
  # listening) and comes back SECONDS later; "@@HOST-ACK flap-ID" once it is back.
  FLAPPED=" "
  rev_flaps() {
    local id secs
    for id in $(sed -n 's/^FLAP \([0-9][0-9]*\) [0-9.][0-9.]*$/\1/p' /tmp/ctl); do
      case "$FLAPPED" in *" $id "*) continue;; esac
      FLAPPED="$FLAPPED$id "
      secs=$(sed -n "s/^FLAP $id \([0-9.][0-9.]*\)\$/\1/p" /tmp/ctl | head -n1)
      rm $P/subsystems/$NQN_REV && log "flap $id: $NQN_REV unlinked from port 1 for $secs s"
      sleep "$secs"
      ln -s $S $P/subsystems/$NQN_REV && log "flap $id: $NQN_REV linked to port 1 again"
      echo "@@HOST-ACK flap-$id"
    done
  }
  WAIT_HOOK=rev_flaps
  wait_host rev-target-ready $REV_WAIT
  WAIT_HOOK=""
  set -- $HOSTSAYS; off=${4:-0}; len=${5:-0}; mapfail=${6#mapfail=}
  # commands the host sent over the target's transfer limit on purpose (host-r2t-large probe)
  c=$(dmesg | grep -cE 'nvmet_tcp: queue [0-9]+: failed to map data')
  if [ "${mapfail:-0}" -gt 0 ] 2>/dev/null && [ "$c" -le "$mapfail" ]; then
    KN_EXPECTED='nvmet_tcp: queue [0-9]+: failed to map data'
    log "nvmet_tcp 'failed to map data' x$c: expected (the host announced $mapfail command(s) over the target's transfer limit)"
  fi
  echo "  kernel log while the host's flashpool bench used the target (nvme/nvmet lines):"
  dmesg | grep -E 'nvme|nvmet' | tail -n 40 | sed 's/^/  dmesg: /'
  g=none; z=none; m=none
  if [ "$len" -gt 0 ] 2>/dev/null; then
    g=$(timeout 60 dd if=/dev/ram0 bs=4096 skip=$((off/4096)) count=$((len/4096)) iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
    z=$(dd if=/dev/zero bs=4096 count=$((len/4096)) 2>/dev/null | sha256sum | cut -d' ' -f1)
    m=$(dd if=/dev/ram0 bs=512 skip=$((off/512)) count=1 iflag=direct 2>/dev/null | head -c 4 | od -An -tx1 | tr -d ' \n')
  fi
  log "sha256 of /dev/ram0 bytes $off..+$len: $g (all-zero: $z); first block starts with $m"
  echo "@@HOST rev-sha256 off=$off len=$len sha=$g zero=$z magic=${m:-none}"
  sleep 0.2; echo "@@HOST rev-sha256 off=$off len=$len sha=$g zero=$z magic=${m:-none}"   # twice: see finish
  rm $P/subsystems/$NQN_REV 2>/dev/null; echo 0 > $S/namespaces/1/enable
fi

step kernel-notes "kernel messages about nvme that no check expected"
kernel_notes | head -n 40

# 9. last: connect with a short KATO and power off without disconnecting
step kato "connect --keep-alive-tmo=$KATO to $NQN_MEM, then poweroff -f while connected"
if nvconnect $NQN_MEM --keep-alive-tmo=$KATO; then
  cid=$(cat /sys/class/nvme/$CTRL/cntlid)
  k=$(cat /sys/class/nvme/$CTRL/kato 2>/dev/null || echo "?")
  sha_dev $DEV 0 1 > /dev/null
  res kato-connect PASS "$CTRL cntlid=$cid kato=$k"
  echo "@@HOST kato-armed cntlid=$cid kato=$KATO"
  sleep 0.2; echo "@@HOST kato-armed cntlid=$cid kato=$KATO"   # twice: see finish
else
  res kato-connect FAIL
fi
log "guest checks: $NPASS passed, $NFAIL failed"
# EXIT trap: guest-done marker + poweroff -f (QEMU runs with -no-shutdown: the guest's
# sockets stay open and silent on the host, as for a host that lost power)
GUEST_INIT
}

# ---------------------------------------------------------------- run
# (accelerator, ports, serial markers, target start/stop, control channel: tests/lib/harness.sh)
HR=$CACHE/run/host-results.txt
write_config() {
  local d
  {
    # (kek_file: made at the first start; the thin pool "pl" is encrypted)
    printf '# generated by tests/interop/run.sh\n[node]\nreactors = %s\nlog = "%s"\nkek_file = "%s"\n' \
      "$REACTORS" "${TARGET_LOG_LEVEL:-info}" "$RUN/kek"
    printf '\n[transport]\nmax_io_queues = 8\n'
    toml_listener "$IO_PORT" io
    toml_listener "$DISC_PORT" discovery
    interop_subsystem "$NQN_MEM"
    toml_namespace 1 mem "size = \"$((MEM_SIZE >> 20))MiB\"" "block_size = 512"
    interop_subsystem "$NQN_FILE"
    toml_namespace 1 file "path = \"$FILE_IMG\"" "create = true" "size = \"$((FILE_SIZE >> 20))MiB\"" "block_size = 512"
    interop_subsystem "$NQN_DENIED" "allow_any_host = false" "hosts = [\"$OTHER_HOST\"]"
    toml_namespace 1 mem "size = \"$((DENIED_SIZE >> 20))MiB\""
    interop_subsystem "$NQN_RESV"
    toml_namespace 1 mem "size = \"$((RESV_SIZE >> 20))MiB\"" "block_size = 512"
    auth_config
    printf '\n[api]\naddress = "127.0.0.1:%s"\n' "$API_PORT"
    printf '\n[[volume]]\nname = "r6"\nlayout = "raid6"\ndrives = ["d0", "d1", "d2", "d3", "d4", "d5"]\nrebuild_rate = "8MiB"\n'
    interop_subsystem "$NQN_R6"
    toml_namespace 1 volume 'volume = "r6"'
    for d in d0 d1 d2 d3 d4 d5 s0 s1 e0 e1; do
      toml_drive "$d" mem "$(case $d in e*) echo 64MiB;; *) echo 32MiB;; esac)"
    done
  } > "$RUN/target.toml"
}
# interop_subsystem NQN [LINE...]: a subsystem with this suite's serial and model, open to
# any host unless LINE says otherwise
interop_subsystem() {
  local nqn=$1; shift
  toml_subsystem "$nqn" "serial = \"$SERIAL\"" "model = \"$MODEL\"" "${@:-allow_any_host = true}"
}
# the DH-HMAC-CHAP subsystems (only when the auth checks run): keys in $RUN/keys, mode 0600
auth_config() {
  [ "${auth:-0}" = 1 ] || return 0
  local d=$RUN/keys n
  mkdir -p "$d"; chmod 700 "$d"
  ( umask 077
    dhchap_key 01 32 > "$d/host1"; dhchap_key 01 32 > "$d/ctrl1"
    dhchap_key 02 48 > "$d/host2"; dhchap_key 03 64 > "$d/host3" )
  for n in "" -h2 -h3; do
    interop_subsystem "$NQN_AUTH$n" "require_auth = true"
    printf '\n[[subsystem.host]]\nnqn = "%s"\n' "$HOSTNQN"
    case $n in
      "") printf 'dhchap_key_file = "%s"\ndhchap_ctrl_key_file = "%s"\n' "$d/host1" "$d/ctrl1";;
      *) printf 'dhchap_key_file = "%s"\n' "$d/host${n#-h}";;
    esac
    toml_namespace 1 mem 'size = "16MiB"' "block_size = 512"
  done
}

# ---------------------------------------------------------------- reverse direction
# flashpool bench (our user-space NVMe/TCP host) -> the guest kernel's nvmet-tcp target,
# through QEMU hostfwd 127.0.0.1:REV_PORT -> guest:4420. Run when the guest prints
# "@@HOST rev-target-ready"; the guest waits (REV_BUDGET + 90 s) for "DONE rev-target-ready
# ok OFFSET LENGTH mapfail=N" (N: commands the host sent over the target's transfer limit
# on purpose, whose nvmet_tcp "failed to map data" lines are then no KERNEL-NOTE), then
# prints "@@HOST rev-sha256 off= len= sha= zero= magic=". (rev_bench, rev_pair: tests/lib/harness.sh)
run_reverse() {
  local rc det ok maxh2c icd note
  REV_T0=$(ts)
  PY3=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null || echo python3)
  REV_TGT="tcp://127.0.0.1:$REV_PORT/$NQN_REV"
  say "guest kernel nvmet-tcp target ready: $BENCH_BIN bench -> $REV_TGT (hostnqn $REV_HOSTNQN)"

  # 1. connect + identify
  rc=0; rev_bench identify 30 --rw randread --bs 4k --qd 1 --runtime 1s || rc=$?
  det=$(bench_detail identify)
  [ -n "$det" ] || det=$(sed -n 's/^ *target *//p' "$RUN/rev-identify.txt" | head -n1)
  REV_LBA=$(echo "$det" | sed -n 's/.* \([0-9][0-9]*\) B LBAs.*/\1/p')
  maxh2c=$(echo "$det" | sed -n 's/.*MAXH2CDATA \([0-9][0-9]*\) B.*/\1/p')
  icd=$(echo "$det" | sed -n 's/.*in-capsule \([0-9][0-9]*\) B.*/\1/p')
  ok=FAIL
  [ $rc -eq 0 ] && [[ "$det" == *'"Linux"'* ]] && [[ "$det" == *"$NQN_REV"* ]] && [ -n "$REV_LBA" ] && ok=PASS
  hres host-connect-identify $ok "exit $rc; ${det:-no target detail: $(grep -v '^\$' "$RUN/rev-identify.txt" | tail -n 2 | tr '\n' ' ')}"
  REV_LBA=${REV_LBA:-512}
  # in the background: fpv1_stamp.py checked against the bench on a local file (4 KiB
  # blocks), and its prediction for the target's LBA size (for host-data-on-ramdisk)
  local stamp_pid
  (
    truncate -s $((4 << 20)) "$RUN/stamp-check.img"
    rc=0; timeout 30 "$BENCH_BIN" bench --target "file:$RUN/stamp-check.img" --rw write --bs 128k --qd 4 \
        --verify --size $((2 << 20)) --seed 0x0da7a5 -q > "$RUN/stamp-check.txt" 2>&1 || rc=$?
    echo $rc > "$RUN/stamp-check.rc"
    head -c $((2 << 20)) "$RUN/stamp-check.img" | sha256sum | cut -d' ' -f1 > "$RUN/stamp-check.sha"
    rm -f "$RUN/stamp-check.img"
    for l in $(printf "4096\n%s\n" "$REV_LBA" | sort -u); do
      timeout 60 "${PY3:-python3}" "$HERE/fpv1_stamp.py" --lba-size $l --bs 131072 --size $((2 << 20)) --seed 0x0da7a5 \
          > "$RUN/stamp-mirror-$l.txt" 2>&1 &
    done
    wait
  ) > /dev/null 2>&1 &
  stamp_pid=$!

  # 2. 4 KiB random writes at QD16 with --verify, then a verified read pass (same seed)
  ok=FAIL; rev_pair nodigest 0x51a7e0 $((8 << 20)) 60 randwrite --bs 4k --qd 16 && ok=PASS
  hres host-verify-nodigest $ok "randwrite+read 4k qd16 8 MiB: $PAIR_DETAIL"

  # 3. the same with CRC32C header and data digests
  ok=FAIL; rev_pair digest 0xd16e57 $((8 << 20)) 60 randwrite --bs 4k --qd 16 --hdr-digest --data-digest && ok=PASS
  det=$(bench_detail digest-write)
  [[ "$det" == *"digests header on data on"* ]] || { ok=FAIL; PAIR_DETAIL="$PAIR_DETAIL; digests not on: $det"; }
  hres host-verify-digest $ok "randwrite+read 4k qd16 8 MiB, hdr+data digest: $PAIR_DETAIL"

  # 4. large writes: beyond the in-capsule size (R2T + H2CData). The kernel target's R2T
  # asks for the whole command; a host must split it into H2CData PDUs of at most
  # MAXH2CDATA, which needs a command larger than MAXH2CDATA: probe 8 MiB (one write, QD1).
  local mapfail=0 big=$((8 << 20)) err
  ok=FAIL; rev_pair r2t1m 0x7a27e1 $((16 << 20)) 90 write --bs 1M --qd 4 && ok=PASS
  note="1 MiB (R2T, in-capsule limit ${icd:-?} B): $PAIR_DETAIL; target MAXH2CDATA ${maxh2c:-?} B"
  if [ -z "$maxh2c" ]; then
    ok=FAIL; note="$note: MAXH2CDATA unknown (no target detail), 8 MiB probe not run"
  elif [ "$maxh2c" -ge $big ]; then
    note="$note >= 8 MiB: H2CData splitting not exercised"
  else
    rc=0; rev_bench r2t8m 90 --rw write --bs 8M --qd 1 --verify --size 8M --seed 0x7a27e8 || rc=$?
    err=$(grep -a 'error' "$RUN/rev-r2t8m.txt" | head -n1 | sed 's/^flashpool: //')
    if [ $rc -eq 0 ]; then
      note="$note; 8 MiB write: $(verify_counts r2t8m), each write split into $(( (big + maxh2c - 1) / maxh2c )) H2CData PDUs"
      [[ "$(verify_counts r2t8m)" == *"readback=$(( big / REV_LBA )) mismatches=0" ]] || { ok=FAIL; note="$note: not every block read back"; }
    elif [[ "$err" == *"largest transfer"* ]]; then
      note="$note; 8 MiB is over the target's MDTS ($err): H2CData splitting not exercised"
    elif [[ "$err" == *"SC 0x0f"* ]]; then
      # Linux nvmet-tcp (nvmet_tcp_map_data) refuses any command whose SGL length exceeds
      # its MAXH2CDATA with Data SGL Length Invalid, although Identify says MDTS 0 (no limit)
      mapfail=1
      note="$note; 8 MiB probe refused by the target ($err) although its MDTS is 0 (no limit): Linux nvmet-tcp rejects commands over its MAXH2CDATA, so H2CData splitting cannot be exercised against it"
      if [ "$maxh2c" -gt $((1 << 20)) ] && [ $(( maxh2c % REV_LBA )) -eq 0 ]; then
        rc=0; rev_pair r2tmax 0x7a27e4 $(( 4 * maxh2c )) 90 write --bs "$maxh2c" --qd 2 || rc=$?
        [ $rc -eq 0 ] || ok=FAIL
        note="$note; $maxh2c B (= MAXH2CDATA, the largest it takes): $PAIR_DETAIL"
      fi
    else
      ok=FAIL; note="$note; 8 MiB write (H2CData split in $(( (big + maxh2c - 1) / maxh2c )) PDUs) FAILED: exit $rc: ${err:-$(tail -n 2 "$RUN/rev-r2t8m.txt" | tr '\n' ' ')}"
    fi
  fi
  hres host-r2t-large $ok "$note"

  # 4b. --engine remote: the jobs share one RemoteDevice (the path a volume takes to a
  # remote drive: queues on their own runtime, keep-alive, timeouts, reconnect)
  local rdet resv
  ok=FAIL; rev_pair remote 0x4e3073 $((4 << 20)) 60 randwrite --bs 4k --qd 8 --jobs 2 --engine remote && ok=PASS
  rdet=$(bench_detail remote-write)
  [[ "$rdet" == *"engine remote: 2 queues shared by 2 jobs"* ]] || { ok=FAIL; PAIR_DETAIL="$PAIR_DETAIL; not 2 queues of the remote engine: ${rdet:-no detail}"; }
  resv=$(echo "$rdet" | sed -n 's/.*reservations \(supported\|not supported\);.*/\1/p')
  hres host-remote-verify $ok "randwrite+read 4k qd8, 2 jobs on one RemoteDevice, 4 MiB: $PAIR_DETAIL; target reservations (ONCS): ${resv:-unknown}"

  # 4c. the link drops during a remote-engine run and comes back: the guest unlinks the
  # subsystem from its nvmet port for 1.5 s ("FLAP" on the control channel); the device
  # reconnects and retries the I/O that failed, so the run ends without an I/O error or a
  # verify mismatch, and with more than one connection made
  local fpid frc=0 fi=0 acked=no conns fv
  rev_bench remote-flap 60 --engine remote --jobs 2 --queues 2 --rw randrw --bs 4k --qd 8 \
      --size 4M --runtime 8s --fail-after 20s --verify > "$RUN/rev-remote-flap.out" 2>&1 & fpid=$!
  sleep 2.5
  while [ $fi -lt 12 ] && kill -0 "$QPID" 2>/dev/null; do
    send_ctl "FLAP 1 1.5"
    has_marker "@@HOST-ACK flap-1" && { acked=yes; break; }
    sleep 0.5; fi=$((fi+1))
  done
  wait "$fpid" || frc=$?
  cat "$RUN/rev-remote-flap.out"
  fv=$(verify_counts remote-flap)
  conns=$(bench_detail remote-flap | sed -n 's/.*; \([0-9][0-9]*\) connections\{0,1\} made$/\1/p')
  ok=FAIL
  note="randrw 4k qd8 2 jobs 8 s --verify, link flap 1.5 s (guest acked: $acked): exit $frc, $fv, connections made: ${conns:-?}"
  if [ $frc -eq 0 ] && [[ "$fv" == *" mismatches=0" ]] && [[ "$fv" != "checked=0 "* ]] && [ "${conns:-0}" -ge 2 ]; then ok=PASS
  elif [ $frc -eq 0 ] && [ "${conns:-0}" -lt 2 ]; then note="$note: no reconnect happened (did the flap reach the link?)"
  elif [ $frc -ne 0 ]; then note="$note: $(grep -a -m1 -iE 'error|failed' "$RUN/rev-remote-flap.txt" | sed 's/^flashpool: //')"; fi
  hres host-remote-reconnect $ok "$note"

  # 4d. (flashpool mode) the node takes the guest's namespace as a remote volume member:
  # with no reservations at the target (Linux 6.1's nvmet) it must refuse before writing
  # anything, with an error that names the URL and the reason (docs/config.md)
  if [[ " $REV_CHECKS " == *" host-remote-no-resv "* ]]; then
    local rurl="tcp://127.0.0.1:$REV_PORT/$NQN_REV?nsid=1" vrc=0 vout
    timeout 60 "$BIN" volume create rev-resv --layout concat --drives "$rurl" --api "127.0.0.1:$API_PORT" \
        > "$RUN/cli-rev-resv.txt" 2>&1 || vrc=$?
    vout=$(grep -v '^$' "$RUN/cli-rev-resv.txt" | tr '\n' ' ')
    say "flashpool volume create rev-resv --drives $rurl: exit $vrc: $vout"
    ok=FAIL; note="target reservations (ONCS): ${resv:-unknown}; volume create on it: exit $vrc: $vout"
    if [ "$resv" = "not supported" ]; then
      [ $vrc -ne 0 ] && [[ "$vout" == *"$rurl: the target does not support reservations"* ]] && ok=PASS
    elif [ "$resv" = supported ] && [ $vrc -eq 0 ]; then
      ok=PASS; note="$note (the target has reservations: the volume was made, now deleted)"
      timeout 60 "$BIN" volume delete rev-resv --force --api "127.0.0.1:$API_PORT" >> "$RUN/cli-rev-resv.txt" 2>&1 || true
    fi
    hres host-remote-no-resv $ok "$note"
  fi

  # 5. a sequential verified write whose bytes are predictable (tests/interop/fpv1_stamp.py,
  # checked against the bench itself on a local file first); the guest hashes /dev/ram0
  local dsize=$((2 << 20)) dseed=0x0da7a5 wrc=0 lrc=0 exp="" mirror=no lsha msha g
  rev_bench ramdisk-write 60 --rw write --bs 128k --qd 4 --verify --size $dsize --seed $dseed || wrc=$?
  wait "$stamp_pid" 2>/dev/null || true
  lrc=$(cat "$RUN/stamp-check.rc" 2>/dev/null || echo 1)
  lsha=$(cat "$RUN/stamp-check.sha" 2>/dev/null || true)
  msha=$(head -n1 "$RUN/stamp-mirror-4096.txt" 2>/dev/null || true)
  exp=$(head -n1 "$RUN/stamp-mirror-$REV_LBA.txt" 2>/dev/null || true)
  if [ "$lrc" = 0 ] && [ -n "$lsha" ] && [ "$lsha" = "$msha" ] && [ ${#exp} = 64 ]; then
    mirror=yes
  else
    exp=""
    say "fpv1_stamp.py does not reproduce the bench's --verify bytes (local file: exit $lrc, sha256 ${lsha:-none}; mirror ${msha:-none}): verify.rs changed? host-data-on-ramdisk falls back to a non-zero check"
  fi
  say "host-data-on-ramdisk: expected sha256 of bytes 0..+$dsize on the guest's /dev/ram0: ${exp:-unknown}"
  answer_guest rev-target-ready "ok 0 $dsize mapfail=$mapfail"
  local i=0 line=""
  while [ $i -lt 240 ] && kill -0 "$QPID" 2>/dev/null; do
    line=$(serial | grep -a '^@@HOST rev-sha256 .* magic=[0-9a-fnoe]*$' | head -n1 || true)
    [ -n "$line" ] && break
    sleep 0.25; i=$((i+1))
  done
  g=$(echo "$line" | sed -n 's/.* sha=\([^ ]*\).*/\1/p')
  local z m; z=$(echo "$line" | sed -n 's/.* zero=\([^ ]*\).*/\1/p'); m=$(echo "$line" | sed -n 's/.* magic=\([^ ]*\).*/\1/p')
  ok=FAIL
  if [ -z "$line" ]; then note="the guest printed no rev-sha256 line"
  elif [ $wrc -ne 0 ]; then note="bench write exit $wrc ($(verify_counts ramdisk-write)); guest sha256 $g"
  elif [ $mirror = yes ]; then
    [ "$g" = "$exp" ] && ok=PASS
    note="2 MiB seq write 128k: guest sha256 $g, expected $exp (fpv1_stamp.py for $REV_LBA B LBAs; it matched the bench on a local file)"
  else
    [ "$g" != "$z" ] && [ "$m" = 46505631 ] && ok=PASS
    note="weaker check (fpv1_stamp.py no longer matches the bench): bench read-back $(verify_counts ramdisk-write); guest sha256 $g vs all-zero $z, first bytes $m (FPV1 = 46505631)"
  fi
  hres host-data-on-ramdisk $ok "$note"
  say "reverse direction done in $(el "$REV_T0") s"
}

# (cleanup, the EXIT trap: tests/lib/harness.sh) the cluster phase's nodes, namespaces, veths
# and bridge, on any exit
cleanup_more() {
  if [ "${CL_ON:-0}" = 1 ]; then fpc_cleanup || true; fi
}

# ---------------------------------------------------------------- cluster phase (host side)
# The guest asks "@@HOST cluster-up", then "@@HOST cluster:STEP" per fault step, then
# "@@HOST cluster-down"; tests/cluster/lib.sh does the work and prints the RESULT lines.
cluster_prepare() {   # sets CL_ON=1 and the owner's ports when the phase runs; CL_NOTE otherwise
  CL_ON=0; CL_NOTE=""
  [ "$CLUSTER" = 0 ] && { CL_NOTE="CLUSTER=0"; return; }
  if [ "$1" != flashpool ] || [ "$MOCK" = 1 ]; then CL_NOTE="flashpool mode only"; return; fi
  export FPC_BIN=$BIN FPC_DIR=$CACHE/cluster
  . "$ROOT/tests/cluster/lib.sh"
  if ! fpc_preflight || ! command -v python3 > /dev/null; then
    CL_NOTE="${FPC_WHY:-python3 missing}"
    if [ "$CLUSTER" = 1 ]; then CL_ON=1; else return; fi   # CLUSTER=1: counted, and failing
  fi
  CL_ON=1
  assign_ports CL_IO=14520 CL_DISC=18109 CL_API=19510
  fpc_cleanup || true   # what a crashed earlier run left
}
# cluster_poll: one pass of the host loop over the guest's cluster markers
CL_DONE=""
cluster_poll() {
  local line name st
  while IFS= read -r line; do
    name=${line#@@HOST }; name=${name%% *}
    case " $CL_DONE " in *" $name "*) continue;; esac
    CL_DONE="$CL_DONE $name"
    HOST_DOING="$name from $(el "$T0") s"
    case $name in
      cluster-up)
        if [ -n "$CL_NOTE" ]; then hres cluster-up FAIL "cannot run here: $CL_NOTE"; st=fail
        elif fpc_scenario_up "$CL_IO" "$CL_DISC" "$CL_API" "$NQN_CL"; then st=ok; else st=fail; fi;;
      cluster:*)
        fpc_scenario_step "${name#cluster:}" || true   # (lib.sh is written for set +e)
        st=ok; tail -n 1 "$HR" | grep -q "^RESULT cluster-${name#cluster:} PASS" || st=fail;;
      cluster-down)
        if [ -z "$CL_NOTE" ]; then fpc_scenario_down || true; else hres cluster-teardown FAIL "not run: $CL_NOTE"; fi
        st=ok;;
      *) continue;;
    esac
    answer_guest "$name" "$st" || true
    HOST_DOING="$HOST_DOING to $(el "$T0") s"
  done < <(serial | grep -aE '^@@HOST cluster(-up|-down|:)' || true)
  return 0
}

# kato_armed_cid: the cntlid of the guest's first whole "kato-armed" line (none: empty)
kato_armed_cid() {
  serial | grep -a '^@@HOST kato-armed' | sed -n 's/.*cntlid=\([0-9]*\) kato=[0-9]*$/\1/p' | head -n1 || true
}

# run_checks (do_run: tests/lib/harness.sh)
run_checks() {
  local t0=$T0 accel rc=0 tb="" restart_done=0 kato_cid="" kato_t="" done_t="" st
  local rev=0 rev_done=0 rev_note="" vol=0 cli_done="" cline cname cargs crc resv=0 ptpl=0
  assign_ports IO_PORT=14420 DISC_PORT=18009 CTL_PORT=15555 API_PORT=19410 REV_PORT=14430
  rm -rf "$RUN"; mkdir -p "$RUN"; : > "$HR"; : > "$RUN/target.log"
  trap cleanup EXIT
  local mode=flashpool fwd_io fwd_disc
  [ "$SELFTEST" = 1 ] && mode=selftest
  if [ "$MOCK" = 1 ]; then
    BIN=$HERE/mock-target.py
    fwd_io=$(free_port $((CTL_PORT+1))); fwd_disc=$(free_port $((fwd_io+1)))
    [ "$REV_PORT" = "$fwd_io" ] || [ "$REV_PORT" = "$fwd_disc" ] && REV_PORT=$(free_port $((fwd_disc+1)))
    export MOCK_UPSTREAM_IO=$fwd_io MOCK_UPSTREAM_DISC=$fwd_disc
  fi
  local hostuuid; hostuuid=$(cat /proc/sys/kernel/random/uuid)
  REV_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$(cat /proc/sys/kernel/random/uuid)
  if [ "$REV" != 1 ]; then rev_note="REV=$REV"
  elif [ "$mode" != flashpool ] || [ "$MOCK" = 1 ]; then   # self-test, mock: only if possible
    if [ ! -x "$BENCH_BIN" ]; then rev_note="no initiator binary at $BENCH_BIN (cargo build --release, or set BENCH_BIN)"
    elif ! command -v python3 > /dev/null; then rev_note="python3 missing (needed for the JSON summaries)"
    else rev=1; fi
  else rev=1; fi     # flashpool mode: they count (and fail if BENCH_BIN cannot run)
  # host-remote-no-resv asks the flashpool node (its API) to use the guest's drive: flashpool mode only
  [ "$mode" = flashpool ] && [ "$MOCK" != 1 ] || REV_CHECKS=${REV_CHECKS/ host-remote-no-resv/}
  # reservations: flashpool only (Linux 6.1's nvmet has none); PTPL only if the build has it
  local expect_ver=0x10300     # the self-test and mock targets are Linux 6.1's nvmet (VS 1.3)
  if [ $mode = flashpool ] && [ "$MOCK" != 1 ]; then
    resv=1; expect_ver=0x10400
    [ -e "$PTPL_READY" ] && ptpl=1
  fi
  # DH-HMAC-CHAP: flashpool only, and only if the guest kernel has the host side
  local auth=0 auth_note=""
  if [ $mode != flashpool ] || [ "$MOCK" = 1 ]; then auth_note="flashpool mode only"
  elif ! grep -qE '^CONFIG_NVME_AUTH=(y|m)' "$KROOT/boot/config-$K" 2> /dev/null; then
    auth_note="guest kernel $K is built without CONFIG_NVME_AUTH: nvme-fabrics takes no dhchap_secret"
  elif ! command -v python3 > /dev/null; then auth_note="python3 missing (it makes the DHHC-1 keys)"
  else auth=1; fi
  cluster_prepare $mode
  local CL_CHECKS=""; [ "$CL_ON" = 1 ] && CL_CHECKS="$CLUSTER_GUEST_CHECKS $FPC_CHECKS_HOST"
  local expect_all; expect_all=$(echo $GUEST_CHECKS $HOST_CHECKS $VOL_CHECKS $([ $rev = 1 ] && echo $REV_CHECKS) \
      $([ $resv = 1 ] && echo $RESV_CHECKS) $([ $ptpl = 1 ] && echo $PTPL_CHECKS) \
      $([ $auth = 1 ] && echo $AUTH_CHECKS) $CL_CHECKS | wc -w)
  local HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$hostuuid

  if [ $mode = flashpool ]; then
    [ -x "$BIN" ] || abort_run "$expect_all" "flashpool binary not found at $BIN: run 'cargo build --release' first (or set FLASHPOOL_BIN)"
    write_config
    rm -f "$FILE_IMG"
    start_target_or_fail "$expect_all"
  fi

  qemu_accel; accel=$QEMU_ACCEL
  local netdev="user,id=n0,ipv6=off,hostfwd=tcp:127.0.0.1:$CTL_PORT-10.0.2.15:5555"
  if [ "$MOCK" = 1 ]; then
    netdev="$netdev,hostfwd=tcp:127.0.0.1:$fwd_io-10.0.2.15:4420,hostfwd=tcp:127.0.0.1:$fwd_disc-10.0.2.15:8009"
  fi
  if [ $mode = selftest ]; then
    netdev="$netdev,hostfwd=tcp:127.0.0.1:$IO_PORT-10.0.2.15:4420,hostfwd=tcp:127.0.0.1:$DISC_PORT-10.0.2.15:8009"
  fi
  # reverse direction: flashpool bench on the host -> the guest kernel's nvmet-tcp
  [ $rev = 1 ] && netdev="$netdev,hostfwd=tcp:127.0.0.1:$REV_PORT-10.0.2.15:4420"
  local append="console=ttyS0 panic=-1 quiet fp_mode=$mode fp_io=$IO_PORT fp_disc=$DISC_PORT"
  append="$append fp_nqn_mem=$NQN_MEM fp_nqn_file=$NQN_FILE fp_nqn_denied=$NQN_DENIED"
  append="$append fp_other_host=$OTHER_HOST fp_hostnqn=$HOSTNQN fp_hostid=$hostuuid"
  append="$append fp_sn=$SERIAL fp_mn=$MODEL fp_mem_size=$MEM_SIZE fp_file_size=$FILE_SIZE"
  append="$append fp_denied_size=$DENIED_SIZE fp_kato=$KATO fp_nvmet=$MOCK"
  append="$append fp_rev=$rev fp_nqn_rev=$NQN_REV fp_rev_wait=$((REV_BUDGET + 90))"
  [ $mode = flashpool ] && [ "$MOCK" != 1 ] && vol=1
  append="$append fp_vol=$vol fp_nqn_r6=$NQN_R6"
  append="$append fp_resv=$resv fp_nqn_resv=$NQN_RESV fp_resv_size=$RESV_SIZE fp_ptpl=$ptpl"
  append="$append fp_expect_ver=$expect_ver"
  if [ $auth = 1 ]; then
    append="$append fp_auth=1 fp_nqn_auth=$NQN_AUTH fp_ak1=$(cat "$RUN/keys/host1") fp_akc=$(cat "$RUN/keys/ctrl1")"
    append="$append fp_ak2=$(cat "$RUN/keys/host2") fp_ak3=$(cat "$RUN/keys/host3")"
  fi
  if [ "$CL_ON" = 1 ]; then
    append="$append fp_cluster=1 fp_nqn_cl=$NQN_CL fp_cl_io=$CL_IO fp_cl_steps=$(echo $FPC_STEPS | tr ' ' ,)"
  fi
  say "mode=$mode$([ "$MOCK" = 1 ] && echo '(mock target)') accel=$accel kernel=$K initrd=$(du -h "$INITRD" | cut -f1) ports io=$IO_PORT disc=$DISC_PORT ctl=$CTL_PORT$([ $rev = 1 ] && echo " rev=$REV_PORT")"
  [ $rev = 1 ] || say "reverse-direction checks skipped: $rev_note"
  [ $resv = 1 ] && [ $ptpl = 0 ] && say "SKIP $PTPL_CHECKS: $PTPL_READY does not exist (the target build has no PTPL)"
  [ $auth = 1 ] || say "SKIP $AUTH_CHECKS: $auth_note"
  if [ "$CL_ON" = 1 ]; then say "cluster phase: owner on 127.0.0.1:$CL_IO (api :$CL_API), state in $FPC_DIR${CL_NOTE:+; cannot run: $CL_NOTE}"
  else say "cluster phase skipped: $CL_NOTE"; fi
  say "guest hostnqn $HOSTNQN; logs in $RUN"
  # -no-shutdown: after the guest's poweroff QEMU stays (stopped), so the guest's TCP
  # connections stay open and silent, like a host that lost power; the host kills QEMU.
  qemu_start "$K" "$INITRD" "$append" "$netdev" -no-shutdown

  local died=0
  while kill -0 "$QPID" 2>/dev/null; do
    if [ $mode = flashpool ] && [ $died = 0 ] && [ -n "$TPID" ] && ! kill -0 "$TPID" 2>/dev/null; then
      died=1; say "flashpool pid $TPID is gone! last log lines:"; tail -n 20 "$RUN/target.log" | sed 's/^/    /'
    fi
    [ -z "$tb" ] && has_marker '@@ .*init start' && { tb=$(el "$t0"); say "guest /init started after $tb s"; }
    guest_progress
    if [ $restart_done = 0 ] && has_marker '@@HOST restart-target'; then
      restart_done=1
      if [ $mode = flashpool ]; then
        say "guest asks for a target restart: SIGTERM flashpool pid $TPID"
        st=ok
        stop_target || st=fail
        local sd="$STOP_DETAIL"
        if ! start_target; then st=fail; sd="$sd; restart failed"; fi
        if [ $st = ok ]; then hres target-restart PASS "stop: $sd; listening again"
        else hres target-restart FAIL "stop: $sd"; fi
        answer_guest restart-target "$([ -n "$TPID" ] && echo ok || echo fail)"
      else
        answer_guest restart-target ok
      fi
    fi
    # the guest asks for a flashpool CLI call: "@@HOST cli:NAME ARGS..."
    if [ $vol = 1 ] && has_marker '@@HOST cli:'; then
      while IFS= read -r cline; do
        cname=${cline#@@HOST cli:}; cname=${cname%% *}; cargs=${cline#@@HOST cli:$cname}
        case " $cli_done " in *" $cname "*) continue;; esac
        cli_done="$cli_done $cname"; crc=0
        timeout 170 "$BIN" $cargs --api "127.0.0.1:$API_PORT" > "$RUN/cli-$cname.txt" 2>&1 || crc=$?
        say "flashpool$cargs: exit $crc; $(tail -n 3 "$RUN/cli-$cname.txt" | tr '\n' ' ')"
        answer_guest "cli:$cname" "$([ $crc = 0 ] && echo ok || echo fail)"
      done < <(serial | grep -a '^@@HOST cli:' || true)
    fi
    [ "$CL_ON" = 1 ] && has_marker '@@HOST cluster' && cluster_poll
    if [ $rev = 1 ] && [ $rev_done = 0 ] && has_marker '@@HOST rev-target-ready'; then
      rev_done=1
      HOST_DOING="reverse checks from $(el "$t0") s"
      run_reverse
      HOST_DOING="$HOST_DOING to $(el "$t0") s"
    fi
    if [ -z "$kato_cid" ] && has_marker '@@HOST kato-armed'; then
      kato_cid=$(kato_armed_cid)
      kato_t=$(ts)
    fi
    if [ -z "$done_t" ] && has_marker '@@HOST guest-done'; then
      done_t=$(ts); say "guest powered off after $(el "$t0") s"
      break
    fi
    sleep 0.5
  done

  guest_progress
  # the kato-armed line may have come in the same pass as guest-done
  if [ -z "$kato_cid" ]; then
    kato_cid=$(kato_armed_cid)
  fi
  # 9. KATO: QEMU is still alive (-no-shutdown), the guest silent; wait for the target
  if [ $mode = flashpool ]; then
    if [ -n "$kato_cid" ] && [ -n "$done_t" ]; then
      local lim=$((KATO + KATO_MARGIN)) found=""
      say "waiting up to $lim s for 'controller $kato_cid freed: keep-alive timeout'"
      while [ "$(awk -v a="$done_t" -v b="$(ts)" 'BEGIN{print (b-a < '"$lim"') ? 1 : 0}')" = 1 ]; do
        # the cntlid may have been used before: only lines after its last 'created'
        found=$(tlog_since | awk -v c="controller $kato_cid created: subsystem $NQN_MEM, host $HOSTNQN" \
            -v f="controller $kato_cid freed: " 'index($0, c) {seen=1; next} seen && index($0, f) {print; exit}')
        [ -n "$found" ] && break
        if ! kill -0 "$TPID" 2>/dev/null; then break; fi
        sleep 0.2
      done
      local el_k; el_k=$(el "$done_t")
      if [[ "$found" == *"freed: keep-alive timeout"* ]]; then
        hres kato-timeout PASS "freed ${el_k} s after poweroff (KATO ${KATO} s): $(echo "$found" | sed 's/.*controller/controller/')"
      elif [ -n "$found" ]; then
        hres kato-timeout FAIL "wrong reason after ${el_k} s: $found"
      else
        hres kato-timeout FAIL "no 'controller $kato_cid freed' within ${lim} s of poweroff"
      fi
    else
      # where the guest stopped: the only clue a CI log's summary keeps of a stuck guest
      local ls ll
      ls=$(serial | grep -a '^@@ .*STEP' | tail -n 1 | sed 's/^@@ //' | cut -c1-100 || true)
      ll=$(serial | grep -av '^[[:space:]]*$' | tail -n 1 | cut -c1-120 || true)
      hres kato-timeout FAIL "guest never armed the KATO check (cntlid=${kato_cid:-none}, done=${done_t:+yes}) after $(el "$t0") s; its last step: ${ls:-none}; its last line: ${ll:-none}; the host's last action: ${HOST_DOING:-none}"
    fi
  fi
  if kill -0 "$QPID" 2>/dev/null; then
    kill "$QPID" 2>/dev/null || true
  fi
  wait "$QPID" 2>/dev/null || rc=$?
  QPID=""
  [ -n "$done_t" ] || say "QEMU ended (status $rc) without the guest-done marker: guest crash or RUN_TIMEOUT=$RUN_TIMEOUT"

  if [ $mode = flashpool ]; then
    # 8b. the target logged the refusal
    local dl; dl=$(grep -F "host $HOSTNQN not allowed on $NQN_DENIED" "$RUN/target.log" | head -n1 || true)
    if [ -n "$dl" ]; then hres denied-host-log PASS "$(echo "$dl" | sed 's/.*host nqn/host nqn/')"
    else hres denied-host-log FAIL "no 'host $HOSTNQN not allowed on $NQN_DENIED' in the target log"; fi
    # 13b. the target logged the refused authentications (host and reason), and no secret
    if [ $auth = 1 ]; then
      local al leak=""; al=$(grep -F "authentication refused for host $HOSTNQN" "$RUN/target.log" | head -n1 || true)
      for f in "$RUN"/keys/*; do
        grep -qF "$(cut -d: -f3 "$f")" "$RUN/target.log" && leak="$leak ${f##*/}"
      done
      if [ -n "$leak" ]; then hres auth-target-log FAIL "the target log holds the secret(s):$leak"
      elif [ -n "$al" ]; then hres auth-target-log PASS "$(echo "$al" | sed 's/.*authentication refused/authentication refused/')"
      else hres auth-target-log FAIL "no 'authentication refused for host $HOSTNQN' in the target log"; fi
    fi
    # the target survived the run
    if [ -n "$TPID" ] && kill -0 "$TPID" 2>/dev/null && port_busy "$IO_PORT" && port_busy "$DISC_PORT"; then
      hres target-alive-after-run PASS "pid $TPID, ports accept"
      if stop_target; then hres target-clean-stop PASS "$STOP_DETAIL"
      else hres target-clean-stop FAIL "$STOP_DETAIL"; fi
    else
      hres target-alive-after-run FAIL "flashpool is gone$(tail -n 3 "$RUN/target.log" | tr '\n' ' ' | sed 's/^/: /')"
      hres target-clean-stop FAIL "not running"
    fi
  fi
  if [ "$CL_ON" = 1 ]; then   # a guest that never got to "cluster-down": tear down here
    case " $CL_DONE " in *" cluster-up "*) case " $CL_DONE " in *" cluster-down "*) ;; *) [ -z "$CL_NOTE" ] && { fpc_scenario_down || true; };; esac;; esac
    fpc_cleanup || true
  fi
  trap - EXIT

  # ---- report
  local all="$GUEST_CHECKS" c
  [ $mode = flashpool ] && all="$all $HOST_CHECKS"
  [ $vol = 1 ] && all="$all $VOL_CHECKS"
  [ $resv = 1 ] && all="$all $RESV_CHECKS"
  [ $ptpl = 1 ] && all="$all $PTPL_CHECKS"
  [ $auth = 1 ] && all="$all $AUTH_CHECKS"
  [ $rev = 1 ] && all="$all $REV_CHECKS"
  all="$all $CL_CHECKS"
  # shellcheck disable=SC2086   # $all: the checks, one word each
  tally_results $all
  if [ -n "$FAILED" ] || [ "$VERBOSE" = 1 ]; then
    dump_guest_logs
    if [ $mode = flashpool ]; then
      echo "----- target log tail ($RUN/target.log) -----"; tail -n 60 "$RUN/target.log"
    fi
  fi
  echo "----- summary ($mode, accel $accel, guest /init at ${tb:-?} s, total $(el "$t0") s) -----"
  cat "$RUN/summary.txt"
  if serial | grep -a '^KERNEL-NOTE' > /dev/null; then
    echo "kernel messages (guest dmesg) that no check expected:"
    serial | grep -a '^KERNEL-NOTE' | sed 's/^KERNEL-NOTE /  /'
  fi
  [ $mode = selftest ] && echo "(self-test: host-side checks [$HOST_CHECKS] apply to flashpool only)"
  [ $rev = 1 ] || echo "(reverse-direction checks [$REV_CHECKS] skipped, not counted: $rev_note)"
  [ $resv = 1 ] || echo "(reservation checks [$(echo $RESV_CHECKS $PTPL_CHECKS)] apply to flashpool only, not counted)"
  [ $resv = 1 ] && [ $ptpl = 0 ] && echo "SKIP $PTPL_CHECKS (not counted: $PTPL_READY did not exist at the start of the run)"
  [ $auth = 1 ] || echo "SKIP $AUTH_CHECKS (not counted: $auth_note)"
  [ "$CL_ON" = 1 ] || echo "(cluster checks [$CLUSTER_GUEST_CHECKS cluster-*] skipped, not counted: $CL_NOTE)"
  if [ "$CL_ON" = 1 ] && [ -n "$FAILED" ]; then
    for c in $FPC_DIR/owner.log $FPC_DIR/e1.log $FPC_DIR/e3.log; do
      [ -f "$c" ] && { echo "----- $c (tail) -----"; tail -n 40 "$c"; }
    done
  fi
  report_results
}

# shellcheck disable=SC2034   # (suite_main's usage line)
SUITE_FLAGS="--self-test|--mock-target"
suite_flag() {
  case $1 in
    --self-test|--selftest) SELFTEST=1;;
    --mock-target) MOCK=1;;
    *) return 1;;
  esac
}
suite_main "$@"
