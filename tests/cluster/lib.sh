# tests/cluster/lib.sh -- several `flashpool serve` nodes on one machine, each an
# "enclosure" in its own Linux network namespace. Sourced (bash) by tests/cluster/run.sh,
# tests/interop/run.sh (its cluster phase), tests/failover/run.sh (cluster mode: etcd and
# controller nodes, at the end of this file) and docs/bench/cluster-raid.sh.
#
# Plumbing (root needed): bridge $FPC_BR = 10.77.0.1/24 in the root namespace; enclosure i
# (1..9) is namespace $FPC_PREFIX-e<i> with eth0 = 10.77.0.(10+i)/24, the other end of a
# veth pair $FPC_PREFIX-v<i> on the bridge. The "owner" node runs in the root namespace and
# reaches the enclosures through the bridge; a QEMU guest reaches the owner on the host's
# loopback (10.0.2.2 through slirp). Only 10.77.0.0/24 and loopback are used.
#
# Everything a run makes lives under $FPC_DIR (configs, logs, drive images, pid files);
# fpc_cleanup removes what a previous (crashed) run left too: the namespaces with our
# prefix and the processes in them, our bridge and veths, the pids in $FPC_DIR/pids.
#
# Caller sets: FPC_BIN (flashpool binary), FPC_DIR (state dir). Optional: FPC_PREFIX (fpc).

FPC_PREFIX=${FPC_PREFIX:-fpc}
FPC_BR=${FPC_PREFIX}br0
FPC_NET=${FPC_NET:-10.77.0}   # another /24 (and FPC_PREFIX) lets two runs share a machine
FPC_BR_IP=$FPC_NET.1
FPC_PORT=${FPC_PORT:-4420}
FPC_NODE_NQN=nqn.2026-01.io.flashpool:node        # :<name> = a node's host NQN
FPC_DRIVE_NQN=nqn.2026-01.io.flashpool:drive      # :<node>:<drive> = an exported drive
FPC_ETCD_DIR=${FPC_ETCD_DIR:-/dev/shm/$FPC_PREFIX-etcd}   # etcd data (tmpfs: no fsync stalls)
export PATH="$PATH:/usr/sbin:/sbin"

fpc_say() { echo "[cluster $(date +%T)] $*"; }
fpc_ns() { echo "$FPC_PREFIX-e$1"; }
fpc_ip() { echo "$FPC_NET.$((10 + $1))"; }
fpc_veth() { echo "$FPC_PREFIX-v$1"; }
fpc_pidf() { echo "$FPC_DIR/pids/$1.pid"; }
fpc_log() { echo "$FPC_DIR/$1.log"; }

# The management API's credentials for a run (docs/api.md, Authentication): one token for
# every node ($FPC_DIR/api-token, each TOML's [api] token_file; also what nodes send each
# other), and a CA with one certificate for the controllers' APIs, which listen off loopback
# and so over HTTPS only. Idempotent; the TOML writers call it.
fpc_api_auth_init() {
  mkdir -p "$FPC_DIR"
  [ -s "$FPC_DIR/api-token" ] || (umask 077
    python3 -c 'import secrets; print("fpc." + secrets.token_hex(32))' > "$FPC_DIR/api-token")
  [ -s "$FPC_DIR/api-cert.pem" ] && return 0
  local sans="IP:127.0.0.1" k
  for k in $(seq 1 30); do sans="$sans,IP:$FPC_NET.$((10 + k))"; done
  (cd "$FPC_DIR" && umask 077 \
    && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout api-ca.key \
      -out api-ca.pem -days 30 -subj "/CN=flashpool test API CA" \
    && openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout api-key.pem \
      -out api.csr -subj "/CN=flashpool test API" \
    && printf 'basicConstraints=CA:FALSE\nsubjectAltName=%s\n' "$sans" > api.ext \
    && openssl x509 -req -in api.csr -CA api-ca.pem -CAkey api-ca.key -CAcreateserial \
      -out api-cert.pem -days 30 -extfile api.ext) > /dev/null 2>&1 \
    || fpc_say "openssl could not make the API's test certificate in $FPC_DIR"
}
# fpc_api_toml ADDR:PORT [tls]: an [api] section with the run's token (and certificate)
fpc_api_toml() {
  fpc_api_auth_init
  printf '[api]\naddress = "%s"\ntoken_file = "%s"\n' "$1" "$FPC_DIR/api-token"
  [ "${2:-}" = tls ] && printf 'tls_cert = "%s"\ntls_key = "%s"\ntls_ca = "%s"\n' \
    "$FPC_DIR/api-cert.pem" "$FPC_DIR/api-key.pem" "$FPC_DIR/api-ca.pem"
  echo
}
# fpc_auth: the CLI's arguments for the run's token and CA
fpc_auth() { echo "--token-file $FPC_DIR/api-token --ca-file $FPC_DIR/api-ca.pem"; }

# fpc_preflight: 0 if this machine can run the plumbing (root, ip, tc, netns, veth, bridge)
fpc_preflight() {
  FPC_WHY=""
  [ "$(id -u)" = 0 ] || { FPC_WHY="not root"; return 1; }
  command -v ip > /dev/null || { FPC_WHY="no 'ip' (apt-get install iproute2)"; return 1; }
  command -v tc > /dev/null || { FPC_WHY="no 'tc' (apt-get install iproute2)"; return 1; }
  ip netns add "$FPC_PREFIX-probe" 2> /dev/null || { FPC_WHY="ip netns add fails (no CAP_SYS_ADMIN?)"; return 1; }
  ip netns del "$FPC_PREFIX-probe" 2> /dev/null
  return 0
}

# a pid of ours still running this binary?
fpc_pid_alive() { [ -n "$1" ] && kill -0 "$1" 2> /dev/null; }
fpc_pid_of() { cat "$(fpc_pidf "$1")" 2> /dev/null || true; }

