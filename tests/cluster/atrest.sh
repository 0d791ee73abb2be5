# shellcheck shell=bash
# tests/cluster/atrest.sh -- `tests/cluster/run.sh atrest`: encryption at rest seen from
# the enclosures. Sourced by run.sh (after lib.sh and tests/lib/harness.sh: fpc_*, hres).
#
# Six enclosures e1..e6 with one file drive d0 each; the owner (root namespace) makes
#   sec: an ENCRYPTED raid5 thin pool on e1..e3 d0, thin volume sec-v exported as nsid 1
#   pln: the same NOT encrypted on e4..e6 d0 (the control),   thin volume pln-v as nsid 2
# ($ATREST_COMPRESS, e.g. "--compression lz4", is added to both pool creates when set).
# A plaintext canary (8 MiB of one 64-byte ASCII line with a per-run random token) is
# written to both thin volumes through `flashpool attach` (O_DIRECT dd) and read back
# (cmp); then the owner and the enclosures stop cleanly and the drive image files are
# searched on the host: the token must be in no file of e1..e3 and in every file of
# e4..e6 (so the search can see plaintext), and the byte entropy of the non-zero 4 KiB
# blocks of e1..e3 must be that of ciphertext (> 7.9 bits/byte), over at least as many
# blocks as the control's (the data did reach them; the control's entropy is printed).
# Last, every node starts again on the same files and both canaries read back equal: the
# ciphertext on the enclosures is the data, decrypted by the owner with its KEK.

ATREST_SIZE=${ATREST_SIZE:-8}           # MiB of canary per volume
ATREST_COMPRESS=${ATREST_COMPRESS:-}    # extra `volume create --thin-pool` flags
# (ATREST_DRIVE: the size of each enclosure's file drive, default 64MiB)

# atrest_attach URL DIR LOG: `flashpool attach --single-path URL DIR` in the background
# (pid in ATREST_APID); 0 once DIR/disk is there
# atrest_why FILE: a CLI's error line from FILE (else its last two lines), on one line
atrest_why() { { grep -m1 -i 'error' "$1" || tail -n 2 "$1"; } | tr '\n' ' '; }

ATREST_APID=""
atrest_attach() {
  local i
  mkdir -p "$2"
  "$FPC_BIN" attach --single-path "$1" "$2" > "$3" 2>&1 &
  ATREST_APID=$!
  for i in $(seq 1 150); do
    grep -qs " $2 " /proc/self/mountinfo && [ -f "$2/disk" ] && return 0
    kill -0 "$ATREST_APID" 2> /dev/null || return 1
    sleep 0.1
  done
  return 1
}
# atrest_detach DIR: SIGTERM the attach (it unmounts), then make sure DIR is no mount
atrest_detach() {
  if [ -n "$ATREST_APID" ]; then
    kill -TERM "$ATREST_APID" 2> /dev/null; wait "$ATREST_APID" 2> /dev/null
    ATREST_APID=""
  fi
  if grep -qs " $1 " /proc/self/mountinfo; then
    fusermount3 -u "$1" 2> /dev/null || umount -l "$1" 2> /dev/null
  fi
  ! grep -qs " $1 " /proc/self/mountinfo
}

