# shellcheck shell=bash disable=SC2034   # sourced by run.sh, which reads what is set here
# tests/failover/cases.sh -- the host side of tests/failover/run.sh (sourced): bringing the
# cluster up, each fault, each case's checks and timeline, the final checks, the teardown.
# Every function is bounded in time; none exits the script.

# kv KEY ARGS: the value of KEY=value in a marker's arguments
kv() { echo " $2 " | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n1; }
# jv KEY JSON: a top-level value of a JSON object
jv() { echo "$2" | python3 -c 'import json, sys; print(json.load(sys.stdin).get(sys.argv[1], ""))' "$1" 2> /dev/null; }
next_node() { case $1 in c1) echo c2;; c2) echo c3;; *) echo c1;; esac; }
others() { local i; for i in 1 2 3; do [ "c$i" = "$1" ] || echo "c$i"; done; }
utc_of() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%S.%6NZ; }
# log_since NODE EPOCH: the node's log lines stamped at or after EPOCH
log_since() { awk -v t="$(utc_of "$2")" '/^[0-9]/ && $1 >= t' "$(fpc_log "$1")" 2> /dev/null; }
# wait_nodes "c1 c2 c3" SECONDS: until cluster status lists exactly those nodes
wait_nodes() {
  local end=$(($(date +%s) + $2))
  until [ "$(fpc_cluster_nodes)" = "$1" ]; do
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.3
  done
}
# wait_log NODE EPOCH REGEX SECONDS: until a line after EPOCH matches
wait_log() {
  local end=$(($(date +%s) + $4))
  until log_since "$1" "$2" | grep -E "$3" > /dev/null; do
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.2
  done
}
# takeover NODE EPOCH VOL: "epoch N (takeover M ms)" of VOL from NODE's log since EPOCH, if any
takeover() { log_since "$1" "$2" | sed -n "s/.*volume $3: owned here at epoch \([0-9]*\).*(takeover \([0-9]*\) ms).*/epoch \1, takeover \2 ms/p" | tail -n1; }
# the volumes of a run: vol, and fsvol unless FS=0
vols() { echo "$VOL"; [ "$FS" = 0 ] || echo "$FSVOL"; }
cip() { case $1 in c[1-3]) fpc_cip "${1#c}";; *) echo none;; esac; }
# one_owner VOL OWNER OPT NOPT: why VOL has not exactly one owner OWNER (nothing if it has):
# every live node names the same owner and epoch, only OWNER runs it, the guest's only
# optimized path to it (OPT, NOPT: the guest's optimized addresses, how many) is OWNER's
one_owner() {
  local v=$1 now=$2 views run w=""
  views=$(fpc_owner_views "$v")
  [ "$(echo "$views" | tr ' ' '\n' | cut -d= -f2 | sort -u | wc -l)" = 1 ] || w="$w $v: nodes disagree: $views;"
  run=$(fpc_running "$v")
  [ "$run" = "$now" ] || w="$w $v runs on '$run', owner $now;"
  [ "$4" = 1 ] && [ "$3" = "$(cip "$now")" ] || w="$w $v: the guest's optimized path(s) $3 (owner $now is $(cip "$now"));"
  echo "$w"
}