# fpc_cleanup: stop every process we started (pid files), every process left in one of our
# namespaces (a crashed earlier run), delete the namespaces, veths and bridge. Idempotent.
fpc_cleanup() {
  local f p ns i
  if [ -d "$FPC_DIR/pids" ]; then
    for f in "$FPC_DIR"/pids/*.pid; do
      [ -e "$f" ] || continue
      p=$(cat "$f" 2> /dev/null || true)
      # only if it still is one of ours (the pid may have been reused since): flashpool or
      # etcd (the failover suite's members)
      if [ -n "$p" ] && grep -qaE 'flashpool|etcd' "/proc/$p/cmdline" 2> /dev/null; then
        kill -KILL "$p" 2> /dev/null; { wait "$p"; } 2> /dev/null
      fi
      rm -f "$f"
    done
  fi
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep -E "^$FPC_PREFIX-(e[0-9]+|probe)\$" || true); do
    for p in $(ip netns pids "$ns" 2> /dev/null || true); do kill -KILL "$p" 2> /dev/null; { wait "$p"; } 2> /dev/null; done
    i=0; while [ -n "$(ip netns pids "$ns" 2> /dev/null)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    ip netns del "$ns" 2> /dev/null || true
  done
  for f in $(ip -o link show 2> /dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^$FPC_PREFIX-v[0-9]+\$" || true); do
    ip link del "$f" 2> /dev/null || true
  done
  ip link del "$FPC_BR" 2> /dev/null || true
  rm -rf "$FPC_ETCD_DIR"
}

# fpc_net_up N: bridge + N enclosure namespaces (after a cleanup of leftovers)
fpc_net_up() {
  local n=$1 i ns v
  fpc_cleanup
  mkdir -p "$FPC_DIR/pids"
  ip link add "$FPC_BR" type bridge || return 1
  ip addr add "$FPC_BR_IP/24" dev "$FPC_BR" || return 1
  ip link set "$FPC_BR" up || return 1
  for i in $(seq 1 "$n"); do
    ns=$(fpc_ns "$i"); v=$(fpc_veth "$i")
    ip netns add "$ns" || return 1
    ip link add "$v" type veth peer name "${v}p" || return 1
    ip link set "${v}p" netns "$ns" || return 1
    ip link set "$v" master "$FPC_BR" || return 1
    ip link set "$v" up || return 1
    ip -n "$ns" link set "${v}p" name eth0 || return 1
    ip -n "$ns" addr add "$(fpc_ip "$i")/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$ns" link set lo up || return 1
  done
  # the bridge forwards at once (no STP learning delay); wait until every namespace answers
  for i in $(seq 1 "$n"); do
    fpc_wait_reach "$i" 10 || { fpc_say "enclosure $i ($(fpc_ip "$i")) unreachable after set-up"; return 1; }
  done
}

# fpc_reach I: 0 if the root namespace reaches enclosure I: a TCP connect to its port 9
# ends at once (refused: an RST came back, or accepted); 1 if it hangs (no ping needed)
fpc_reach() {
  timeout 1 bash -c "exec 3<>/dev/tcp/$(fpc_ip "$1")/9" 2> /dev/null
  [ $? != 124 ]
}
# fpc_wait_reach I SECONDS: until fpc_reach I
fpc_wait_reach() {
  local end=$(($(date +%s) + $2))
  while :; do
    fpc_reach "$1" && return 0
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.2
  done
}

# the host NQNs an enclosure exports its drives to: $FPC_EXPORT_HOSTS (names, default
# "owner"; the failover suite's controllers are "c1 c2 c3"), as a TOML list
fpc_export_hosts() {
  local n l=""
  for n in ${FPC_EXPORT_HOSTS:-owner}; do l="$l, \"$FPC_NODE_NQN:$n\""; done
  echo "${l#, }"
}
# fpc_enclosure_toml I DRIVES [MODE]: the TOML of enclosure e<I>, listening on its address.
# DRIVES: "d0:file:64MiB d1:mem:256MiB ..." (file drives live in $FPC_DIR/e<I>-<d>.img and
# survive a restart). MODE "export" (default): JBOF drives, `export = true`, allowed hosts
# those of fpc_export_hosts; MODE "subsys": no cluster keys, each drive a plain [[subsystem]]
# nqn.2026-01.io.flashpool:plumb:e<I>:<d> (any host) -- what the binary understood before
# node identity and drive export landed; the plumbing test uses it.
fpc_enclosure_toml() {
  local i=$1 drives=$2 mode=${3:-export} d name backend size
  echo "# generated by tests/cluster/lib.sh"
  echo "[node]"
  [ "$mode" = export ] && printf 'name = "e%s"\nstate_dir = "%s"\n' "$i" "$FPC_DIR/state-e$i"
  printf 'reactors = %s\nlog = "%s"\n' "${FPC_REACTORS:-1}" "${FPC_LOG_LEVEL:-info}"
  [ -n "${FPC_POLL_US:-}" ] && printf 'poll_us = %s\n' "$FPC_POLL_US"   # default: the node's
  echo
  printf '[[listener]]\naddress = "%s"\nport = %s\nkind = "io"\n\n' "$(fpc_ip "$i")" "$FPC_PORT"
  fpc_api_toml "127.0.0.1:9410"     # each namespace has its own loopback
  for d in $drives; do
    name=${d%%:*}; backend=$(echo "$d" | cut -d: -f2); size=$(echo "$d" | cut -d: -f3)
    if [ "$mode" = export ]; then
      printf '[[drive]]\nname = "%s"\nbackend = "%s"\nsize = "%s"\n' "$name" "$backend" "$size"
      [ "$backend" = file ] && printf 'path = "%s"\ncreate = true\n' "$FPC_DIR/e$i-$name.img"
      printf 'export = true\nexport_hosts = [%s]\n\n' "$(fpc_export_hosts)"
    else
      printf '[[subsystem]]\nnqn = "nqn.2026-01.io.flashpool:plumb:e%s:%s"\nallow_any_host = true\n\n' "$i" "$name"
      printf '[[subsystem.namespace]]\nnsid = 1\nbackend = "%s"\nsize = "%s"\n' "$backend" "$size"
      [ "$backend" = file ] && printf 'path = "%s"\ncreate = true\n' "$FPC_DIR/e$i-$name.img"
      echo
    fi
  done
}

# fpc_start_node NAME LISTEN_ADDR:PORT [NETNS]: start `flashpool serve -c $FPC_DIR/NAME.toml`
# (in NETNS if given) and wait until it logs "listening on LISTEN_ADDR:PORT"; pid in the
# pid file. The log is appended to (a restart marks its start).
fpc_start_node() {
  local name=$1 listen=$2 ns=${3:-} log from i=0 pid
  log=$(fpc_log "$name")
  echo "=== start $(date +%T.%N) ===" >> "$log"
  from=$(wc -l < "$log")
  if [ -n "$ns" ]; then
    # `ip netns exec` execs the command: the pid is flashpool's own
    ip netns exec "$ns" "$FPC_BIN" serve -c "$FPC_DIR/$name.toml" >> "$log" 2>&1 &
  else
    "$FPC_BIN" serve -c "$FPC_DIR/$name.toml" >> "$log" 2>&1 &
  fi
  pid=$!
  echo "$pid" > "$(fpc_pidf "$name")"
  while [ $i -lt 150 ]; do
    if ! kill -0 "$pid" 2> /dev/null; then
      fpc_say "$name: flashpool exited during start-up:"; tail -n +"$from" "$log" | tail -n 15 | sed 's/^/    /'
      return 1
    fi
    tail -n +"$from" "$log" | grep "listening on $listen" > /dev/null && return 0
    sleep 0.1; i=$((i + 1))
  done
  fpc_say "$name: no 'listening on $listen' within 15 s"; tail -n +"$from" "$log" | tail -n 15 | sed 's/^/    /'
  return 1
}
# fpc_start_enclosure I: start e<I> in its namespace (its TOML must exist)
fpc_start_enclosure() { fpc_start_node "e$1" "$(fpc_ip "$1"):$FPC_PORT" "$(fpc_ns "$1")"; }
# fpc_kill NAME: SIGKILL and reap
fpc_kill() {
  local p; p=$(fpc_pid_of "$1")
  fpc_pid_alive "$p" || return 1
  kill -KILL "$p"; { wait "$p"; } 2> /dev/null
  rm -f "$(fpc_pidf "$1")"
}
# fpc_stop NAME: SIGTERM, 15 s, then SIGKILL; 0 if it exited by itself
fpc_stop() {
  local p i=0; p=$(fpc_pid_of "$1")
  fpc_pid_alive "$p" || return 1
  kill -TERM "$p" 2> /dev/null
  while kill -0 "$p" 2> /dev/null && [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
  rm -f "$(fpc_pidf "$1")"
  if kill -0 "$p" 2> /dev/null; then kill -KILL "$p"; wait "$p" 2> /dev/null; return 1; fi
  wait "$p" 2> /dev/null || true
}

# link faults, on the bridge side of enclosure I's veth
fpc_link_down() { ip link set dev "$(fpc_veth "$1")" down; }
fpc_link_up() { ip link set dev "$(fpc_veth "$1")" up; }
# A silent partition: netem loss 100% on the veth. A kernel without sch_netem (some VM
# kernels) gets the same from tbf: a bucket of 64 bytes passes no frame (the smallest TCP
# segment is 66), so every frame is dropped, on the veth and on the namespace's eth0 (both
# directions). FPC_LOSS_HOW says which one was used.
fpc_loss_on() {
  if tc qdisc replace dev "$(fpc_veth "$1")" root netem loss 100% 2> /dev/null; then
    FPC_LOSS_HOW="tc qdisc add dev $(fpc_veth "$1") root netem loss 100%"
  else
    tc qdisc replace dev "$(fpc_veth "$1")" root tbf rate 1kbit burst 64 limit 1 \
      && tc -n "$(fpc_ns "$1")" qdisc replace dev eth0 root tbf rate 1kbit burst 64 limit 1 || return 1
    FPC_LOSS_HOW="no sch_netem in this kernel: tc tbf burst 64 (drops every frame) on $(fpc_veth "$1") and $(fpc_ns "$1")/eth0"
  fi
}
# fpc_cut_from SLOT PEER...: a silent partition between namespace SLOT and some peers
# only (PEER: ADDR, or ADDR:PORT for the traffic of that port on ADDR, e.g. etcd's client
# port on the bridge address, which the QEMU guest's slirp connections also come from),
# both directions, the rest untouched. Only HTB, TBF and u32 (no netem, no gact action, no
# iptables: what the suite's kernels all have): on each end of SLOT's veth an HTB whose
# default class passes everything and whose class 1:2 has the passes-no-frame tbf of
# fpc_loss_on as its leaf; u32 filters send the peers' frames there (SLOT's eth0: to the
# peer; the bridge side of its veth: from the peer). fpc_loss_off SLOT removes it all.
fpc_cut_from() {
  local s=$1 v ns p ip port; shift
  v=$(fpc_veth "$s"); ns=$(fpc_ns "$s")
  local dev
  for dev in "$v" "ns:eth0"; do
    local t=(tc); [ "$dev" = ns:eth0 ] && { t=(tc -n "$ns"); dev=eth0; }
    "${t[@]}" qdisc replace dev "$dev" root handle 1: htb default 1 || return 1
    "${t[@]}" class add dev "$dev" parent 1: classid 1:1 htb rate 10gbit quantum 200000 || return 1
    "${t[@]}" class add dev "$dev" parent 1: classid 1:2 htb rate 1mbit || return 1
    "${t[@]}" qdisc add dev "$dev" parent 1:2 handle 2: tbf rate 1kbit burst 64 limit 1 || return 1
  done
  for p in "$@"; do
    ip=${p%%:*}; port=""; [ "$p" = "$ip" ] || port=${p#*:}
    # shellcheck disable=SC2086   # the port match: words, or none
    tc filter add dev "$v" parent 1: protocol ip prio 1 u32 match ip src "$ip/32" \
      ${port:+match ip sport $port 0xffff} flowid 1:2 || return 1
    # shellcheck disable=SC2086
    tc -n "$ns" filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst "$ip/32" \
      ${port:+match ip dport $port 0xffff} flowid 1:2 || return 1
  done
  FPC_LOSS_HOW="tc htb + u32 on both ends of $v: frames between $(fpc_ip "$s") and $* dropped (a tbf leaf that passes none)"
}
fpc_loss_off() {
  local rc=1
  tc qdisc del dev "$(fpc_veth "$1")" root 2> /dev/null && rc=0
  tc -n "$(fpc_ns "$1")" qdisc del dev eth0 root 2> /dev/null
  return $rc
}

# ---- the owner: a node in the root namespace whose volumes are made of enclosure drives
# fpc_owner_toml NAME IO_PORT DISC_PORT API_PORT NQN N_ENCLOSURES [FAIL_AFTER_MS]
fpc_owner_toml() {
  local name=$1 io=$2 disc=$3 api=$4 nqn=$5 n=$6 fail=${7:-2000} i d
  if [ "${FPC_SIM:-0}" = 1 ]; then   # harness development only: see FPC_SIM below
    fpc_owner_toml_real "$@" | sed -e '/^name = /d' -e '/^state_dir = /d' -e '/^\[remote\]/,/^$/d' -e '/^\[\[peer\]\]/,$d'
    for i in $(seq 1 "$n"); do for d in d0 d1 d2; do
      printf '\n[[drive]]\nname = "e%s_%s"\nbackend = "mem"\nsize = "%s"\n' "$i" "$d" "$FPC_DRIVE_SIZE"
    done; done
    return
  fi
  fpc_owner_toml_real "$@"
}
fpc_owner_toml_real() {
  local name=$1 io=$2 disc=$3 api=$4 nqn=$5 n=$6 fail=${7:-2000} i
  cat << EOF
# generated by tests/cluster/lib.sh
[node]
name = "$name"
state_dir = "$FPC_DIR/state-$name"
reactors = ${FPC_OWNER_REACTORS:-2}
log = "${FPC_LOG_LEVEL:-info}"
${FPC_POLL_US:+poll_us = $FPC_POLL_US}

[[listener]]
address = "127.0.0.1"
port = $io
kind = "io"

[[listener]]
address = "127.0.0.1"
port = $disc
kind = "discovery"

$(fpc_api_toml "127.0.0.1:$api")

[remote]
fail_after_ms = $fail

[[subsystem]]
nqn = "$nqn"
serial = "FPCLUSTER0001"
model = "flashpool-cluster-owner"
allow_any_host = true
EOF
  for i in $(seq 1 "$n"); do
    printf '\n[[peer]]\nname = "e%s"\naddress = "%s:%s"\n' "$i" "$(fpc_ip "$i")" "$FPC_PORT"
  done
}

# fpc_cli API ARGS...: `flashpool ARGS --api 127.0.0.1:API`
fpc_cli() { local api=$1; shift; timeout 120 "$FPC_BIN" "$@" --api "127.0.0.1:$api" $(fpc_auth); }

# fpc_members API VOL: one line per member, "POSITION DRIVE STATE", then "volume STATE";
# nothing (status 1) if the API does not answer
fpc_members() {
  timeout 5 "$FPC_BIN" volume show "$2" --json --api "127.0.0.1:$1" $(fpc_auth) 2> /dev/null | python3 -c '
import json, sys
v = json.load(sys.stdin)
for m in v.get("members", []):
    print(m.get("position"), m.get("drive"), m.get("state"))
print("volume", v.get("state"))
'
}
# fpc_member_state API VOL ENC:DRIVE: state of the member on that enclosure drive (matches
# "e3:d0" as a drive name and inside ".../nqn...:drive:e3:d0?nsid=1"); "absent" if none
fpc_member_state() {
  fpc_members "$1" "$2" | awk -v want="$3" '
    $1 != "volume" { d = $2; if (d == want || d ~ ("[:/]" want "([?]|$)")) { print $3; f = 1; exit } }
    END { if (!f) print "absent" }'
}
fpc_volume_state() { fpc_members "$1" "$2" | awk '$1 == "volume" { print $2 }'; }

# fpc_wait_member API VOL ENC:DRIVE STATES SECONDS: until that member's state is one of
# STATES ("failed" or "failed|absent"); FPC_WAITED = seconds waited, FPC_SEEN = last state
fpc_wait_member() {
  local t0 s; t0=$(date +%s.%N)
  while :; do
    s=$(fpc_member_state "$1" "$2" "$3"); FPC_SEEN=$s
    FPC_WAITED=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
    if echo "$s" | grep -qxE "$4"; then return 0; fi
    awk -v w="$FPC_WAITED" -v l="$5" 'BEGIN{exit !(w >= l)}' && return 1
    sleep 0.25
  done
}
# fpc_wait_optimal API VOL SECONDS: until every member is active and the volume optimal;
# FPC_WAITED, FPC_SEEN (the member states, one line)
fpc_wait_optimal() {
  local t0 m; t0=$(date +%s.%N)
  while :; do
    m=$(fpc_members "$1" "$2" || true)
    FPC_SEEN=$(echo "$m" | awk '$1 == "volume" { v = $2; next } { s = s " " $2 "=" $3 } END { print "volume=" v ";" s }')
    FPC_WAITED=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
    if [ -n "$m" ] && echo "$m" | awk '$1 == "volume" { ok = ($2 == "optimal"); next } $3 != "active" { bad = 1 } END { exit !(ok && !bad) }'; then
      return 0
    fi
    awk -v w="$FPC_WAITED" -v l="$3" 'BEGIN{exit !(w >= l)}' && return 1
    sleep 0.25
  done
}

# ================================================================ the fault scenario
# Six enclosures e1..e6, each exporting three file drives (they survive a kill -9):
#   d0: raid6 "r6" on e1..e5 d0 (3+2)        exported by the owner as NQN nsid 1
#   d2: ec4+2 "ec" on e1..e6 d2              exported by the owner as NQN nsid 2
#   d1: spare; e6:d1 takes e3:d0's place in r6 (the replace step)
# While a load runs on both namespaces (fio in the QEMU guest, or flashpool bench), the
# steps of FPC_STEPS cut members away and bring them back; each step waits for what the
# owner's API must say (GET /v1/volumes/NAME) and reports one RESULT through the caller's
# fpc_result NAME PASS|FAIL DETAIL. At most two enclosures are away at a time: both
# volumes stay within their redundancy throughout, so the load must see no error at all.
FPC_N=6
FPC_DRIVE_SIZE=${FPC_DRIVE_SIZE:-64MiB}
FPC_FAIL_MS=${FPC_FAIL_MS:-2000}
FPC_DETECT_S=${FPC_DETECT_S:-20}     # a cut member must be marked failed within this
FPC_RESYNC_S=${FPC_RESYNC_S:-90}     # ... and be active again this long after it is back
FPC_STEPS="kill-e1 kill-e2 restart-e1e2 link-down-e3 link-up-e3 loss-e4 loss-clear-e4 replace-e3"
FPC_CHECKS_HOST="cluster-up cluster-kill-e1 cluster-kill-e2 cluster-restart-e1e2 cluster-link-down-e3
  cluster-link-up-e3 cluster-loss-e4 cluster-loss-clear-e4 cluster-replace-e3 cluster-teardown"
# FPC_SIM=1 (harness development only, while the binary has no remote members): the
# enclosures are plain subsystem nodes and the owner's volumes sit on its own RAM drives
# named e1_d0 ...; the fault steps still act on the enclosures, but the owner cannot see
# them, so the cut/back checks only say SIMULATION. Never for CI.
fpc_dn() { if [ "${FPC_SIM:-0}" = 1 ]; then echo "$1" | tr : _; else echo "$1"; fi; }
fpc_dl() { local d l=""; for d in $*; do l="$l,$(fpc_dn "$d")"; done; echo "${l#,}"; }
FPC_R6_MEMBERS="e1:d0 e2:d0 e3:d0 e4:d0 e5:d0"
FPC_EC_MEMBERS="e1:d2 e2:d2 e3:d2 e4:d2 e5:d2 e6:d2"

# fpc_scenario_up OWNER_IO OWNER_DISC OWNER_API NQN: plumbing, enclosures, owner, volumes.
# Reports cluster-up. Sets FPC_API.
FPC_BROKEN=""
fpc_scenario_up() {
  local io=$1 disc=$2 api=$3 nqn=$4 i t0 detail="" ok=FAIL
  FPC_API=$api; FPC_NQN=$nqn; FPC_BROKEN=""; FPC_R6_NOW=""
  t0=$(date +%s.%N)
  mkdir -p "$FPC_DIR"
  if ! fpc_net_up "$FPC_N"; then detail="network set-up failed"
  else
    for i in $(seq 1 "$FPC_N"); do
      fpc_enclosure_toml "$i" "d0:file:$FPC_DRIVE_SIZE d1:file:$FPC_DRIVE_SIZE d2:file:$FPC_DRIVE_SIZE" \
        "$([ "${FPC_SIM:-0}" = 1 ] && echo subsys || echo export)" > "$FPC_DIR/e$i.toml"
    done
    rm -f "$FPC_DIR"/e*-d*.img; rm -rf "$FPC_DIR"/state-*
    for i in $(seq 1 "$FPC_N"); do fpc_start_enclosure "$i" || { detail="enclosure e$i did not start (see $(fpc_log "e$i"))"; break; }; done
  fi
  if [ -z "$detail" ]; then
    fpc_owner_toml owner "$io" "$disc" "$api" "$nqn" "$FPC_N" "$FPC_FAIL_MS" > "$FPC_DIR/owner.toml"
    if ! fpc_start_node owner "127.0.0.1:$io"; then detail="the owner did not start (see $(fpc_log owner))"
    elif ! fpc_cli "$api" volume create r6 --layout raid6 --drives "$(fpc_dl $FPC_R6_MEMBERS)" \
        --rebuild-rate 16MiB --export "$nqn" --nsid 1 > "$FPC_DIR/create-r6.txt" 2>&1; then
      detail="volume create r6: $(tail -n 2 "$FPC_DIR/create-r6.txt" | tr '\n' ' ')"
    elif ! fpc_cli "$api" volume create ec --layout ec4+2 --drives "$(fpc_dl $FPC_EC_MEMBERS)" \
        --rebuild-rate 16MiB --export "$nqn" --nsid 2 > "$FPC_DIR/create-ec.txt" 2>&1; then
      detail="volume create ec: $(tail -n 2 "$FPC_DIR/create-ec.txt" | tr '\n' ' ')"
    elif ! fpc_wait_optimal "$api" r6 30; then detail="r6 not optimal: $FPC_SEEN"
    elif ! fpc_wait_optimal "$api" ec 30; then detail="ec not optimal: $FPC_SEEN"
    else
      ok=PASS
      detail="$FPC_N enclosures in netns $(fpc_ns 1)..$(fpc_ns $FPC_N) ($(fpc_ip 1)..$(fpc_ip $FPC_N)), owner on 127.0.0.1:$io: r6 raid6 on $FPC_R6_MEMBERS, ec ec4+2 on $FPC_EC_MEMBERS, exported as $nqn nsid 1 and 2, in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
    fi
  fi
  [ "${FPC_SIM:-0}" = 1 ] && detail="SIMULATION (FPC_SIM=1, local members): $detail"
  fpc_result cluster-up $ok "$detail"
  [ $ok = PASS ]
}

# fpc_cut_wait NAME ENC WHAT: the members of enclosure ENC in both volumes must turn failed
fpc_cut_wait() {
  local name=$1 e=$2 what=$3 ok=PASS d="" vol m
  [ "${FPC_SIM:-0}" = 1 ] && { fpc_result "cluster-$name" PASS "SIMULATION (FPC_SIM=1: the owner has no remote members): $what"; return 0; }
  for vol in r6 ec; do
    m=$(fpc_vol_member "$vol" "$e")
    [ -n "$m" ] || continue
    if fpc_wait_member "$FPC_API" "$vol" "$m" failed "$FPC_DETECT_S"; then d="$d $vol/$m failed after ${FPC_WAITED} s;"
    else ok=FAIL; d="$d $vol/$m still '$FPC_SEEN' after ${FPC_WAITED} s;"; fi
  done
  fpc_result "cluster-$name" $ok "$what:$d volumes: r6 $(fpc_volume_state "$FPC_API" r6), ec $(fpc_volume_state "$FPC_API" ec)"
  [ $ok = PASS ]
}
# fpc_back_wait NAME WHAT: both volumes optimal again, every member active
fpc_back_wait() {
  local name=$1 what=$2 ok=PASS d="" vol end left
  [ "${FPC_SIM:-0}" = 1 ] && { fpc_result "cluster-$name" PASS "SIMULATION (FPC_SIM=1: the owner has no remote members): $what"; return 0; }
  end=$(($(date +%s) + FPC_RESYNC_S))    # one deadline for both volumes
  for vol in r6 ec; do
    left=$((end - $(date +%s))); [ $left -gt 1 ] || left=1
    if fpc_wait_optimal "$FPC_API" "$vol" "$left"; then d="$d $vol optimal after ${FPC_WAITED} s;"
    else ok=FAIL; d="$d $vol not optimal after ${FPC_WAITED} s ($FPC_SEEN);"; fi
  done
  if [ $ok = FAIL ]; then   # the next cut would go past the redundancy: the steps stop here
    FPC_BROKEN="after step $name the volumes were not back"
    d="$d owner log: $(grep -E 'WARN|ERROR' "$(fpc_log owner)" | grep -v 'I/O error on nsid' | tail -n 2 | sed 's/^[^ ]* *//' | tr '\n' ' ')"
  fi
  fpc_result "cluster-$name" $ok "$what:$d"
  [ $ok = PASS ]
}
# the member of VOL on enclosure ENC (e.g. "e3" -> "e3:d0" in r6), from the current layout
FPC_R6_NOW=""
fpc_vol_member() {
  local list
  if [ "$1" = r6 ]; then list=${FPC_R6_NOW:-$FPC_R6_MEMBERS}; else list=$FPC_EC_MEMBERS; fi
  echo "$list" | tr ' ' '\n' | grep "^$2:" | head -n1
}

