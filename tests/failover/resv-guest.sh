# shellcheck shell=dash disable=SC2039,SC3043,SC2086,SC2034,SC2015
# tests/failover/resv-guest.sh -- the guest side of the resv-follow case (sourced by
# guest-init.sh; the host side and the why: tests/failover/resv.sh).
#
# Two Linux hosts in one guest: host A is the guest's own Host NQN/ID, host B a second pair
# given to `nvme connect --hostnqn --hostid`. The kernel keeps one nvmf host per pair and
# sends each pair's Connect with its own Host ID, so the target sees two hosts; their
# controllers share one subsystem and one multipath head (nvme_init_subsystem finds the
# subsystem by its NQN alone), so each host's commands go through that host's own
# controller's char device (/dev/nvmeX: NVME_IOCTL_IO_CMD, which needs the controller to
# have one namespace: rvol is alone in its subsystem), never through the shared head.

OFF_resv_follow=none      # no fio region: the case writes single blocks only
OFF_resv_follow_thin=none # the same on a thin volume of a cluster pool
RESV_KA=41377; RESV_KB=45746   # 0xa1a1, 0xb2b2 (resv-report prints the keys in hex)

# resv_ctrl HOSTNQN ADDR: the live controller nvmeX of $RESV_NQN for HOSTNQN at ADDR
resv_ctrl() {
  local c i=0
  while [ $i -lt 150 ]; do
    for c in /sys/class/nvme/nvme*; do
      [ "$(cat "$c/subsysnqn" 2> /dev/null)" = "$RESV_NQN" ] || continue
      [ "$(cat "$c/hostnqn" 2> /dev/null)" = "$1" ] || continue
      sed -n 's/.*traddr=\([^,]*\).*/\1/p' "$c/address" 2> /dev/null | grep -qx "$2" || continue
      [ "$(cat "$c/state" 2> /dev/null)" = live ] || continue
      echo "${c##*/}"; return 0
    done
    sleep 0.2; i=$((i+1))
  done
  return 1
}
# resv_report CTRL: "gen=G rtype=T regctl=N keys=K1,K2" (keys sorted) from nvme resv-report
resv_report() {
  nvme resv-report "/dev/$1" -n 1 -e > /tmp/resv-report.txt 2>&1 || { echo "failed:$(tail -n 1 /tmp/resv-report.txt | tr ' ' _)"; return 1; }
  awk '$1=="gen"{g=$3} $1=="rtype"{t=$3} $1=="regctl"{n=$3} $1=="rkey"{k[++m]=$3}
       END{for(i=1;i<=m;i++)for(j=i+1;j<=m;j++)if(k[j]<k[i]){x=k[i];k[i]=k[j];k[j]=x}
           s="";for(i=1;i<=m;i++)s=s (i>1?",":"") k[i]; printf "gen=%s rtype=%s regctl=%s keys=%s\n", g, t, n, s}' /tmp/resv-report.txt
}
# resv_write CTRL: Write of one block at LBA 0 through CTRL; its output in /tmp/resv-write.txt
resv_write() {
  nvme io-passthru "/dev/$1" --opcode=1 --namespace-id=1 --data-len="$RESV_LBS" --cdw10=0 --cdw12=0 \
    --write --input-file=/tmp/resv-blk > /tmp/resv-write.txt 2>&1
}
resv_fail() { RESV_OK=0; RESV_WHY="$RESV_WHY${RESV_WHY:+;}$(echo "$*" | tr ' ' _)"; log "resv-follow: $*"; }
ip_of() { echo " $HOSTSAYS " | sed -n 's/.* ip=\([^ ]*\) .*/\1/p'; }