# ---------------------------------------------------------------- fo-up
fo_up() {
  local t0 i d="" drives size leader
  t0=$(ts)
  if ! fpc_net_up 9; then d="network set-up failed"
  elif ! fpc_etcd_up 3; then d="etcd did not come up (see $FPC_DIR/etcd-*.log)"
  else
    leader=$(fpc_etcd_leader)
    rm -f "$FPC_DIR"/e*-d*.img; rm -rf "$FPC_DIR"/state-*
    for i in $(seq 1 "$NENC"); do fpc_enclosure_toml "$i" "d0:file:$DRIVE_SIZE d1:file:$DRIVE_SIZE$(resv_drives)" > "$FPC_DIR/e$i.toml"; done
    for i in $(seq 1 "$NENC"); do fpc_start_enclosure "$i" || { d="enclosure e$i did not start (see $(fpc_log "e$i"))"; break; }; done
  fi
  if [ -z "$d" ]; then
    for i in 1 2 3; do fpc_ctl_toml "$i" "$NENC" > "$FPC_DIR/c$i.toml"; done
    for i in 1 2 3; do fpc_start_ctl "$i" || { d="controller c$i did not start (see $(fpc_log "c$i"))"; break; }; done
  fi
  [ -z "$d" ] && ! wait_nodes "c1 c2 c3" 30 && d="cluster status lists '$(fpc_cluster_nodes)', not c1 c2 c3"
  if [ -z "$d" ]; then
    drives=$(seq 1 "$NENC" | sed 's/.*/e&:d0/' | paste -sd,)
    fpc_ccli 1 volume create "$VOL" --layout raid6 --drives "$drives" --export "$NQN" --nsid 1 > "$RUN/create.txt" 2>&1 \
      || d="flashpool volume create: $(tail -n 2 "$RUN/create.txt" | tr '\n' ' ')"
  fi
  # fsvol: the guest's ext4, nsid 2 of the same subsystem (its own ANA group), on the d1
  # drives (an ecK+M takes the first K+M enclosures)
  local fsn=$NENC fsd=""
  case $FS_LAYOUT in ec*+*) fsn=${FS_LAYOUT#ec}; fsn=$(( ${fsn%+*} + ${fsn#*+} ));; esac
  if [ -z "$d" ] && [ "$FS" != 0 ]; then
    fsd=$(seq 1 "$fsn" | sed 's/.*/e&:d1/' | paste -sd,)
    fpc_ccli 1 volume create "$FSVOL" --layout "$FS_LAYOUT" --drives "$fsd" --export "$NQN" --nsid "$FS_NSID" > "$RUN/create-fs.txt" 2>&1 \
      || d="flashpool volume create $FSVOL: $(tail -n 2 "$RUN/create-fs.txt" | tr '\n' ' ')"
  fi
  if [ -z "$d" ] && [ "$FS" != 0 ]; then
    fpc_wait_owner "$FSVOL" 30 || d="no owner of $FSVOL 30 s after the create ($(fpc_owner "$FSVOL"))"
    FS_OWNER0=${FPC_OWNER:-}; FS_EPOCH0=${FPC_EPOCH:-}
  fi
  [ -z "$d" ] && ! fpc_wait_owner "$VOL" 30 && d="no owner 30 s after the create ($(fpc_owner "$VOL"))"
  OWNER0=${FPC_OWNER:-}; EPOCH0=${FPC_EPOCH:-}
  if [ -z "$d" ]; then
    for i in 1 2 3; do
      wait_log "c$i" "$t0" "cluster volume $VOL: (served as nsid 1|created)" 20 || d="$d c$i does not serve $VOL;"
      [ "$FS" = 0 ] || wait_log "c$i" "$t0" "cluster volume $FSVOL: (served as nsid $FS_NSID|created)" 20 || d="$d c$i does not serve $FSVOL;"
    done
  fi
  if [ -n "$d" ]; then hres fo-up FAIL "$d"; return 1; fi
  size=$(grep -o 'raid6 [0-9.]* [KMG]iB' "$RUN/create.txt" | head -n1)
  [ "$FS" = 0 ] || fsd="; volume $FSVOL ($(grep -oE '(raid[0-9]|ec[0-9]+\+[0-9]+) [0-9.]* [KMG]iB' "$RUN/create-fs.txt" | head -n1), e1..e$fsn:d1) on c1 as nsid $FS_NSID, owner $FS_OWNER0 epoch $FS_EPOCH0"
  hres fo-up PASS "etcd 3 members on $FPC_BR_IP (leader m$leader, heartbeat 50 ms, election 300 ms), $NENC enclosures with two $DRIVE_SIZE file drives each (d0, d1), controllers c1..c3 on $(fpc_cip 1)..$(fpc_cip 3) (lease $LEASE_MS ms); volume $VOL ($size, e1..e$NENC:d0) created on c1 as $NQN nsid 1, owner $OWNER0 epoch $EPOCH0$fsd; served by c1 c2 c3; $(el "$t0") s"
}

# ---------------------------------------------------------------- fo-connect
fo_connected() {
  local a=$1 ok=PASS ip fsip what="one namespace"; ip=$(cip "$OWNER0"); fsip=$(cip "$FS_OWNER0")
  [ "$(kv nctrl "$a")" = 3 ] && [ "$(kv live "$a")" = 3 ] && [ "$(kv nopt "$a")" = 1 ] \
    && [ "$(kv opt "$a")" = "$ip" ] && [ "$(kv inaccessible "$a")" = 2 ] && [ "$(kv dev "$a")" != none ] || ok=FAIL
  if [ "$FS" != 0 ]; then   # nsid 2 on all three paths too, its own owner's optimized
    what="two namespaces (nsid 1 $VOL, nsid $FS_NSID $FSVOL), three paths each"
    [ "$(kv npaths2 "$a")" = 3 ] && [ "$(kv nopt2 "$a")" = 1 ] && [ "$(kv opt2 "$a")" = "$fsip" ] \
      && [ "$(kv inaccessible2 "$a")" = 2 ] && [ "$(kv dev2 "$a")" != none ] || ok=FAIL
  fi
  hres fo-connect $ok "3 controllers in one subsystem, $what: each owner's path ($OWNER0, $ip${FS_OWNER0:+; $FS_OWNER0, $fsip}) optimized, two inaccessible; guest: $a"
  [ $ok = PASS ]
}