# fpc_scenario_step STEP (one of FPC_STEPS); reports cluster-STEP
fpc_scenario_step() {
  local ok d
  if ! fpc_pid_alive "$(fpc_pid_of owner)"; then   # no API to wait on: fail at once
    fpc_result "cluster-$1" FAIL "the owner is gone: $(tail -n 3 "$(fpc_log owner)" 2> /dev/null | tr '\n' ' ')"
    return 1
  fi
  if [ -n "$FPC_BROKEN" ]; then   # undo what may be undone, then fail at once
    fpc_link_up 3 2> /dev/null; fpc_loss_off 4 2> /dev/null
    fpc_result "cluster-$1" FAIL "not run: $FPC_BROKEN (a further fault would go past their redundancy)"
    return 1
  fi
  case $1 in
    kill-e1|kill-e2)
      local e=${1#kill-}
      if fpc_kill "$e"; then fpc_cut_wait "$1" "$e" "kill -9 $e (pid gone)"
      else fpc_result "cluster-$1" FAIL "$e was not running"; fi;;
    restart-e1e2)
      d=""
      fpc_start_enclosure 1 || d="e1 did not start; "
      fpc_start_enclosure 2 || d="${d}e2 did not start; "
      if [ -n "$d" ]; then fpc_result "cluster-$1" FAIL "$d"; else fpc_back_wait "$1" "e1, e2 restarted on their drive files"; fi;;
    link-down-e3)
      if fpc_link_down 3; then fpc_cut_wait "$1" e3 "ip link set $(fpc_veth 3) down"
      else fpc_result "cluster-$1" FAIL "ip link set $(fpc_veth 3) down failed"; fi;;
    link-up-e3)
      if fpc_link_up 3; then fpc_back_wait "$1" "ip link set $(fpc_veth 3) up"
      else fpc_result "cluster-$1" FAIL "ip link set $(fpc_veth 3) up failed"; fi;;
    loss-e4)
      if fpc_loss_on 4; then fpc_cut_wait "$1" e4 "$FPC_LOSS_HOW"
      else fpc_result "cluster-$1" FAIL "tc netem on $(fpc_veth 4) failed"; fi;;
    loss-clear-e4)
      if fpc_loss_off 4; then fpc_back_wait "$1" "loss removed ($FPC_LOSS_HOW)"
      else fpc_result "cluster-$1" FAIL "tc qdisc del on $(fpc_veth 4) failed"; fi;;
    replace-e3)
      if fpc_cli "$FPC_API" drive replace "$(fpc_dn e3:d0)" --with "$(fpc_dn e6:d1)" > "$FPC_DIR/replace.txt" 2>&1; then
        FPC_R6_NOW="e1:d0 e2:d0 e6:d1 e4:d0 e5:d0"
        ok=PASS; d="flashpool drive replace e3:d0 --with e6:d1: ok;"
        if fpc_wait_optimal "$FPC_API" r6 "$FPC_RESYNC_S"; then d="$d r6 optimal after ${FPC_WAITED} s;"
        else ok=FAIL; d="$d r6 not optimal after ${FPC_WAITED} s ($FPC_SEEN);"; fi
        local s3 s6; s3=$(fpc_member_state "$FPC_API" r6 "$(fpc_dn e3:d0)"); s6=$(fpc_member_state "$FPC_API" r6 "$(fpc_dn e6:d1)")
        [ "$s3" = absent ] && [ "$s6" = active ] || ok=FAIL
        d="$d member e6:d1 $s6, e3:d0 $s3 (expect active, absent)"
        fpc_result "cluster-$1" $ok "$d"
      else
        fpc_result "cluster-$1" FAIL "flashpool drive replace e3:d0 --with e6:d1: $(tail -n 2 "$FPC_DIR/replace.txt" | tr '\n' ' ')"
      fi;;
    *) fpc_result "cluster-$1" FAIL "unknown step";;
  esac
}