# resv_verify LABEL ADDR: through host A's and B's controllers at ADDR (the owner now):
# both registered, A holds Write Exclusive, at the generation seen first; B's write gets
# Reservation Conflict, A's succeeds
resv_verify() {
  local label=$1 a b ra rb
  a=$(resv_ctrl "$HOSTNQN" "$2") && b=$(resv_ctrl "$RESV_BNQN" "$2") \
    || { resv_fail "$label: no live controller of both hosts at $2"; return 1; }
  ra=$(resv_report "$a"); rb=$(resv_report "$b")
  log "resv-follow $label: report through $a (host A) at $2: $ra; through $b (host B): $rb"
  [ -n "$RESV_GEN" ] || RESV_GEN=$(echo "$ra" | sed -n 's/^gen=\([0-9]*\) .*/\1/p')
  [ "$ra" = "gen=$RESV_GEN rtype=1 regctl=2 keys=a1a1,b2b2" ] || resv_fail "$label: host A's report: $ra (want gen=$RESV_GEN rtype=1 regctl=2 keys=a1a1,b2b2)"
  [ "$rb" = "$ra" ] || resv_fail "$label: host B's report differs: $rb"
  if resv_write "$b"; then resv_fail "$label: host B's write succeeded (no Reservation Conflict)"
  elif ! grep -qiE 'reservation.?conflict|0x83' /tmp/resv-write.txt; then resv_fail "$label: host B's write: $(tail -n 1 /tmp/resv-write.txt)"; fi
  resv_write "$a" || resv_fail "$label: host A's write failed: $(tail -n 1 /tmp/resv-write.txt)"
  RESV_SEEN="$RESV_SEEN${RESV_SEEN:+;}${label}:$(echo "$ra" | tr ' ' ,),B-write-conflict"
}
# resv_standby LABEL ADDR: a non-owner answers no Reservation Report (ANA inaccessible)
resv_standby() {
  local a; a=$(resv_ctrl "$HOSTNQN" "$2") || return 0   # the node is down: nothing to ask
  if nvme resv-report "/dev/$a" -n 1 -e > /tmp/resv-report.txt 2>&1; then
    resv_fail "$1: the standby node at $2 answered a Reservation Report: $(grep -E '^(gen|rtype|regctl) ' /tmp/resv-report.txt | tr -s ' \n' ' ')"
  fi
}

# resv_connect A|B ADDR: that host's connection to ADDR, up to 3 tries 2 s apart. A retry is
# reported in the case's result line with the errno and the guest kernel's last nvme line,
# so a refused Connect stays visible even when a later try gets through.
resv_connect() {
  local n=1 err
  while :; do
    if [ "$1" = A ]; then
      timeout 60 nvme connect -t tcp -a "$2" -s "$PORT" -n "$RESV_NQN" --ctrl-loss-tmo=-1 --reconnect-delay=1 \
        --keep-alive-tmo="$KATO" > /tmp/resv-connect.txt 2>&1 && return 0
    else
      # nvme-cli 2.3 refuses a second connection to an address and subsystem it already has,
      # whatever the Host NQN ("already connected", --duplicate-connect or not); the kernel
      # takes it: the same options as nvme connect, written to /dev/nvme-fabrics in one write
      # (dd, so that the errno of a refused write is printed)
      printf 'transport=tcp,traddr=%s,trsvcid=%s,nqn=%s,hostnqn=%s,hostid=%s,ctrl_loss_tmo=-1,reconnect_delay=1,keep_alive_tmo=%s' \
        "$2" "$PORT" "$RESV_NQN" "$RESV_BNQN" "$RESV_BID" "$KATO" \
        | dd of=/dev/nvme-fabrics bs=4096 iflag=fullblock status=none > /tmp/resv-connect.txt 2>&1 && return 0
    fi
    err="$(tail -n 1 /tmp/resv-connect.txt) (kernel: $(dmesg | grep -i nvme | tail -n 1 | cut -c1-160))"
    log "resv-follow: host $1: connect to $2, try $n: $err"
    [ $n -lt 3 ] || { resv_fail "host $1: connect to $2 (3 tries): $err"; return 1; }
    RESV_RETRIED="$RESV_RETRIED${RESV_RETRIED:+;}host-$1-connect-$2-retried:$(echo "$err" | tr ' ,' _.)"
    n=$((n+1)); sleep 2
  done
}