# ---------------------------------------------------------------- before each case
# every etcd member and node running (a case may leave one dead or frozen), no loss left,
# every node in cluster status, an owner
fo_prep() {
  local i p d=""
  for i in $(seq 1 "$FPC_ETCD_N"); do
    fpc_pid_alive "$(fpc_pid_of "etcd-$i")" && continue
    hev "prep $1: etcd m$i restarted"; fpc_etcd_start "$i" || d="$d etcd m$i did not restart;"
  done
  for i in $(seq 1 "$NENC"); do
    fpc_loss_off "$i" 2> /dev/null && hev "prep $1: the loss on e$i removed"
  done
  for i in 1 2 3; do
    fpc_loss_off "$(fpc_cslot "$i")" 2> /dev/null && hev "prep $1: the loss (or partial cut) on c$i removed"
    p=$(fpc_pid_of "c$i")
    if fpc_pid_alive "$p"; then kill -CONT "$p" 2> /dev/null
    else hev "prep $1: c$i restarted"; fpc_start_ctl "$i" || d="$d c$i did not restart;"; fi
  done
  wait_nodes "c1 c2 c3" 40 || d="$d cluster status lists '$(fpc_cluster_nodes)';"
  if [ "$FS" != 0 ]; then
    fpc_wait_owner "$FSVOL" 30 || d="$d no owner of $FSVOL;"
    FS_OWNER0=$FPC_OWNER; FS_EPOCH0=$FPC_EPOCH
  fi
  fpc_wait_owner "$VOL" 30 || d="$d no owner;"
  OWNER0=$FPC_OWNER; EPOCH0=$FPC_EPOCH
  [ -n "$d" ] && say "prepare $1:$d"
  [ -z "$d" ]
}