# fpc_scenario_down: stop the owner (SIGTERM: must stop cleanly), then the enclosures;
# remove the plumbing. Reports cluster-teardown.
fpc_scenario_down() {
  local ok=PASS d="" i left
  if fpc_pid_alive "$(fpc_pid_of owner)"; then
    if fpc_stop owner && tail -n 5 "$(fpc_log owner)" | grep -q 'stopped cleanly'; then d="owner stopped cleanly;"
    else ok=FAIL; d="owner did not stop cleanly (SIGTERM);"; fi
  else ok=FAIL; d="owner was gone before the end;"; fi
  for i in $(seq 1 "$FPC_N"); do
    fpc_pid_alive "$(fpc_pid_of "e$i")" || { ok=FAIL; d="$d e$i was gone before the end;"; continue; }
    fpc_stop "e$i" || { ok=FAIL; d="$d e$i hung on SIGTERM;"; }
  done
  fpc_cleanup
  left=$(ip netns list 2> /dev/null | grep -c "^$FPC_PREFIX-" || true)
  ip link show "$FPC_BR" > /dev/null 2>&1 && { ok=FAIL; d="$d bridge $FPC_BR left;"; }
  [ "$left" = 0 ] || { ok=FAIL; d="$d $left namespaces left;"; }
  fpc_result cluster-teardown $ok "$d namespaces, veths and bridge removed"
}

