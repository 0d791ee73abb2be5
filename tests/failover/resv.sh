# shellcheck shell=bash disable=SC2034,SC2015   # sourced by run.sh
# tests/failover/resv.sh -- the host side of the resv-follow case (sourced by run.sh; the
# guest side is tests/failover/resv-guest.sh). Host reservations follow a cluster volume:
# the guest acts as two hosts (its own Host NQN/ID, and a second pair it connects with
# --hostnqn/--hostid), both connected to every node. Both register and host A reserves
# (Write Exclusive) through the owner; the host here moves the volume (planned), then
# kills the new owner (kill -9); after each change the guest's `nvme resv-report` through
# the new owner shows both registrations and A's reservation, and B's write still gets
# Reservation Conflict. The volume is rvol (raid1 on e1:d2, e2:d2), exported alone in its
# own subsystem $RESV_NQN: with one namespace per controller, the guest can send each
# host's commands through that host's own controller (/dev/nvmeX), and its fio and ext4
# (on the suite's subsystem) never see B's paths.

#
# resv-follow-thin is the same case on a thin volume of a cluster pool: rpool (raid1
# --thin-pool on e1:d3, e2:d3, its subsystem $RESV_NQN-thin) holds rthin (16 MiB, nsid 1);
# the pool is what moves and is taken over, and the thin volume's reservations are kept
# in etcd under the pool owner's epoch (docs/cluster.md, cluster pools).

RESV_VOL=rvol
RESV_NQN=nqn.2026-01.io.flashpool:failover-resv
RESV_TRAIL=""; RESV_ERR=""

# resv_wanted [CASE]: CASE (default resv-follow) is among the cases
resv_wanted() { case " $CASES " in *" ${1:-resv-follow} "*) return 0;; esac; return 1; }
# resv_drives: the extra enclosure drives rvol and rpool live on (only when their case runs)
resv_drives() {
  if resv_wanted; then printf ' d2:file:32MiB'; fi
  if resv_wanted resv-follow-thin; then printf ' d3:file:32MiB'; fi
}

# resv_for TAG: the case's unit of ownership (RESV_VOL), its subsystem (RESV_SUB) and what
# it serves as nsid 1 (RESV_WHAT, for the log)
resv_for() {
  case $1 in
    resv-follow-thin*) RESV_VOL=rpool; RESV_SUB=$RESV_NQN-thin; RESV_WHAT="rthin of pool rpool";;
    *) RESV_VOL=rvol; RESV_SUB=$RESV_NQN; RESV_WHAT=rvol;;
  esac
}

# resv_create: makes the case's volume (rvol; or rpool and its thin volume rthin)
resv_create() {
  local out
  if [ "$RESV_VOL" = rvol ]; then
    hev "resv-follow: flashpool volume create rvol (raid1 on e1:d2,e2:d2) as $RESV_SUB nsid 1"
    out=$(fpc_ccli 1 volume create rvol --layout raid1 --drives e1:d2,e2:d2 --export "$RESV_SUB" --nsid 1 2>&1) \
      || { RESV_ERR="volume create rvol: $(echo "$out" | tail -n 1)"; return 1; }
    return 0
  fi
  hev "resv-follow-thin: flashpool volume create rpool (raid1 --thin-pool on e1:d3,e2:d3) in $RESV_SUB, then rthin (16MiB) as nsid 1"
  out=$(fpc_ccli 1 volume create rpool --layout raid1 --thin-pool --drives e1:d3,e2:d3 --export "$RESV_SUB" 2>&1) \
    || { RESV_ERR="volume create rpool: $(echo "$out" | tail -n 1)"; return 1; }
  out=$(fpc_ccli 1 volume create rthin --pool rpool --size 16MiB --export "$RESV_SUB" --nsid 1 2>&1) \
    || { RESV_ERR="volume create rthin: $(echo "$out" | tail -n 1)"; return 1; }
}

# resv_owner_pay: "owner=cN ip=ADDR epoch=E" of rvol (after fpc_wait_owner)
resv_owner_pay() { echo "owner=$FPC_OWNER ip=$(cip "$FPC_OWNER") epoch=$FPC_EPOCH"; }