# ---------------------------------------------------------------- the faults
# fo_fault TAG: does the fault while the guest's fio runs; sets T_FAULT (epoch), F_DETAIL,
# F_VICTIM (the node hit), F_WANT (the owner the case expects, if one)
fo_fault() {
  local tag=$1 name=${1%%#*} o=$OWNER0 oi=${OWNER0#c} t out rc p a b pa pb l nl w i k deg
  # shellcheck disable=SC2034   # F_VICTIM: for a reader of the state (the last fault's target)
  F_DETAIL=""; F_WHY=""; F_VICTIM=$o; F_WANT=""; T_FAULT=$EPOCHREALTIME
  case $name in
    planned-move)
      t=$(next_node "$o"); F_WANT=$t
      T_FAULT=$EPOCHREALTIME; hev "$tag: flashpool volume move $VOL --to $t (owner $o)"
      out=$(fpc_ccli "$oi" volume move "$VOL" --to "$t" --json 2>&1); rc=$?
      hev "$tag: volume move returned, exit $rc"
      if [ $rc = 0 ]; then F_DETAIL="volume move --to $t: took_ms $(jv took_ms "$out") (API)"
      else F_DETAIL="volume move --to $t: exit $rc: $(echo "$out" | tail -n 1)"; return 1; fi;;
    kill9-owner)
      T_FAULT=$EPOCHREALTIME; fpc_kill "$o"; hev "$tag: kill -9 $o (the owner)"
      fpc_wait_owner "$VOL" 30 "$o"; rc=$?
      hev "$tag: cluster status: owner $FPC_OWNER epoch $FPC_EPOCH"
      F_DETAIL="kill -9 $o; $FPC_OWNER owns it ${FPC_WAITED} s later (status poll)"; return $rc;;
    sigstop-owner)
      p=$(fpc_pid_of "$o")
      T_FAULT=$EPOCHREALTIME; kill -STOP "$p"; hev "$tag: SIGSTOP $o (pid $p, the owner)"
      fpc_wait_owner "$VOL" 30 "$o"; rc=$?; w=$FPC_WAITED
      hev "$tag: cluster status: owner $FPC_OWNER epoch $FPC_EPOCH"
      sleep "$STOP_S"; kill -CONT "$p"; hev "$tag: SIGCONT $o"
      F_DETAIL="SIGSTOP $o; $FPC_OWNER owned it after $w s; SIGCONT $STOP_S s later"; return $rc;;
    cut-owner)
      T_FAULT=$EPOCHREALTIME
      if ! fpc_loss_on "$(fpc_cslot "$oi")"; then F_DETAIL="tc on $(fpc_veth "$(fpc_cslot "$oi")") failed"; return 1; fi
      hev "$tag: $o cut: $FPC_LOSS_HOW"
      fpc_wait_owner "$VOL" 30 "$o"; rc=$?; w=$FPC_WAITED
      hev "$tag: cluster status: owner $FPC_OWNER epoch $FPC_EPOCH"
      sleep "$CUT_S"; fpc_loss_off "$(fpc_cslot "$oi")"; hev "$tag: $o's link restored"
      F_DETAIL="$FPC_LOSS_HOW; $FPC_OWNER owned it after $w s; restored $CUT_S s later"; return $rc;;
    enclosure-and-owner)
      # an enclosure cut off silently and the owner killed in the same instant: a survivor
      # takes both volumes over degraded, without the cut enclosure's members (it waits
      # [remote] takeover_wait_ms for them); once the link is back they are re-added
      k=$CUT_ENC; F_VICTIM="$o+e$k"
      T_FAULT=$EPOCHREALTIME
      if ! fpc_loss_on "$k"; then F_DETAIL="tc on $(fpc_veth "$k") failed"; return 1; fi
      fpc_kill "$o"; hev "$tag: e$k cut ($FPC_LOSS_HOW) and kill -9 $o (the owner)"
      fpc_wait_owner "$VOL" 30 "$o"; rc=$?; w=$FPC_WAITED; t=$FPC_OWNER
      hev "$tag: cluster status: owner $FPC_OWNER epoch $FPC_EPOCH"
      degraded_views "$k"; deg=$DEG
      hev "$tag: while e$k is cut: $deg"
      sleep "$CUT_S"; fpc_loss_off "$k"; hev "$tag: e$k's link restored"
      back_views "$tag"
      F_DETAIL="e$k cut ($FPC_LOSS_HOW) + kill -9 $o; $t owned $VOL after $w s; while cut: $deg; e$k restored $CUT_S s later: $F_BACK"
      return $rc;;
    owner-cut-from-enclosure-and-etcd)
      # the owner loses one enclosure and etcd together, not the hosts nor the other
      # nodes: its lease runs out, it fences and refuses I/O; a survivor (which reaches
      # every member) takes over; restored CUT_S s after the takeover, it rejoins
      k=$CUT_ENC; F_VICTIM=$o; a="$(fpc_ip "$k")"
      for i in $(seq 1 "$FPC_ETCD_N"); do a="$a $FPC_BR_IP:$((FPC_ETCD_BASE + 10 * i))"; done
      T_FAULT=$EPOCHREALTIME
      # shellcheck disable=SC2086   # $a: the peers, one word each
      if ! fpc_cut_from "$(fpc_cslot "$oi")" $a; then F_DETAIL="tc on $(fpc_veth "$(fpc_cslot "$oi")") failed"; fpc_loss_off "$(fpc_cslot "$oi")"; return 1; fi
      hev "$tag: $o cut from e$k and etcd: $FPC_LOSS_HOW"
      fpc_wait_owner "$VOL" 30 "$o"; rc=$?; w=$FPC_WAITED; t=$FPC_OWNER
      hev "$tag: cluster status: owner $FPC_OWNER epoch $FPC_EPOCH"
      degraded_views "$k"; deg=$DEG
      hev "$tag: after the takeover: $deg"
      sleep "$CUT_S"; fpc_loss_off "$(fpc_cslot "$oi")"; hev "$tag: $o's links to e$k and etcd restored"
      back_views "$tag"
      F_DETAIL="$o cut from e$k and etcd; $t owned $VOL after $w s ($(fence_order "$o" "$t")); after the takeover: $deg; restored $CUT_S s later: $F_BACK"
      return $rc;;
    claim-race)
      # the owner dies while both other nodes are frozen past the lease TTL; they wake in
      # the same instant, both with their leases gone and the volume unowned: they rejoin
      # and race for it
      read -r a b <<< "$(others "$o" | tr '\n' ' ')"; pa=$(fpc_pid_of "$a"); pb=$(fpc_pid_of "$b")
      kill -STOP "$pa" "$pb"; T_FAULT=$EPOCHREALTIME; fpc_kill "$o"
      hev "$tag: SIGSTOP $a and $b, kill -9 $o (the owner)"
      sleep "$RACE_FREEZE_S"; kill -CONT "$pa" "$pb"; hev "$tag: SIGCONT $a and $b together ($RACE_FREEZE_S s frozen)"
      fpc_wait_owner "$VOL" 30 "$o"; rc=$?
      hev "$tag: cluster status: owner $FPC_OWNER epoch $FPC_EPOCH"
      F_DETAIL="$a, $b frozen ${RACE_FREEZE_S} s while $o was killed, then woken together; $FPC_OWNER owns it ${FPC_WAITED} s after the wake"
      return $rc;;
    etcd-leader-loss)
      l=$(fpc_etcd_leader); F_VICTIM="m$l"
      [ -n "$l" ] || { F_DETAIL="no etcd leader found"; return 1; }
      T_FAULT=$EPOCHREALTIME; fpc_etcd_kill "$l"; hev "$tag: kill -9 etcd m$l (the leader)"
      i=0; nl=""
      while [ $i -lt 100 ]; do nl=$(fpc_etcd_leader) && break; sleep 0.1; i=$((i + 1)); done
      hev "$tag: etcd leader now m${nl:-none}"
      w=$(awk -v a="$T_FAULT" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}')
      sleep "$ETCD_DOWN_S"; fpc_etcd_start "$l"; rc=$?; hev "$tag: etcd m$l restarted (exit $rc)"
      F_DETAIL="kill -9 etcd leader m$l; m${nl:-none} leader ${w} s later; m$l back after ${ETCD_DOWN_S} s"
      [ -n "$nl" ] && [ $rc = 0 ];;
    rejoin-rebuild)
      T_FAULT=$EPOCHREALTIME; fpc_kill "$o"; hev "$tag: kill -9 $o (the owner)"
      fpc_wait_owner "$VOL" 30 "$o" || { F_DETAIL="no takeover after kill -9 $o"; return 1; }
      a=$FPC_OWNER; hev "$tag: $a owns it (epoch $FPC_EPOCH); restarting $o"
      t=$EPOCHREALTIME
      fpc_start_ctl "$oi" || { F_DETAIL="$o did not restart"; return 1; }
      wait_nodes "c1 c2 c3" 30 || { F_DETAIL="$o not in cluster status 30 s after its restart"; return 1; }
      hev "$tag: $o rejoined (cluster status)"
      # the move back once the guest's path to it is up again (its admin queue reconnected)
      wait_log "$o" "$t" "controller [0-9]+ created: subsystem $NQN, host $HOSTNQN" 30 \
        || { F_DETAIL="the guest did not reconnect to $o within 30 s"; return 1; }
      sleep 0.5; hev "$tag: the guest reconnected to $o; flashpool volume move $VOL --to $o"
      out=$(fpc_ccli "${a#c}" volume move "$VOL" --to "$o" --json 2>&1); rc=$?
      hev "$tag: volume move returned, exit $rc"
      F_WANT=$o
      F_DETAIL="kill -9 $o, $a took over, $o restarted and rejoined, moved back: $([ $rc = 0 ] && echo "took_ms $(jv took_ms "$out")" || echo "exit $rc: $(echo "$out" | tail -n 1)")"
      return $rc;;
  esac
}

