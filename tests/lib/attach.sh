# shellcheck shell=bash
# tests/lib/attach.sh -- `flashpool attach` set-ups shared by tests/attach/failover.sh and
# docs/bench/apps.sh (sourced, bash): attaches by name, a filesystem on a loop device over
# DIR/disk, and a cluster volume (etcd, enclosures, controllers) to attach to.
#
#   attaches     att_start NAME TARGET DIR [OPTION...], att_stop NAME, att_pid NAME
#   filesystems  att_fs_up NAME FILE MNT (losetup --direct-io=on, mkfs.ext4, mount),
#                att_fs_down NAME, att_loop NAME
#   teardown     att_cleanup (every filesystem and attach started here, last first)
#   cluster      att_cluster_up N_ENC N_CTL DRIVE LAYOUT NQN VOL (tests/cluster/lib.sh first)
#   CPU          att_cpu_s PID... (utime + stime of the processes, seconds)
#
# The caller sets BIN (flashpool) and RUN (a directory for logs: $RUN/attach-NAME.log).

declare -gA ATT_PID=() ATT_DIR=() ATT_LOOP=() ATT_MNT=()
ATT_NAMES=""

att_mounted() { grep -qs " $1 " /proc/self/mountinfo; }
att_pid() { echo "${ATT_PID[$1]:-}"; }
att_loop() { echo "${ATT_LOOP[$1]:-}"; }

# att_start NAME TARGET DIR [OPTION...]: `flashpool attach OPTION... TARGET DIR` in the
# background (log $RUN/attach-NAME.log); 0 once DIR/disk is there (10 s at most)
att_start() {
  local name=$1 target=$2 dir=$3 i; shift 3
  mkdir -p "$dir"
  "$BIN" attach "$@" "$target" "$dir" >> "$RUN/attach-$name.log" 2>&1 &
  ATT_PID[$name]=$!; ATT_DIR[$name]=$dir
  case " $ATT_NAMES " in *" $name "*) ;; *) ATT_NAMES="$ATT_NAMES $name";; esac
  for i in $(seq 1 100); do
    if att_mounted "$dir" && [ -f "$dir/disk" ]; then return 0; fi
    kill -0 "${ATT_PID[$name]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "attach $name ($target) did not come up:"; tail -n 10 "$RUN/attach-$name.log" | sed 's/^/    /'
  return 1
}

# att_stop NAME: its filesystem down, then SIGTERM (the attach unmounts and exits 0), 10 s,
# then SIGKILL; the attach's exit status
att_stop() {
  local name=$1 pid=${ATT_PID[$1]:-} i rc=0
  att_fs_down "$name"
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null
  for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rc=124
  else wait "$pid" 2>/dev/null; rc=$?; fi
  att_mounted "${ATT_DIR[$name]}" && umount -l "${ATT_DIR[$name]}"
  ATT_PID[$name]=""
  return "$rc"
}

# att_fs_up NAME FILE MNT: a loop device with direct I/O over FILE, ext4 made on it, mounted
# at MNT
att_fs_up() {
  local name=$1 file=$2 mnt=$3 loop
  mkdir -p "$mnt"
  loop=$(losetup --direct-io=on -f --show "$file") || return 1
  ATT_LOOP[$name]=$loop
  case " $ATT_NAMES " in *" $name "*) ;; *) ATT_NAMES="$ATT_NAMES $name";; esac
  [ "$(cat "/sys/block/${loop#/dev/}/loop/dio" 2>/dev/null)" = 1 ] || { echo "$loop: no direct I/O"; return 1; }
  mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$loop" > "$RUN/mkfs-$name.txt" 2>&1 \
    || { cat "$RUN/mkfs-$name.txt"; return 1; }
  mount "$loop" "$mnt" || return 1
  ATT_MNT[$name]=$mnt
}

# att_fs_down NAME: unmount its filesystem, detach its loop device
att_fs_down() {
  local name=$1
  if [ -n "${ATT_MNT[$name]:-}" ]; then
    att_mounted "${ATT_MNT[$name]}" && { umount "${ATT_MNT[$name]}" 2>/dev/null || umount -l "${ATT_MNT[$name]}"; }
    ATT_MNT[$name]=""
  fi
  if [ -n "${ATT_LOOP[$name]:-}" ]; then losetup -d "${ATT_LOOP[$name]}" 2>/dev/null; ATT_LOOP[$name]=""; fi
}

# att_cleanup: everything att_start and att_fs_up set up, the last first (for an EXIT trap)
att_cleanup() {
  local n pid
  for n in $(echo "$ATT_NAMES" | tr ' ' '\n' | tac); do
    att_fs_down "$n"
    pid=${ATT_PID[$n]:-}
    if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; ATT_PID[$n]=""; fi
    [ -n "${ATT_DIR[$n]:-}" ] && att_mounted "${ATT_DIR[$n]}" && umount -l "${ATT_DIR[$n]}"
  done
  return 0
}

# att_cpu_s PID...: user + system CPU seconds the processes (all their threads) used so far
att_cpu_s() {
  local p t=0 tck; tck=$(getconf CLK_TCK)
  for p in "$@"; do
    # fields 14 and 15 after the ")" that ends the command name
    t=$((t + $(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}' || echo 0)))
  done
  awk -v t="$t" -v k="$tck" 'BEGIN{printf "%.2f", t / k}'
}

# att_cluster_up N_ENC N_CTL DRIVE LAYOUT NQN VOL: tests/cluster/lib.sh's plumbing, one etcd
# member, enclosures e1..eN_ENC with one drive d0 each (DRIVE: "file:64MiB", "mem:512MiB"),
# controllers c1..cN_CTL in cluster mode, and volume VOL (LAYOUT across every enclosure's
# d0) exported by every controller as NQN nsid 1, owned by c1. FPC_EXPORT_HOSTS must name
# the controllers. Errors are said; status 1.
att_cluster_up() {
  local ne=$1 nc=$2 drive=$3 layout=$4 nqn=$5 vol=$6 i dl="" want
  fpc_net_up $((6 + nc)) || return 1
  fpc_etcd_up 1 || return 1
  for i in $(seq 1 "$ne"); do
    fpc_enclosure_toml "$i" "d0:$drive" > "$FPC_DIR/e$i.toml"
    fpc_start_enclosure "$i" || return 1
    dl="$dl,e$i:d0"
  done
  for i in $(seq 1 "$nc"); do
    fpc_ctl_toml "$i" "$ne" > "$FPC_DIR/c$i.toml"
    fpc_start_ctl "$i" || return 1
  done
  want=$(seq 1 "$nc" | sed 's/^/c/' | tr '\n' ' '); want=${want% }
  for _ in $(seq 1 100); do [ "$(fpc_cluster_nodes)" = "$want" ] && break; sleep 0.3; done
  [ "$(fpc_cluster_nodes)" = "$want" ] || { echo "cluster members: '$(fpc_cluster_nodes)', not '$want'"; return 1; }
  fpc_ccli 1 volume create "$vol" --layout "$layout" --drives "${dl#,}" --export "$nqn" --nsid 1 \
    > "$RUN/create-$vol.txt" 2>&1 || { cat "$RUN/create-$vol.txt"; return 1; }
  fpc_wait_owner "$vol" 30 || { echo "$vol: no owner within 30 s"; return 1; }
  [ "$FPC_OWNER" = c1 ] || { echo "$vol: owner $FPC_OWNER, not c1"; return 1; }
}