# resv_handle ACTION ARGS: one of the case's steps; sets RESV_PAY (the answer's payload)
resv_handle() {
  local action=$1 args=$2 o t out rc i t0
  RESV_PAY=""
  case $action in
    resv:*:*) resv_for "${action#resv:*:}";;
    check:resv-follow*) resv_for "${action#check:}";;
  esac
  case $action in
    resv:setup:*)
      RESV_ERR=""; t0=$(ts)
      # every node up (an earlier case may have killed one)
      fo_prep "${action#resv:setup:}" || { RESV_ERR="prepare: not every node is back"; return 1; }
      read -r o _ _ <<< "$(fpc_owner "$RESV_VOL")"
      if [ "$o" = - ]; then resv_create || return 1; fi
      fpc_wait_owner "$RESV_VOL" 30 || { RESV_ERR="no owner of $RESV_VOL"; return 1; }
      for i in 1 2 3; do
        wait_log "c$i" "$t0" "(cluster volume rvol: (served as nsid 1|created)|thin volume rthin of cluster pool rpool: served as nsid 1)" 20 \
          || [ "$o" != - ] || { RESV_ERR="c$i does not serve $RESV_WHAT"; return 1; }
      done
      RESV_TRAIL="$FPC_OWNER/$FPC_EPOCH"
      RESV_PAY="$(resv_owner_pay) nqn=$RESV_SUB";;
    resv:move:*)
      fpc_wait_owner "$RESV_VOL" 30 || { RESV_ERR="no owner before the move"; return 1; }
      o=$FPC_OWNER; t=$(next_node "$o")
      T_FAULT=$EPOCHREALTIME; hev "resv-follow: flashpool volume move $RESV_VOL --to $t (owner $o)"
      out=$(fpc_ccli "${o#c}" volume move "$RESV_VOL" --to "$t" --json 2>&1); rc=$?
      hev "resv-follow: volume move returned, exit $rc"
      [ $rc = 0 ] || { RESV_ERR="volume move: $(echo "$out" | tail -n 1)"; return 1; }
      fpc_wait_owner "$RESV_VOL" 30 "$o" && [ "$FPC_OWNER" = "$t" ] || { RESV_ERR="owner $FPC_OWNER after the move to $t"; return 1; }
      RESV_TRAIL="$RESV_TRAIL -> move -> $FPC_OWNER/$FPC_EPOCH"
      RESV_PAY=$(resv_owner_pay);;
    resv:kill:*)
      fpc_wait_owner "$RESV_VOL" 30 || { RESV_ERR="no owner before the kill"; return 1; }
      o=$FPC_OWNER
      T_FAULT=$EPOCHREALTIME; fpc_kill "$o"; hev "resv-follow: kill -9 $o (the owner of $RESV_VOL)"
      fpc_wait_owner "$RESV_VOL" 30 "$o" || { RESV_ERR="no takeover of $RESV_VOL after kill -9 $o"; return 1; }
      hev "resv-follow: $FPC_OWNER owns $RESV_VOL (epoch $FPC_EPOCH)"
      RESV_TRAIL="$RESV_TRAIL -> kill -9 $o -> $FPC_OWNER/$FPC_EPOCH"
      RESV_PAY=$(resv_owner_pay);;
    check:resv-follow*)
      local ok=PASS why=""
      [ "$(kv ok "$args")" = 1 ] || why="$why guest: $(kv why "$args" | tr _ ' ');"
      [ -z "$RESV_ERR" ] || why="$why host: $RESV_ERR;"
      fpc_audit_stale "$NENC"; [ "$FPC_STALE" = 0 ] || why="$why stale writes: $FPC_AUDIT;"
      [ -n "$why" ] && ok=FAIL
      hres "${action#check:}" $ok "${why:+$why }$RESV_WHAT: owner $RESV_TRAIL; two hosts (guest, Host IDs $(kv hosts "$args")) on every node of $RESV_SUB; after each change, through the new owner: $(kv seen "$args" | tr _ ' '); stale writes $FPC_STALE"
      [ $ok = PASS ];;
    *) return 0;;
  esac
}