# ================================================================ cluster mode (tests/failover)
# etcd members 1..N run in the root namespace on the bridge address (a namespace cannot reach
# the root namespace's 127.0.0.1), client port FPC_ETCD_BASE+10*i, peer port +1, data on
# tmpfs ($FPC_ETCD_DIR); short heartbeat and election timeouts as docs/cluster.md advises.
# Controller ("cluster") nodes c1..c3 run `flashpool serve` with [cluster] in namespace
# slots 7..9 (10.77.0.17..19): I/O :4420, discovery :8009, API :9410 on their address; the
# enclosures e1..e6 export their drives to them (FPC_EXPORT_HOSTS="c1 c2 c3").
FPC_ETCD_BASE=${FPC_ETCD_BASE:-12300}
FPC_ETCD_N=${FPC_ETCD_N:-0}
FPC_CLUSTER=${FPC_CLUSTER:-fpc}
FPC_LEASE_MS=${FPC_LEASE_MS:-2000}
FPC_DISC_PORT=${FPC_DISC_PORT:-8009}
FPC_API_PORT=${FPC_API_PORT:-9410}
fpc_etcd_client() { echo "http://$FPC_BR_IP:$((FPC_ETCD_BASE + 10 * $1))"; }
fpc_etcd_peer() { echo "http://$FPC_BR_IP:$((FPC_ETCD_BASE + 10 * $1 + 1))"; }
# fpc_etcd_endpoints: the client URLs of every member, comma separated
fpc_etcd_endpoints() {
  local i l=""
  for i in $(seq 1 "$FPC_ETCD_N"); do l="$l,$(fpc_etcd_client "$i")"; done
  echo "${l#,}"
}
fpc_etcdctl() { ETCDCTL_API=3 timeout 10 etcdctl --dial-timeout=2s --command-timeout=3s "$@"; }
# fpc_etcd_healthy I: member I answers as healthy (it is part of a cluster with a leader)
fpc_etcd_healthy() { fpc_etcdctl --endpoints="$(fpc_etcd_client "$1")" endpoint health > /dev/null 2>&1; }
# fpc_etcd_start I [NOWAIT]: start member I (a member with a data dir rejoins with it), pid
# file etcd-I; waits up to 30 s until it is healthy unless NOWAIT
fpc_etcd_start() {
  local i=$1 n ic="" log
  for n in $(seq 1 "$FPC_ETCD_N"); do ic="$ic,m$n=$(fpc_etcd_peer "$n")"; done
  mkdir -p "$FPC_ETCD_DIR" "$FPC_DIR/pids"
  log=$(fpc_log "etcd-$i")
  echo "=== start $(date +%T.%N) ===" >> "$log"
  etcd --name "m$i" --data-dir "$FPC_ETCD_DIR/m$i" \
    --listen-client-urls "$(fpc_etcd_client "$i")" --advertise-client-urls "$(fpc_etcd_client "$i")" \
    --listen-peer-urls "$(fpc_etcd_peer "$i")" --initial-advertise-peer-urls "$(fpc_etcd_peer "$i")" \
    --initial-cluster "${ic#,}" --initial-cluster-state new --initial-cluster-token "$FPC_PREFIX-failover" \
    --heartbeat-interval 50 --election-timeout 300 >> "$log" 2>&1 &
  echo $! > "$(fpc_pidf "etcd-$i")"
  [ -n "${2:-}" ] && return 0
  fpc_etcd_wait "$i" 30
}
# fpc_etcd_wait I SECONDS: until member I is healthy
fpc_etcd_wait() {
  local end=$(($(date +%s) + $2))
  until fpc_etcd_healthy "$1"; do
    fpc_pid_alive "$(fpc_pid_of "etcd-$1")" || { fpc_say "etcd m$1 exited: $(tail -n 3 "$(fpc_log "etcd-$1")" | tr '\n' ' ')"; return 1; }
    [ "$(date +%s)" -lt "$end" ] || { fpc_say "etcd m$1 not healthy within $2 s"; return 1; }
    sleep 0.3
  done
}
# fpc_etcd_up N: a fresh N-member cluster (the bridge must be up: fpc_net_up)
fpc_etcd_up() {
  local i
  command -v etcd > /dev/null || { fpc_say "no etcd (apt-get install etcd-server etcd-client)"; return 1; }
  FPC_ETCD_N=$1
  fpc_etcd_down
  rm -rf "$FPC_ETCD_DIR"
  for i in $(seq 1 "$FPC_ETCD_N"); do fpc_etcd_start "$i" nowait; done   # a member waits for quorum
  for i in $(seq 1 "$FPC_ETCD_N"); do fpc_etcd_wait "$i" 30 || return 1; done
}
# fpc_etcd_kill I: SIGKILL member I
fpc_etcd_kill() { fpc_kill "etcd-$1"; }
fpc_etcd_down() { local i; for i in $(seq 1 9); do fpc_kill "etcd-$i" 2> /dev/null; done; return 0; }
# fpc_etcd_leader: the index of the member that is leader (empty if none answers)
fpc_etcd_leader() {
  local i
  for i in $(seq 1 "$FPC_ETCD_N"); do
    fpc_pid_alive "$(fpc_pid_of "etcd-$i")" || continue
    fpc_etcdctl --endpoints="$(fpc_etcd_client "$i")" endpoint status -w json 2> /dev/null | python3 -c '
import json, sys
for e in json.load(sys.stdin):
    s = e.get("Status", {})   # no "leader" while an election is on
    if s.get("leader") and s.get("header", {}).get("member_id") == s["leader"]:
        print(e["Endpoint"])' 2> /dev/null | grep -x "$(fpc_etcd_client "$i")" > /dev/null && { echo "$i"; return 0; }
  done
  return 1
}

