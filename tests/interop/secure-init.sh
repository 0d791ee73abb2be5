#!/bin/busybox sh
# tests/interop/secure-init.sh -- PID 1 of the guest of tests/interop/secure.sh (Debian 13:
# kernel 6.12, nvme-cli 2.13, tlshd, keyctl). The host's values for this run (ports, NQNs,
# secrets) are in /etc/secure.env, a small cpio the host appends to the initramfs. Runs the
# Linux-host checks against flashpool (DH-HMAC-CHAP; TLS when TLS=1), then serves this
# kernel's nvmet-tcp to the host's `flashpool bench` until the host is done ("@@HOST
# rev-ready" / "DONE rev-ready"), and powers off. Prints "RESULT <name> PASS|FAIL (detail)".
. /etc/guest-lib.sh     # tests/interop/guest-lib.sh: boot, results, connects, I/O checks
guest_boot
trap finish EXIT
K=$(cat /etc/kver)
. /etc/secure.env
RD_NR=2                 # brd: ram0 for the DH-HMAC-CHAP subsystem, ram1 for the TLS one
# one I/O queue: fewer handshakes. KATO 30 s: under TCG this kernel takes ~8 s for an ffdhe8192
# key pair, between two commands of the transaction, and the target's keep-alive timer runs
CONN_OPTS="--ctrl-loss-tmo=5 --reconnect-delay=1 --nr-io-queues=1 --keep-alive-tmo=30"
log "init start, kernel $(uname -r), cpus $(nproc), target $HOSTIP io:$IO discovery:$DISC, TLS checks: $TLS"
load_modules; net_up
# the dev_dbg lines of the DH-HMAC-CHAP code name the hash and DH group each side picked
mount -t debugfs none /sys/kernel/debug 2> /dev/null
# (only those: the others print key material)
DYNDBG=1
for q in "file drivers/nvme/host/auth.c format selected" "file drivers/nvme/target/fabrics-cmd-auth.c format selected" \
    "file drivers/nvme/target/fabrics-cmd-auth.c format authenticated"; do
  echo "$q +p" > /sys/kernel/debug/dynamic_debug/control 2> /dev/null || DYNDBG=0
done
log "modules loaded, eth0 up, hostnqn $HOSTNQN; $(nvme version | head -n1); dynamic debug of the auth code: $DYNDBG"

# at PORT CMD...: CMD with IO (the target port nvconnect uses) set to PORT
at() { local saved=$IO rc; IO=$1; shift; "$@"; rc=$?; IO=$saved; return $rc; }
# neg CTRL: "HASH GROUP" the kernel host picked on the admin queue of CTRL (its dev_dbg lines
# since the step began; no "selected DH group" line: the NULL group)
neg() {
  local h g
  h=$(dmesg | sed -n "s/.* $1: qid 0: selected hash \([a-z0-9()]*\).*/\1/p" | tail -n1)
  g=$(dmesg | sed -n "s/.* $1: qid 0: selected DH group \([a-z0-9]*\).*/\1/p" | tail -n1)
  echo "${h:-none} ${g:-null}"
}
# psk CTRL: the identity of the PSK the controller's TLS session uses (sysfs tls_key: its serial)
psk() {
  local k; k=$(cat /sys/class/nvme/$1/tls_key 2> /dev/null)
  case $k in ''|*[!0-9a-f]*) echo none; return;; esac
  awk -v k=$k '$1==k{sub(/^([^ ]+ +){8}/, ""); sub(/: [0-9]+$/, ""); print; f=1} END{if (!f) print "key " k}' /proc/keys
}
# ktls: TLS sockets of the kernel (software kTLS, transmit side) open now
ktls() { awk '$1=="TlsCurrTxSw"{print $2}' /proc/net/tls_stat 2> /dev/null; }