resv_case() {
  local tag=$1 a ip ip0 i
  RESV_OK=1; RESV_WHY=""; RESV_SEEN=""; RESV_GEN=""; RESV_RETRIED=""
  RESV_BID=$(echo "$HOSTID" | sed 's/.$/b/'); [ "$RESV_BID" = "$HOSTID" ] && RESV_BID=$(echo "$HOSTID" | sed 's/.$/c/')
  RESV_BNQN=nqn.2014-08.org.nvmexpress:uuid:$RESV_BID
  log "STEP $tag: reservations through one owner, a planned move, a kill -9 of the new owner"
  wait_host "resv:setup:$tag" 120 || { resv_fail "host: setup: $HOSTSAYS"; wait_host "check:$tag" 120 "ok=0 why=$RESV_WHY"; return; }
  RESV_NQN=$(echo " $HOSTSAYS " | sed -n 's/.* nqn=\([^ ]*\) .*/\1/p'); ip=$(ip_of)
  for a in $(echo "$CTRLS" | tr , ' '); do
    resv_connect A "$a"; resv_connect B "$a"
  done
  for a in $(echo "$CTRLS" | tr , ' '); do
    resv_ctrl "$HOSTNQN" "$a" > /dev/null && resv_ctrl "$RESV_BNQN" "$a" > /dev/null || resv_fail "no live controller of both hosts at $a"
  done
  RESV_LBS=4096; for i in /sys/class/nvme-subsystem/*/nvme*n1; do
    [ "$(cat "${i%/*}/subsysnqn" 2> /dev/null)" = "$RESV_NQN" ] && RESV_LBS=$(cat "/sys/block/${i##*/}/queue/logical_block_size") && break
  done
  dd if=/dev/urandom of=/tmp/resv-blk bs="$RESV_LBS" count=1 2> /dev/null
  log "resv-follow: host B is $RESV_BNQN; owner at $ip; block $RESV_LBS"
  if a=$(resv_ctrl "$HOSTNQN" "$ip") && b=$(resv_ctrl "$RESV_BNQN" "$ip"); then
    nvme resv-register "/dev/$a" -n 1 --nrkey=$RESV_KA --rrega=0 > /tmp/resv-cmd.txt 2>&1 || resv_fail "A register: $(tail -n 1 /tmp/resv-cmd.txt)"
    nvme resv-register "/dev/$b" -n 1 --nrkey=$RESV_KB --rrega=0 > /tmp/resv-cmd.txt 2>&1 || resv_fail "B register: $(tail -n 1 /tmp/resv-cmd.txt)"
    nvme resv-acquire "/dev/$a" -n 1 --crkey=$RESV_KA --rtype=1 --racqa=0 > /tmp/resv-cmd.txt 2>&1 || resv_fail "A acquire: $(tail -n 1 /tmp/resv-cmd.txt)"
  else resv_fail "no controller of both hosts at the owner $ip"; fi
  resv_verify first-owner "$ip"
  ip0=$ip
  if wait_host "resv:move:$tag" 120; then
    ip=$(ip_of); resv_verify after-move "$ip"; resv_standby after-move "$ip0"
  else resv_fail "host: move: $HOSTSAYS"; fi
  ip0=$ip
  if wait_host "resv:kill:$tag" 120; then
    ip=$(ip_of); resv_verify after-kill "$ip"
  else resv_fail "host: kill: $HOSTSAYS"; fi
  # leave nothing behind: host A clears the reservation and every registration
  a=$(resv_ctrl "$HOSTNQN" "$ip") && nvme resv-release "/dev/$a" -n 1 --crkey=$RESV_KA --rrela=1 > /dev/null 2>&1
  nvme disconnect -n "$RESV_NQN" 2>&1 | sed 's/^/  | /'
  dmesg -c >> /tmp/dmesg.all
  wait_host "check:$tag" 120 "ok=$RESV_OK why=${RESV_WHY:-none} seen=$RESV_SEEN${RESV_RETRIED:+;$RESV_RETRIED} hosts=$HOSTID,$RESV_BID"
}