# atrest_scan TOKEN FILE...: one line per file "FILE COUNT BLOCKS ENTROPY" (how often
# TOKEN is in the file; how many of its 4 KiB blocks are not all zero; the Shannon entropy
# in bits/byte of the bytes of those blocks), then "all - BLOCKS ENTROPY" for the files
# together
atrest_scan() {
  python3 - "$@" << 'EOF'
import collections, math, sys
def entropy(hist):
    n = sum(hist.values())
    return -sum(c / n * math.log2(c / n) for c in hist.values()) if n else 0.0
tok = sys.argv[1].encode()
zero = bytes(4096)
total, total_nz = collections.Counter(), 0
for path in sys.argv[2:]:
    data = open(path, "rb").read()
    blocks = [data[o:o + 4096] for o in range(0, len(data), 4096)]
    nonzero = b"".join(b for b in blocks if b != zero[:len(b)])
    hist = collections.Counter(nonzero)
    total.update(hist)
    total_nz += len(nonzero) // 4096
    print(path, data.count(tok), len(nonzero) // 4096, "%.4f" % entropy(hist))
print("all", "-", total_nz, "%.4f" % entropy(total))
EOF
}

# atrest_canary URL TAG [write]: attach URL, (write $ATREST_RUN/canary at 4 MiB with
# O_DIRECT dd,) read it back with O_DIRECT and compare; detach. Sets ATREST_WHY.
atrest_canary() {
  local url=$1 tag=$2 mnt=$ATREST_RUN/mnt rc=1
  ATREST_WHY=""
  if ! atrest_attach "$url" "$mnt" "$ATREST_RUN/attach-$tag.log"; then
    ATREST_WHY="attach $url: $(tail -n 2 "$ATREST_RUN/attach-$tag.log" | tr '\n' ' ')"
  elif [ "${3:-}" = write ] && ! dd if="$ATREST_RUN/canary" of="$mnt/disk" bs=1M seek=4 oflag=direct \
      conv=notrunc,fsync status=none 2> "$ATREST_RUN/dd-$tag.txt"; then
    ATREST_WHY="dd oflag=direct: $(tail -n 1 "$ATREST_RUN/dd-$tag.txt")"
  elif ! dd if="$mnt/disk" bs=1M skip=4 count="$ATREST_SIZE" iflag=direct status=none 2> "$ATREST_RUN/dd-$tag.txt" \
      | cmp - "$ATREST_RUN/canary" > "$ATREST_RUN/cmp-$tag.txt" 2>&1; then
    ATREST_WHY="read back differs: $(head -n 1 "$ATREST_RUN/cmp-$tag.txt") $(tail -n 1 "$ATREST_RUN/dd-$tag.txt")"
  else rc=0; fi
  atrest_detach "$mnt" || { rc=1; ATREST_WHY="$ATREST_WHY; $mnt still mounted after the attach ended"; }
  return $rc
}

do_atrest() {
  local io disc api nqn=nqn.2026-01.io.flashpool:atrest i ok d t0 tok line run vol pool nsid
  local drives="${ATREST_DRIVE:-64MiB}"
  assign_ports OWNER_IO=14530 OWNER_DISC=18119 OWNER_API=19520
  io=$OWNER_IO; disc=$OWNER_DISC; api=$OWNER_API
  run=$FPC_DIR/atrest; ATREST_RUN=$run
  rm -rf "$run"; mkdir -p "$run"
  fpc_say "atrest: 6 enclosures, owner io :$io api :$api, state in $FPC_DIR${ATREST_COMPRESS:+, pools with $ATREST_COMPRESS}"
  t0=$(date +%s.%N)

  # ---- set-up: enclosures with one file drive each, the owner, the two pools
  ok=FAIL; d=""
  FPC_N=6
  if ! fpc_net_up "$FPC_N"; then d="network set-up failed"
  else
    rm -f "$FPC_DIR"/e*-d*.img; rm -rf "$FPC_DIR"/state-*
    for i in $(seq 1 "$FPC_N"); do
      fpc_enclosure_toml "$i" "d0:file:$drives" > "$FPC_DIR/e$i.toml"
      fpc_start_enclosure "$i" || { d="enclosure e$i did not start (see $(fpc_log "e$i"))"; break; }
    done
  fi
  if [ -z "$d" ]; then
    fpc_owner_toml owner "$io" "$disc" "$api" "$nqn" "$FPC_N" > "$FPC_DIR/owner.toml"
    fpc_start_node owner "127.0.0.1:$io" || d="the owner did not start (see $(fpc_log owner))"
  fi
  # POOL MEMBERS NSID [--encrypt]
  local spec members flag
  for spec in "sec e1:d0,e2:d0,e3:d0 1 --encrypt" "pln e4:d0,e5:d0,e6:d0 2"; do
    [ -z "$d" ] || break
    read -r pool members nsid flag <<< "$spec"
    # shellcheck disable=SC2086   # flag, ATREST_COMPRESS: words, or none
    if ! fpc_cli "$api" volume create "$pool" --layout raid5 --drives "$members" --thin-pool $flag \
        $ATREST_COMPRESS > "$run/create-$pool.txt" 2>&1; then
      d="volume create $pool --layout raid5 --drives $members --thin-pool $flag $ATREST_COMPRESS: $(atrest_why "$run/create-$pool.txt")"
    elif ! fpc_cli "$api" volume create "$pool-v" --pool "$pool" --size 32MiB --export "$nqn" --nsid "$nsid" \
        > "$run/create-$pool-v.txt" 2>&1; then
      d="volume create $pool-v --pool $pool --size 32MiB --export $nqn --nsid $nsid: $(atrest_why "$run/create-$pool-v.txt")"
    fi
  done
  if [ -z "$d" ]; then
    # what the owner says: encrypted for sec and sec-v, not for pln and pln-v
    local enc=""
    for vol in sec sec-v pln pln-v; do
      # shellcheck disable=SC2046   # fpc_auth: words
      enc="$enc $vol=$(timeout 10 "$FPC_BIN" volume show "$vol" --json --api "127.0.0.1:$api" $(fpc_auth) 2> /dev/null \
        | python3 -c 'import json, sys; print(json.load(sys.stdin).get("encrypted", False))' 2> /dev/null || echo '?')"
    done
    if [ "$enc" = " sec=True sec-v=True pln=False pln-v=False" ]; then
      ok=PASS
      d="raid5 thin pools sec (--encrypt) on e1..e3 d0 and pln on e4..e6 d0 ($drives file drives)${ATREST_COMPRESS:+ with $ATREST_COMPRESS}, thin volumes of 32 MiB exported as nsid 1 and 2, in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s; encrypted:$enc"
    else d="the owner's encrypted flags are not as asked:$enc"; fi
  fi
  fpc_result atrest-up $ok "$d"
  if [ $ok != PASS ]; then
    for i in canary-sec canary-pln stop drives-sec drives-pln entropy reread; do fpc_result "atrest-$i" FAIL "no set-up"; done
    return
  fi

  # ---- the canary: one 64-byte line, repeated, with a token new to this run
  tok="FLASHPOOL-AT-REST-CANARY-$(python3 -c 'import secrets; print(secrets.token_hex(8))')"
  line=$(printf '%-63s' "$tok-plaintext-must-not-reach-a-drive" | cut -c1-63)
  python3 -c 'import sys; sys.stdout.write((sys.argv[1] + "\n") * (int(sys.argv[2]) << 20 >> 6))' \
    "$line" "$ATREST_SIZE" > "$run/canary"
  for vol in sec:1 pln:2; do
    pool=${vol%:*}; nsid=${vol#*:}
    if atrest_canary "tcp://127.0.0.1:$io/$nqn?nsid=$nsid" "$pool" write; then
      fpc_result "atrest-canary-$pool" PASS "$ATREST_SIZE MiB of '${line:0:40}...' x $((ATREST_SIZE << 14)) written (dd oflag=direct) through flashpool attach of nsid $nsid at 4 MiB and read back equal (cmp)"
    else fpc_result "atrest-canary-$pool" FAIL "$ATREST_WHY"; fi
  done

  # ---- durable on the enclosures: the owner stops cleanly (SIGTERM), then the enclosures
  ok=PASS; d=""
  if fpc_stop owner && tail -n 5 "$(fpc_log owner)" | grep -q 'stopped cleanly'; then d="owner stopped cleanly;"
  else ok=FAIL; d="owner did not stop cleanly (SIGTERM): $(tail -n 2 "$(fpc_log owner)" | tr '\n' ' ');"; fi
  for i in $(seq 1 "$FPC_N"); do fpc_stop "e$i" || { ok=FAIL; d="$d e$i hung on SIGTERM;"; }; done
  fpc_result atrest-stop $ok "$d then e1..e6 (SIGTERM)"

  # ---- the drive files, on the host
  atrest_scan "$tok" "$FPC_DIR"/e[1-3]-d0.img > "$run/scan-sec.txt" 2> "$run/scan-err.txt"
  atrest_scan "$tok" "$FPC_DIR"/e[4-6]-d0.img > "$run/scan-pln.txt" 2>> "$run/scan-err.txt"
  [ -s "$run/scan-err.txt" ] && fpc_say "scan: $(tail -n 2 "$run/scan-err.txt" | tr '\n' ' ')"
  sed "s|^$FPC_DIR/||; s/^/    /" "$run/scan-sec.txt" "$run/scan-pln.txt"
  local grp c nz h nz2 h2 counts hs hsec="" hpln=""
  for grp in sec:1:3 pln:4:6; do
    ok=PASS; counts=""; hs=""
    for i in $(seq "$(echo $grp | cut -d: -f2)" "$(echo $grp | cut -d: -f3)"); do
      read -r _ c nz h <<< "$(grep "/e$i-d0.img " "$run/scan-${grp%%:*}.txt")"
      if [ "${grp%%:*}" = sec ]; then [ "${c:-x}" = 0 ] || ok=FAIL
      else [ "${c:-0}" -gt 0 ] 2> /dev/null || ok=FAIL; fi
      counts="$counts e$i:d0=${c:-?}"; hs="$hs e$i:d0=${h:-?}/${nz:-?}"
    done
    if [ "${grp%%:*}" = sec ]; then
      hsec=$hs
      fpc_result atrest-drives-sec $ok "canary token in the encrypted pool's drive files (expect 0 in each):$counts"
    else
      hpln=$hs
      fpc_result atrest-drives-pln $ok "canary token in the control's drive files (expect > 0 in each: the search sees plaintext):$counts"
    fi
  done
  # e1..e3 together: ciphertext (and its parity) must look random
  read -r _ c nz h < <(grep '^all ' "$run/scan-sec.txt")
  read -r _ c nz2 h2 < <(grep '^all ' "$run/scan-pln.txt")
  # (as many blocks as the control's at least: the same data went there, so a pass is not
  # an encrypted pool whose drives never got the canary; with compression both hold less)
  ok=FAIL
  awk -v h="${h:-0}" 'BEGIN{exit !(h > 7.9)}' && [ "${nz:-0}" -ge "${nz2:-1}" ] && [ "${nz2:-0}" -ge 1 ] && ok=PASS
  fpc_result atrest-entropy $ok "Shannon entropy of the non-zero 4 KiB blocks of e1..e3 d0 together: ${h:-?} bits/byte over ${nz:-?} blocks (expect > 7.9, over at least the control's blocks); the control's (e4..e6): ${h2:-?} over ${nz2:-?}; per drive (bits/blocks): sec$hsec, pln$hpln"

  # ---- the ciphertext on the drives decrypts to the canary: every node restarted on the
  # same drive files (the owner with the same KEK, in its state_dir), read back once more
  ok=PASS; d=""
  for i in $(seq 1 "$FPC_N"); do fpc_start_enclosure "$i" || { ok=FAIL; d="$d e$i did not start again;"; }; done
  if [ $ok = PASS ] && ! fpc_start_node owner "127.0.0.1:$io"; then ok=FAIL; d="the owner did not start again;"; fi
  if [ $ok = PASS ]; then
    for pool in sec pln; do
      fpc_wait_optimal "$api" "$pool" 30 || { ok=FAIL; d="$d $pool not optimal after a restart ($FPC_SEEN);"; }
    done
  fi
  if [ $ok = PASS ]; then
    for vol in sec:1 pln:2; do
      pool=${vol%:*}; nsid=${vol#*:}
      if atrest_canary "tcp://127.0.0.1:$io/$nqn?nsid=$nsid" "$pool-again"; then d="$d $pool-v (nsid $nsid) read back equal;"
      else ok=FAIL; d="$d $pool-v (nsid $nsid): $ATREST_WHY;"; fi
    done
  fi
  fpc_result atrest-reread $ok "owner and e1..e6 restarted on the same drive files:$d"
  fpc_cleanup
}