# ---------------------------------------------------------------- after each case
# fo_check TAG GUEST_FACTS: the case's RESULT
fo_check() {
  local tag=$1 g=$2 name=${1%%#*} ok=PASS why="" o=$OWNER0 now stale tk gap e n ran failed crashed crash_note
  FS_DETAIL=""
  fpc_wait_owner "$VOL" 30 || why="$why no owner;"
  now=$FPC_OWNER; e=$FPC_EPOCH
  case $name in
    planned-move|rejoin-rebuild)
      [ "$now" = "$F_WANT" ] || why="$why owner $now, not $F_WANT;"
      [ "$e" != - ] && [ "$e" -gt "$EPOCH0" ] 2> /dev/null || why="$why epoch $EPOCH0 -> $e did not grow;";;
    kill9-owner|claim-race|enclosure-and-owner)
      [ "$now" != "$o" ] || why="$why $o still owns it;"
      [ "$e" != - ] && [ "$e" -gt "$EPOCH0" ] 2> /dev/null || why="$why epoch $EPOCH0 -> $e did not grow;"
      if [ "$name" = claim-race ]; then   # one claim won, and only one node took it over
        local cl="" tk=""
        for n in $(others "$o"); do
          cl="$cl$(log_since "$n" "$T_FAULT" | grep -c 'claimed volume volume="'"$VOL"'"' | sed "s/^/ $n:/")"
          tk="$tk$(log_since "$n" "$T_FAULT" | grep -c "volume $VOL: owned here at epoch" | sed "s/^/ $n:/")"
        done
        F_DETAIL="$F_DETAIL; claims won:$cl, takeovers:$tk"
        [ "$(sum_counts "$tk")" = 1 ] || why="$why takeovers:$tk (one expected);"
      fi;;
    sigstop-owner|cut-owner|owner-cut-from-enclosure-and-etcd)
      [ "$now" != "$o" ] || why="$why $o still owns it;"
      [ "$e" != - ] && [ "$e" -gt "$EPOCH0" ] 2> /dev/null || why="$why epoch $EPOCH0 -> $e did not grow;"
      fpc_pid_alive "$(fpc_pid_of "$o")" || why="$why $o died;"
      log_since "$o" "$T_FAULT" | grep -E 'stepped down|fenced' > /dev/null || why="$why no step-down/fence line in $o's log;"
      wait_nodes "c1 c2 c3" 30 || why="$why $o did not rejoin (cluster status: $(fpc_cluster_nodes));";;
    etcd-leader-loss)
      [ "$now" = "$o" ] && [ "$e" = "$EPOCH0" ] || why="$why ownership changed: $o/$EPOCH0 -> $now/$e;"
      for n in $(printf '%s\n' "$o" "$FS_OWNER0" | grep . | sort -u); do   # the owners of both volumes
        log_since "$n" "$T_FAULT" | grep -E 'fenced|stepped down|lease was lost' > /dev/null \
          && why="$why $n fenced itself: $(log_since "$n" "$T_FAULT" | grep -E 'fenced|stepped down|lease was lost' | head -n1 | cut -c1-160);"
      done;;
  esac
  # exactly one owner: every node agrees, one runs it, the guest has one optimized path
  why="$why$(one_owner "$VOL" "$now" "$(kv opt "$g")" "$(kv nopt "$g")")"
  tk=$(takeover "$now" "$T_FAULT" "$VOL")
  [ "$FS" != 0 ] && fs_check "$name" "$g"
  [ "$(kv rounds "$g")" -ge 1 ] 2> /dev/null || why="$why no fio round;"
  # a round fio itself died in (a signal, no error printed: guest-init.sh tool_crash) is not an
  # error the host saw, but a case needs one round that ran through
  crashed=$(kv crashed "$g"); crashed=${crashed:-0}
  # the counts come over the serial line: a garbled one must fail the case, not abort the
  # harness inside $(( ))
  ran=$(kv rounds "$g"); failed=$(kv failed "$g")
  case "$ran$failed$crashed" in
    ''|*[!0-9]*) why="$why garbled round counts (rounds=$ran failed=$failed crashed=$crashed);";;
    *) [ $((ran - failed - crashed)) -ge 1 ] \
         || why="$why no fio round ran through ($crashed crashed: $(kv crash "$g"));";;
  esac
  crash_note=""; [ "$crashed" = 0 ] || crash_note=", $crashed fio crash(es) not counted as failures (first: $(kv crash "$g"))"
  [ "$(kv failed "$g")" = 0 ] || why="$why $(kv failed "$g") fio round(s) failed (first error: $(kv fioerr "$g"); the guest's kernel lines: $RUN/serial.log);"
  [ "$(kv verr "$g")" = 0 ] || why="$why $(kv verr "$g") verify error lines;"
  [ "$(kv ioerr "$g")" = 0 ] || why="$why $(kv ioerr "$g") I/O error lines in the guest kernel log;"
  fpc_audit_stale "$NENC"; stale=$FPC_STALE; [ "$stale" = 0 ] || why="$why stale writes: $FPC_AUDIT;"
  [ -n "$F_FAULT_ERR" ] && why="$why the fault step failed;"
  why="$why$F_WHY"
  [ -n "$why" ] && ok=FAIL
  gap=$(case_gap "$T_FAULT")
  hres "$tag" $ok "${why:+$why }$F_DETAIL; owner $o/$EPOCH0 -> $now/$e${tk:+ ($tk)}${FS_DETAIL:+; $FS_DETAIL}; host-visible stall: clat max $(kv clat_ms "$g") ms, longest I/O gap ${gap:-?} ms; fio $(kv rounds "$g") rounds randwrite $BS qd$QD crc32c, $(kv failed "$g") failed, $(kv verr "$g") verify errors$crash_note; guest I/O errors $(kv ioerr "$g"); stale writes $stale"
  echo "$tag clat_ms=$(kv clat_ms "$g") gap_ms=${gap:-} $ok" >> "$RUN/stalls.txt"
  case_timeline "$tag"
  [ $ok = PASS ]
}
# ---------------------------------------------------------------- the double faults
# vol_members VOL NODE: "e1:d0=active ... volume=STATE" as NODE's API shows VOL (members
# by enclosure drive, also when named by URL after a takeover); nothing if it does not answer
vol_members() {
  # shellcheck disable=SC2046   # fpc_auth: words
  timeout 5 "$FPC_BIN" volume show "$1" --json --api "https://$(fpc_capi "${2#c}")" $(fpc_auth) 2> /dev/null | python3 -c '
import json, re, sys
v = json.load(sys.stdin)
out = []
for m in v.get("members", []):
    d = str(m.get("drive", ""))
    x = re.findall(r"(?:^|[:/])(e[0-9]+:d[0-9]+)", d)
    out.append("%s=%s" % (x[-1] if x else d, m.get("state")))
print(" ".join(out + ["volume=" + str(v.get("state"))]))' 2> /dev/null
}
# degraded_views ENC: DEG = each volume's owner and what it shows, once it shows the volume
# (up to 10 s); in enclosure-and-owner (not in the other case, where the new owner reaches
# ENC) F_WHY gets a volume taken over (its owner was the one killed) whose new owner calls
# ENC's member active, or the volume optimal, while ENC is cut off (the member left out
# shows as drive "-", failed)
degraded_views() {
  local v o m d="" i was
  for v in $(vols); do
    was=$OWNER0; [ "$v" = "$VOL" ] || was=$FS_OWNER0
    fpc_wait_owner "$v" 30; o=$FPC_OWNER; m=""; i=0
    while [ $i -lt 20 ]; do m=$(vol_members "$v" "$o"); [ -n "$m" ] && break; sleep 0.5; i=$((i + 1)); done
    d="$d $v on $o/$FPC_EPOCH: ${m:-no answer};"
    # (a volume whose owner was not killed fails the member only when its I/O there times out)
    if [ "${name:-}" = enclosure-and-owner ] && [ "$was" = "$OWNER0" ]; then
      echo " $m " | grep -qE " e$1:d[0-9]+=active | volume=optimal " \
        && F_WHY="$F_WHY $v: e$1's member active or $v optimal on $o while e$1 is cut ($m);"
      [ -n "$m" ] || F_WHY="$F_WHY $v: its owner $o does not show it;"
    fi
  done
  d=${d# }; DEG=${d%;}
}
# back_views TAG: every volume optimal again on its owner, every member active, within
# BACK_S of the restore; sets F_BACK (what each owner showed and when), F_WHY if not
back_views() {
  local v t0=$EPOCHREALTIME o m w="" ok
  F_BACK=""
  for v in $(vols); do
    ok=0
    while :; do
      read -r o _ <<< "$(fpc_owner "$v")"; m=""
      [ "$o" != - ] && m=$(vol_members "$v" "$o")
      if [ -n "$m" ] && echo " $m " | grep -q ' volume=optimal ' \
        && ! echo "$m" | tr ' ' '\n' | grep -v '^volume=' | grep -qv '=active$'; then ok=1; break; fi
      awk -v a="$t0" -v b="$EPOCHREALTIME" -v l="$BACK_S" 'BEGIN{exit !(b - a >= l)}' && break
      sleep 0.5
    done
    w=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}')
    if [ $ok = 1 ]; then F_BACK="$F_BACK $v optimal on $o ${w} s after the restore;"
    else F_BACK="$F_BACK $v NOT optimal ${w} s after the restore ($o: ${m:-no answer});"; F_WHY="$F_WHY $v not optimal within $BACK_S s of the restore ($o: ${m:-no answer});"; fi
  done
  hev "$1: after the restore:$F_BACK"
  F_BACK="${F_BACK# }"; F_BACK=${F_BACK%;}
}
# fence_order OLD NEW: when OLD fenced (its first fence/step-down line) and when NEW
# took vol over, both relative to the fault (s)
fence_order() {
  local f t
  f=$(log_since "$1" "$T_FAULT" | grep -E 'stepped down|fenced|lease deadline' | head -n1 | cut -d' ' -f1)
  t=$(log_since "$2" "$T_FAULT" | grep "volume $VOL: owned here at epoch" | head -n1 | cut -d' ' -f1)
  rel() { [ -n "$1" ] && python3 -c 'import sys, datetime as d; print("%.2f s" % (d.datetime.strptime(sys.argv[1][:26], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=d.timezone.utc).timestamp() - float(sys.argv[2])))' "$1" "$T_FAULT" 2> /dev/null || echo "?"; }
  echo "$1 fenced at $(rel "$f"), $2 took over at $(rel "$t")"
}
sum_counts() { awk '{ for (i = 1; i <= NF; i++) { split($i, a, ":"); s += a[2] } } END { print s + 0 }' <<< "$1"; }
# fs_check NAME GUEST_FACTS (fo_check's locals why, o): fsvol after the case. It moves only
# if the fault hit its owner (kill, freeze, cut: it was the owner of vol too) or every
# node (claim-race: all leases lapse); then a node other than the one hit owns it at a
# higher epoch (once, in claim-race), else the same owner at the same epoch. Then exactly
# one owner, as for vol, and every file the guest wrote during the case synced. Sets FS_DETAIL.
fs_check() {
  local name=$1 g=$2 moved=0 fnow fe ftk="" fc="" n
  case $name in
    claim-race) moved=1;;
    kill9-owner|sigstop-owner|cut-owner|rejoin-rebuild|enclosure-and-owner|owner-cut-from-enclosure-and-etcd)
      [ "$FS_OWNER0" = "$o" ] && moved=1;;
  esac
  if [ $moved = 1 ]; then
    fpc_wait_owner "$FSVOL" 30 "$o" || why="$why $FSVOL: no owner other than $o;"
    fnow=$FPC_OWNER; fe=$FPC_EPOCH
    [ "$fe" != - ] && [ "$fe" -gt "$FS_EPOCH0" ] 2> /dev/null || why="$why $FSVOL: epoch $FS_EPOCH0 -> $fe did not grow;"
    ftk=$(takeover "$fnow" "$T_FAULT" "$FSVOL")
    if [ "$name" = claim-race ]; then
      for n in $(others "$o"); do
        fc="$fc$(log_since "$n" "$T_FAULT" | grep -c "volume $FSVOL: owned here at epoch" | sed "s/^/ $n:/")"
      done
      ftk="${ftk:+$ftk; }takeovers:$fc"
      [ "$(sum_counts "$fc")" = 1 ] || why="$why $FSVOL takeovers:$fc (one expected);"
    fi
  else
    fpc_wait_owner "$FSVOL" 30 || why="$why $FSVOL: no owner;"
    fnow=$FPC_OWNER; fe=$FPC_EPOCH
    [ "$fnow" = "$FS_OWNER0" ] && [ "$fe" = "$FS_EPOCH0" ] || why="$why $FSVOL moved: $FS_OWNER0/$FS_EPOCH0 -> $fnow/$fe (the fault did not hit its owner);"
  fi
  why="$why$(one_owner "$FSVOL" "$fnow" "$(kv opt2 "$g")" "$(kv nopt2 "$g")")"
  [ "$(kv fsfail "$g")" = 0 ] || why="$why $(kv fsfail "$g") file write/sync(s) on $FSVOL failed;"
  FS_DETAIL="$FSVOL $FS_OWNER0/$FS_EPOCH0 -> $fnow/$fe${ftk:+ ($ftk)}, ext4 $(kv fsfiles "$g") files written and synced"
}
# case_gap EPOCH: the longest "no completion" gap the guest reported since EPOCH (ms)
case_gap() {
  awk -v t="$1" '$1 >= t && $2 == "@@IO" && $3 == "resume" { for (i = 1; i <= NF; i++) if ($i == "after") { v = $(i + 1); if (v + 0 > m) m = v + 0 } } END { print m + 0 }' "$RUN/serial.log"
}
# case_timeline TAG: every side's lines from PRE_S+1 s before the fault to now
case_timeline() {
  local targs=() i
  for i in 1 2 3; do targs+=(--node "c$i=$(fpc_log "c$i")"); done
  for i in $(seq 1 "$FPC_ETCD_N"); do targs+=(--etcd "m$i=$(fpc_log "etcd-$i")"); done
  python3 "$HERE/timeline.py" --t0 "$T_FAULT" --from "$(awk -v t="$T_FAULT" -v p="$PRE_S" 'BEGIN{printf "%.6f", t - p - 1}')" \
    --to "$EPOCHREALTIME" --events "$RUN/events.log" --serial "$RUN/serial.log" "${targs[@]}" \
    --title "$1: $F_DETAIL" >> "$RUN/timeline.txt" 2>&1
  echo >> "$RUN/timeline.txt"
}