# ================================================================ A. DH-HMAC-CHAP: this host -> flashpool
step auth-uni "connect $NQN_A with --dhchap-secret (hh 01)"
auth_ok auth-uni $NQN_A "unidirectional" --dhchap-secret=$AK1
step auth-bidi "connect $NQN_A with --dhchap-secret and --dhchap-ctrl-secret"
auth_ok auth-bidi $NQN_A "bidirectional" --dhchap-secret=$AK1 --dhchap-ctrl-secret=$AKC
# each hash and DH group: the target allows one of each for this host on $NQN_A-HASH-GROUP
i=0
for c in $COMBOS; do
  i=$((i+1)); h=${c%:*}; g=${c#*:}; n=$NQN_A-$h-$g; name=auth-$h-$g
  eval k=\$AKX_$i kc=\$AKCX_$i
  step $name "connect $n (the target allows only $h and $g) with host and controller secrets hh $(echo $k | cut -d: -f2)"
  if nvconnect $n --dhchap-secret=$k --dhchap-ctrl-secret=$kc; then
    set -- $(neg $CTRL); io=DIFFERENT; ok=FAIL
    write_check $DEV 0 1 && io=equal
    [ $io = equal ] && [ $DYNDBG = 1 ] && [ "$1" = "hmac($h)" ] && [ "$2" = "$g" ] && ok=PASS
    res $name $ok "$CTRL: the kernel picked hash $1, DH group $2 (expect hmac($h), $g; dynamic debug $DYNDBG); 1 MiB written, read back $io"
    nvdisconnect $n
  else res $name FAIL "nvme connect failed"; fi
done
step auth-wrong-secret "connect $NQN_A with another host secret: refused"
needs auth-wrong-secret auth-uni && auth_refused auth-wrong-secret $NQN_A --dhchap-secret=$AKW
step auth-no-secret "connect $NQN_A without a secret: refused (require_auth)"
needs auth-no-secret auth-uni && auth_refused auth-no-secret $NQN_A
step auth-wrong-ctrl-secret "connect $NQN_A, right host secret, wrong controller secret: this host refuses the target"
needs auth-wrong-ctrl-secret auth-bidi && auth_refused auth-wrong-ctrl-secret $NQN_A --dhchap-secret=$AK1 --dhchap-ctrl-secret=$AKCW

# ================================================================ C. TLS 1.3 (TP 8011)
# tlshd does the handshakes the kernel hands it over netlink (nvme-tcp as client, nvmet-tcp as
# server); PSKs are looked up in the kernel's .nvme keyring (tlshd.conf: keyrings=.nvme)
tlshd -s -c /etc/tlshd.conf > /tmp/tlshd.log 2>&1 & TLSHD=$!
sleep 0.5
kill -0 $TLSHD 2> /dev/null || { log "tlshd did not start:"; sed 's/^/  tlshd: /' /tmp/tlshd.log; }
# tls_insert HOSTNQN SUBNQN KEY VERSION: the retained/TLS PSK nvme-cli derives from the
# configured PSK KEY, under identity version VERSION (0: "NVMe0R0x H S", 1: "NVMe1R0x H S digest")
tls_insert() {
  t 30 nvme check-tls-key --insert --hostnqn=$1 --subsysnqn=$2 --keydata=$3 --identity=$4 \
    || log "nvme check-tls-key --insert for $1 on $2 (identity $4) failed"
}
# tls_io CHECK NQN PORT WANT_TLS(1|0) [nvme-connect args]: connect, 1 MiB written and read back,
# and the kernel's kTLS socket count says whether the queues are TLS
tls_io() {
  local c=$1 n=$2 p=$3 w=$4 k0 k1 io=DIFFERENT ok=FAIL; shift 4
  k0=$(ktls)
  if at $p nvconnect $n "$@"; then
    k1=$(ktls)
    write_check $DEV 0 1 && io=equal
    isnum "$k0" && isnum "$k1" && [ $io = equal ] \
      && { { [ $w = 1 ] && [ $k1 -gt $k0 ]; } || { [ $w = 0 ] && [ $k1 = $k0 ]; }; } && ok=PASS
    res $c $ok "$CTRL on :$p, kTLS sockets ${k0:-?} -> ${k1:-?} (expect $([ $w = 1 ] && echo more || echo the same)); PSK in use: $(psk $CTRL); 1 MiB written, read back $io"
    nvdisconnect $n
  else res $c FAIL "nvme connect to :$p failed; tlshd: $(tail -n 2 /tmp/tlshd.log 2> /dev/null | tr '\n' ' ')"; fi
}
# tls_refused CHECK NQN PORT [nvme-connect args]: the connect must fail and leave no controller
tls_refused() {
  local c=$1 n=$2 p=$3; shift 3
  REFUSE_LOG="nvme|tls"; at $p auth_refused $c $n "$@"; REFUSE_LOG=""
}
if [ "$TLS" = 1 ]; then
  # T1: only the identity-1 PSK, T2: only the identity-0 one (each identity format used once);
  # with both in the keyring (TW, TO) nvme-cli 2.13 on 6.12 takes the identity-1 one
  tls_insert $HOSTNQN $NQN_T1 $TK1 1; tls_insert $HOSTNQN $NQN_T2 $TK2 0
  for v in 0 1; do tls_insert $HOSTNQN $NQN_TW $TKW_GUEST $v; tls_insert $HOSTNQN $NQN_TO $TKO $v; done
  log "keys in .nvme: $(keyctl show %:.nvme 2> /dev/null | grep -c ' psk ') (identities: $(grep -o 'NVMe[01][RG]0[12] [^:]*' /proc/keys | cut -c1-8 | sort | uniq -c | tr '\n' ' '))"
  step tls-hmac1 "connect --tls to $NQN_T1 on the tls = \"required\" listener :$TLS_IO (PSK hmac 1, identity NVMe1R01)"
  tls_io tls-hmac1 $NQN_T1 $TLS_IO 1 --tls
  step tls-hmac2 "connect --tls to $NQN_T2 on :$TLS_IO (PSK hmac 2, 48 bytes, identity NVMe0R02)"
  tls_io tls-hmac2 $NQN_T2 $TLS_IO 1 --tls
  step tls-optional-tls "connect --tls to $NQN_TO on the tls = \"optional\" listener :$TLS_OPT"
  tls_io tls-optional-tls $NQN_TO $TLS_OPT 1 --tls
  step tls-optional-plain "connect without --tls to $NQN_TP (no PSK for this host) on :$TLS_OPT"
  tls_io tls-optional-plain $NQN_TP $TLS_OPT 0
  step tls-wrong-key "connect --tls to $NQN_TW with a PSK the target does not have: refused"
  needs tls-wrong-key tls-hmac1 && tls_refused tls-wrong-key $NQN_TW $TLS_IO --tls
  step tls-plain-refused "connect without --tls to the tls = \"required\" listener :$TLS_IO: refused"
  needs tls-plain-refused tls-optional-plain && tls_refused tls-plain-refused $NQN_TP $TLS_IO
  step tls-require-tls "connect without --tls to $NQN_T1 (require_tls = true) on the plain listener :$IO: refused"
  needs tls-require-tls tls-hmac1 && tls_refused tls-require-tls $NQN_T1 $IO
  step tls-discover "nvme discover on :$DISC: the TLS listeners' entries carry treq and sectype"
  timeout 60 nvme discover -t tcp -a $HOSTIP -s $DISC > /tmp/disc.txt 2>&1; rc=$?
  sed 's/^/  | /' /tmp/disc.txt
  # one line per entry: "PORT TREQ SECTYPE", TREQ without the flags after its comma, "_" for blanks
  awk '/^=====Discovery Log Entry/{if (p != "") print p, q, s; p=""; q=""; s=""}
       $1=="trsvcid:"{p=$2} $1=="sectype:"{s=$2}
       $1=="treq:"{q=$0; sub(/^treq: */, "", q); sub(/,.*/, "", q); gsub(/ /, "_", q)}
       END{if (p != "") print p, q, s}' /tmp/disc.txt > /tmp/disc.ent
  req=$(awk -v p=$TLS_IO '$1==p{print $2 "/" $3}' /tmp/disc.ent | sort -u | tr '\n' ' ')
  opt=$(awk -v p=$TLS_OPT '$1==p{print $2 "/" $3}' /tmp/disc.ent | sort -u | tr '\n' ' ')
  pln=$(awk -v p=$IO '$1==p{print $3}' /tmp/disc.ent | sort -u | tr '\n' ' ')
  ok=FAIL
  [ $rc = 0 ] && [ "$req" = "required/tls13 " ] && [ "$opt" = "not_required/tls13 " ] && [ "$pln" = "none " ] && ok=PASS
  res tls-discover $ok "exit $rc; :$TLS_IO treq/sectype ${req:-none}(expect required/tls13), :$TLS_OPT ${opt:-none}(expect not_required/tls13), :$IO sectype ${pln:-none}(expect none)"
fi

# ================================================================ B. flashpool bench -> this kernel's nvmet
# DH-HMAC-CHAP: $NQN_RG (ram0) on :4420 allows hosts RH_NQN_1.. with their secret, controller
# secret, hash and group in configfs (nvmet picks exactly those); TLS: $NQN_RT (ram1) on :4421
# with addr_tsas tls1.3, addr_treq required, the host's PSK in .nvme
CFS=/sys/kernel/config/nvmet
nvmet_port() {  # ID PORT
  local P=$CFS/ports/$1
  mkdir $P && echo tcp > $P/addr_trtype && echo ipv4 > $P/addr_adrfam && echo 0.0.0.0 > $P/addr_traddr \
    && echo $2 > $P/addr_trsvcid || log "configfs: port $1 (:$2) failed"
}
nvmet_ns() {  # NQN DEVICE ALLOW_ANY_HOST PORT_ID
  local S=$CFS/subsystems/$1
  mkdir $S && echo $3 > $S/attr_allow_any_host && mkdir $S/namespaces/1 && echo -n $2 > $S/namespaces/1/device_path \
    && echo 1 > $S/namespaces/1/enable && ln -s $S $CFS/ports/$4/subsystems/$1 || log "configfs: $1 on port $4 failed"
}
step rev-target "kernel nvmet-tcp: $NQN_RG (DH-HMAC-CHAP hosts) on :4420$([ "$TLS" = 1 ] && echo ", $NQN_RT (TLS) on :4421")"
nvmet_port 1 4420
i=0
for hn in $RH_NQNS; do
  i=$((i+1)); H=$CFS/hosts/$hn
  eval k=\$RH_KEY_$i kc=\$RH_CKEY_$i hh=\$RH_HASH_$i hg=\$RH_GROUP_$i
  mkdir $H && echo -n $k > $H/dhchap_key && echo -n "hmac($hh)" > $H/dhchap_hash && echo -n $hg > $H/dhchap_dhgroup \
    || log "configfs: host $hn failed"
  [ -n "$kc" ] && { echo -n $kc > $H/dhchap_ctrl_key || log "configfs: $hn dhchap_ctrl_key failed"; }
  log "nvmet host $hn: hash $(cat $H/dhchap_hash), group $(cat $H/dhchap_dhgroup), controller secret $([ -n "$kc" ] && echo yes || echo no)"
done
nvmet_ns $NQN_RG /dev/ram0 0 1
for hn in $RH_NQNS; do ln -s $CFS/hosts/$hn $CFS/subsystems/$NQN_RG/allowed_hosts/$hn; done
nvmet_port 2 4421
P=$CFS/ports/2
echo tls1.3 > $P/addr_tsas && echo required > $P/addr_treq || log "configfs: TLS on port 2 failed"
log "nvmet port 2: tsas $(cat $P/addr_tsas 2> /dev/null), treq $(cat $P/addr_treq 2> /dev/null)"
nvmet_ns $NQN_RT /dev/ram1 1 2
[ "$TLS" = 1 ] && for v in 0 1; do tls_insert $RT_HOSTNQN $NQN_RT $TKR $v; done
# the TLS machinery of this guest alone (kernel, tlshd, keyring, nvme-cli): its own host to its
# own nvmet port 2 -- what the TLS checks against flashpool stand on
step tls-guest-loopback "this host -> its own nvmet $NQN_RT on 127.0.0.1:4421 (tls1.3, required) with nvme connect --tls"
tls_insert $HOSTNQN $NQN_RT $TKL 0
HOSTIP_SAVED=$HOSTIP; HOSTIP=127.0.0.1
tls_io tls-guest-loopback $NQN_RT 4421 1 --tls
HOSTIP=$HOSTIP_SAVED
wait_host rev-ready $REV_WAIT
step rev-done "kernel log while the host's flashpool bench used the target"
{ cat /tmp/dmesg.all; dmesg; } | awk '/^== step /{s=$3; next} s=="rev-target" || s=="tls-guest-loopback"' \
  | grep -E 'nvmet|nvme|tls' | grep -vE '[0-9a-f]{2} [0-9a-f]{2} [0-9a-f]{2} [0-9a-f]{2}' | tail -n 60 | sed 's/^/  dmesg: /'
echo "  tlshd log (tail):"; tail -n 20 /tmp/tlshd.log | sed 's/^/  tlshd: /'
log "guest checks: $NPASS passed, $NFAIL failed"