# ---- controller nodes c1..c3: namespace slots 7..9
fpc_cslot() { echo $((6 + $1)); }
fpc_cip() { fpc_ip "$(fpc_cslot "$1")"; }
fpc_cns() { fpc_ns "$(fpc_cslot "$1")"; }
fpc_capi() { echo "$(fpc_cip "$1"):$FPC_API_PORT"; }
# fpc_ctl_toml I N_ENCLOSURES: the TOML of controller c<I>
fpc_ctl_toml() {
  local i=$1 n=$2 e ip; ip=$(fpc_cip "$i")
  cat << EOF2
# generated by tests/cluster/lib.sh
[node]
name = "c$i"
state_dir = "$FPC_DIR/state-c$i"
reactors = ${FPC_CTL_REACTORS:-1}
log = "${FPC_LOG_LEVEL:-info}"

[cluster]
name = "$FPC_CLUSTER"
etcd = [$(fpc_etcd_endpoints | sed 's/[^,]*/"&"/g; s/,/, /g')]
lease_ttl_ms = $FPC_LEASE_MS

[[listener]]
address = "$ip"
port = $FPC_PORT
kind = "io"

[[listener]]
address = "$ip"
port = $FPC_DISC_PORT
kind = "discovery"

$(fpc_api_toml "$ip:$FPC_API_PORT" tls)
EOF2
  for e in $(seq 1 "$n"); do
    printf '\n[[peer]]\nname = "e%s"\naddress = "%s:%s"\n' "$e" "$(fpc_ip "$e")" "$FPC_PORT"
  done
}
# fpc_start_ctl I: start c<I> in its namespace (its TOML must exist)
fpc_start_ctl() { fpc_start_node "c$1" "$(fpc_cip "$1"):$FPC_PORT" "$(fpc_cns "$1")"; }
# fpc_ccli I ARGS...: `flashpool ARGS --api <c<I>'s API>`
fpc_ccli() { local i=$1; shift; timeout 60 "$FPC_BIN" "$@" --api "https://$(fpc_capi "$i")" $(fpc_auth); }
# fpc_get URL: the body of a GET with the run's token (and CA, for https), 3 s timeout
# (python3: works inside a namespace too)
fpc_get() {
  python3 -c 'import sys, ssl, urllib.request
tok = open(sys.argv[2]).read().strip()
ctx = ssl.create_default_context(cafile=sys.argv[3]) if sys.argv[1].startswith("https:") else None
req = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + tok})
sys.stdout.write(urllib.request.urlopen(req, timeout=3, context=ctx).read().decode())' \
    "$1" "$FPC_DIR/api-token" "$FPC_DIR/api-ca.pem" 2> /dev/null
}
# fpc_cluster_json [I]: GET /v1/cluster from c<I>, or from the first controller that answers
fpc_cluster_json() {
  local i
  for i in ${1:-1 2 3}; do
    fpc_pid_alive "$(fpc_pid_of "c$i")" || continue
    fpc_get "https://$(fpc_capi "$i")/v1/cluster" && return 0
  done
  return 1
}
# fpc_owner VOL [I]: "OWNER EPOCH STATE" of VOL as c<I> (or any controller) sees it; "- - -"
fpc_owner() {
  fpc_cluster_json "${2:-}" | python3 -c '
import json, sys
v = [x for x in json.load(sys.stdin)["volumes"] if x["name"] == sys.argv[1]]
o = v[0] if v else {}
print(o.get("owner") or "-", o.get("epoch") if o.get("epoch") is not None else "-", o.get("state") or "-")' "$1" 2> /dev/null \
    || echo "- - -"
}
# fpc_cluster_nodes [I]: the live members' names, one line, sorted
fpc_cluster_nodes() {
  fpc_cluster_json "${1:-}" | python3 -c '
import json, sys
print(" ".join(sorted(n["name"] for n in json.load(sys.stdin)["nodes"])))' 2> /dev/null
}
# fpc_wait_owner VOL SECONDS [NOT]: until VOL has an owner (not NOT) whose state is not
# "unowned"; sets FPC_OWNER, FPC_EPOCH, FPC_VSTATE, FPC_WAITED (s)
fpc_wait_owner() {
  local t0 l; t0=$(date +%s.%N)
  while :; do
    l=$(fpc_owner "$1"); read -r FPC_OWNER FPC_EPOCH FPC_VSTATE <<< "$l"
    FPC_WAITED=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
    if [ "$FPC_OWNER" != - ] && [ "$FPC_OWNER" != "${3:-}" ] && [ "$FPC_VSTATE" != unowned ]; then return 0; fi
    awk -v w="$FPC_WAITED" -v l="$2" 'BEGIN{exit !(w >= l)}' && return 1
    sleep 0.2
  done
}
# fpc_owner_views VOL: "c1=OWNER/EPOCH c2=... " as each live controller sees it
fpc_owner_views() {
  local i l="" o e s
  for i in 1 2 3; do
    fpc_pid_alive "$(fpc_pid_of "c$i")" || continue
    read -r o e s <<< "$(fpc_owner "$1" "$i")"; l="$l c$i=$o/$e"
  done
  echo "${l# }"
}
# fpc_running VOL: the controllers that run VOL (it is in their GET /v1/volumes: assembled,
# owned there), space separated
fpc_running() {
  local i l=""
  for i in 1 2 3; do
    fpc_pid_alive "$(fpc_pid_of "c$i")" || continue
    # A node lists every cluster volume (standby ones too): count those it runs.
    fpc_get "https://$(fpc_capi "$i")/v1/volumes" | python3 -c '
import json, sys
vols = json.load(sys.stdin)
vols = vols.get("volumes", vols) if isinstance(vols, dict) else vols
sys.exit(0 if any(v.get("name") == sys.argv[1] and v.get("state") != "standby" for v in vols) else 1)
' "$1" 2>/dev/null && l="$l c$i"
  done
  echo "${l# }"
}
# fpc_audit_stale N_ENCLOSURES: GET /v1/audit on every running node (controllers on their
# address, enclosures on their namespace's loopback); sets FPC_STALE (the total of
# stale_writes) and FPC_AUDIT ("c1=0 ... e6=0"; "?" where a node did not answer); status 1
# if any did not answer
fpc_audit_stale() {
  local i n v total=0 rc=0 url; FPC_AUDIT=""; FPC_STALE=0
  for n in c1 c2 c3 $(seq 1 "$1" | sed 's/^/e/'); do
    fpc_pid_alive "$(fpc_pid_of "$n")" || continue
    i=${n#?}
    if [ "${n%"$i"}" = c ]; then v=$(fpc_get "https://$(fpc_capi "$i")/v1/audit")
    else v=$(ip netns exec "$(fpc_ns "$i")" bash -c "$(declare -f fpc_get); FPC_DIR='$FPC_DIR' fpc_get http://127.0.0.1:9410/v1/audit"); fi
    v=$(echo "$v" | sed -n 's/.*"stale_writes" *: *\([0-9]*\).*/\1/p')
    if [ -z "$v" ]; then v="?"; rc=1; else total=$((total + v)); fi
    FPC_AUDIT="$FPC_AUDIT $n=$v"
  done
  FPC_AUDIT=${FPC_AUDIT# }; FPC_STALE=$total
  return $rc
}