# ---------------------------------------------------------------- final
fo_final() {
  local g=$1 why="" w v now d="" stale opt nopt
  for v in $(vols); do
    w=""
    fpc_wait_owner "$v" 30 || w=" $v: no owner;"
    now=$FPC_OWNER
    if [ "$v" = "$VOL" ]; then opt=$(kv opt "$g"); nopt=$(kv nopt "$g"); else opt=$(kv opt2 "$g"); nopt=$(kv nopt2 "$g"); fi
    w="$w$(one_owner "$v" "$now" "$opt" "$nopt")"
    why="$why$w"
    d="$d; $v: owner $now epoch $FPC_EPOCH, views $(fpc_owner_views "$v"), runs on $(fpc_running "$v"), guest optimized $opt"
  done
  hres final-one-owner "$([ -z "$why" ] && echo PASS || echo FAIL)" "${why:+$why; }${d#; }; guest paths: $(kv paths "$g")${FS_OWNER0:+ / $(kv paths2 "$g")}"
  fpc_audit_stale "$NENC"; local arc=$?; stale=$FPC_STALE
  hres final-stale-writes "$([ "$stale" = 0 ] && [ $arc = 0 ] && echo PASS || echo FAIL)" "GET /v1/audit stale_writes, every node: $FPC_AUDIT"
  [ -z "$why" ] && [ "$stale" = 0 ]
}

# fo_teardown: every node still running (none crashed: one a case killed on purpose has
# no pid file any more), no panic in any log, SIGTERM stops each one (controllers first)
fo_teardown() {
  local n d="" ok=PASS p
  [ -d "$FPC_DIR/pids" ] || return 0
  [ -f "$(fpc_pidf c1)" ] || [ -f "$(fpc_log c1)" ] || return 0   # fo-up never ran
  for n in c1 c2 c3 $(seq 1 "$NENC" | sed 's/^/e/'); do
    [ -f "$(fpc_pidf "$n")" ] || { d="$d $n killed by the last case;"; continue; }
    p=$(fpc_pid_of "$n")
    if ! fpc_pid_alive "$p"; then ok=FAIL; d="$d $n died (crash?): $(tail -n 2 "$(fpc_log "$n")" | tr '\n' ' ' | cut -c1-200);"; continue; fi
    kill -CONT "$p" 2> /dev/null
    fpc_stop "$n" || { ok=FAIL; d="$d $n did not stop on SIGTERM within 15 s;"; }
  done
  p=$(grep -l 'panicked' "$FPC_DIR"/[ce][0-9].log 2> /dev/null | tr '\n' ' ')
  [ -z "$p" ] || { ok=FAIL; d="$d panic in $p;"; }
  hres fo-teardown $ok "${d:+$d }each node expected to run ran to the end and stopped on SIGTERM; no panic in the node logs"
}
