#!/usr/bin/env bash
# Sets up everything the tests need on a fresh Debian 12 machine (apt packages,
# the Debian kernel for the QEMU guest, the nightly toolchain and cargo-fuzz)
# and runs every suite: formatting and lints, unit and fault tests, a fuzz
# smoke run, and the interop suites against the Linux kernel's NVMe/TCP host
# and target (Debian 12's kernel; Debian 13's for authentication and TLS).
# Ends with one line: "N passed, N failed".
#
#   scripts/test-all.sh             # everything
#   SKIP_INTEROP=1 scripts/test-all.sh
#   SKIP_CLUSTER=1 scripts/test-all.sh   (no network namespaces: also CLUSTER=0 for interop,
#                                         and no failover suite)
#   SKIP_FAILOVER=1 scripts/test-all.sh  (no tests/failover/run.sh, on either guest kernel)
#   SKIP_METRICS=1 scripts/test-all.sh   (no tests/metrics/run.sh)
#   SKIP_ATTACH=1 scripts/test-all.sh    (no tests/attach/run.sh nor tests/attach/apps.sh: FUSE and
#                                         loop devices, root)
#   SKIP_SECURE=1 scripts/test-all.sh    (no tests/interop/secure.sh: DH-HMAC-CHAP and TLS
#                                         against Debian 13's kernel)
#   FUZZ_SECONDS=20 scripts/test-all.sh
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
LOG=${TEST_LOG_DIR:-$ROOT/target/test-logs}
mkdir -p "$LOG"
passed=0
failed=0
failures=()

say() { echo "== [$(date +%T)] $*"; }
pass() { passed=$((passed + ${2:-1})); say "PASS $1"; }
fail() { failed=$((failed + ${2:-1})); failures+=("$1"); say "FAIL $1"; }
# count_suite NAME LOG: adds a suite's closing "N passed, N failed" line to the totals
count_suite() {
  local line p f
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$2" | tail -n 1)
  if [ -z "$line" ]; then fail "$1 did not complete (see $2)"; return; fi
  p=${line%% passed*}; f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed/\1/')
  passed=$((passed + p))
  if [ "$f" -gt 0 ]; then fail "$1: $f check(s)" "$f"; fi
}

# ---- set-up: toolchains and packages
export DEBIAN_FRONTEND=noninteractive
if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust (https://rustup.rs) first"; exit 2
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  say "apt-get install (test dependencies)"
  # Quiet on success; a failed update or install shows apt's own error (logs in $LOG).
  scripts/apt-install.sh "$LOG" qemu-system-x86 nvme-cli busybox-static cpio kmod fio libisal-dev \
    python3 fonts-dejavu-core iproute2 etcd-server etcd-client protobuf-compiler prometheus xz-utils \
    fuse3 e2fsprogs rocksdb-tools ||
    say "apt-get install failed (above); continuing with what is installed"
fi

# ---- 1. formatting and lints
say "cargo fmt --check"
if cargo fmt --all -- --check >"$LOG/fmt.txt" 2>&1; then pass "cargo fmt"; else fail "cargo fmt (see $LOG/fmt.txt)"; fi
say "cargo clippy -D warnings"
if cargo clippy --workspace --all-targets -- -D warnings >"$LOG/clippy.txt" 2>&1; then
  pass "cargo clippy"
else
  tail -n 30 "$LOG/clippy.txt"; fail "cargo clippy (see $LOG/clippy.txt)"
fi

say "scripts/mod-loops.py (no import loop between the modules of a crate)"
if python3 scripts/mod-loops.py >"$LOG/mod-loops.txt" 2>&1; then
  pass "no import loops"
else
  cat "$LOG/mod-loops.txt"; fail "import loops (see $LOG/mod-loops.txt)"
fi

say "scripts/apt-install.test.sh"
if scripts/apt-install.test.sh >"$LOG/apt-install-test.txt" 2>&1; then
  pass "apt-install.sh (fake apt-get)"
else
  cat "$LOG/apt-install-test.txt"; fail "apt-install.sh (see $LOG/apt-install-test.txt)"
fi

# ---- 2. unit, property and raw-TCP fault tests
say "cargo build --release"
if ! cargo build --release --workspace >"$LOG/build.txt" 2>&1; then
  tail -n 30 "$LOG/build.txt"; fail "cargo build --release"
fi
say "cargo test (unit + fault tests)"
cargo test --release --workspace --no-fail-fast 2>&1 | tee "$LOG/cargo-test.txt" | grep -E '^test result|FAILED|panicked' || true
t_pass=$(awk '/^test result/ { for (i = 1; i < NF; i++) if ($(i+1) ~ /^passed/) s += $i } END { print s + 0 }' "$LOG/cargo-test.txt")
t_fail=$(awk '/^test result/ { for (i = 1; i < NF; i++) if ($(i+1) ~ /^failed/) s += $i } END { print s + 0 }' "$LOG/cargo-test.txt")
# a build error stops it; "error: N target(s) failed" only sums up failed tests
if ! grep -q '^test result' "$LOG/cargo-test.txt" ||
  grep -E '^error(\[|:)' "$LOG/cargo-test.txt" | grep -qvE '^error: [0-9]+ targets? failed'; then
  fail "cargo test did not run (see $LOG/cargo-test.txt)"
fi
passed=$((passed + ${t_pass:-0}))
if [ "${t_fail:-0}" -gt 0 ]; then fail "cargo test: $t_fail test(s)" "$t_fail"; else say "cargo test: $t_pass passed"; fi

# ---- 3. fuzz smoke run
if [ -x fuzz/smoke.sh ] && [ "${SKIP_FUZZ:-0}" != 1 ]; then
  say "fuzz smoke (${FUZZ_SECONDS:-20} s per target)"
  if FUZZ_SECONDS=${FUZZ_SECONDS:-20} fuzz/smoke.sh 2>&1 | tee "$LOG/fuzz.txt" | grep -vE '^#[0-9]+' | tail -n 20; then
    pass "fuzz smoke"
  else
    fail "fuzz smoke (see $LOG/fuzz.txt)"
  fi
fi

# ---- 3b. metrics: GET /metrics of a node on 127.0.0.1 (ports 4620, 4621, 4690) under
# bench I/O, checked by promtool (Debian's prometheus package) and for the counters that moved
if [ "${SKIP_METRICS:-0}" != 1 ]; then
  say "metrics suite (Prometheus endpoint, promtool check metrics)"
  tests/metrics/run.sh 2>&1 | tee "$LOG/metrics.txt" | grep -E '^FAIL|passed, .* failed' || true
  count_suite metrics "$LOG/metrics.txt"
fi

# ---- 3c. attach: `flashpool attach` (FUSE) of a node's namespace on 127.0.0.1 (port 4640): O_DIRECT
# pattern, loop device + mkfs.ext4 + e2fsck, unmount by SIGTERM and fusermount3 -u (root: FUSE, loop)
if [ "${SKIP_ATTACH:-0}" != 1 ] && [ "$(id -u)" = 0 ]; then
  say "attach suite (FUSE file over NVMe/TCP, loop device, ext4)"
  tests/attach/run.sh 2>&1 | tee "$LOG/attach.txt" | grep -E '^FAIL|passed, .* failed' || true
  count_suite attach "$LOG/attach.txt"
  # an application on it (~1 min): RocksDB db_bench 80/20 for 10 s on ext4 over a local file
  # and over `flashpool attach` tcp://, then ldb checkconsistency (docs/bench/apps.sh CHECK=1)
  say "attach apps (RocksDB db_bench on ext4 over attach, small)"
  tests/attach/apps.sh 2>&1 | tee "$LOG/attach-apps.txt" | grep -E '^FAIL|passed, .* failed' || true
  count_suite "attach apps" "$LOG/attach-apps.txt"
fi

# ---- 4. interop: the Linux kernel NVMe/TCP host in a QEMU guest against flashpool serve
if [ "${SKIP_INTEROP:-0}" != 1 ]; then
  say "interop suite (QEMU guest, Linux nvme-tcp host)"
  [ "${SKIP_CLUSTER:-0}" = 1 ] && export CLUSTER=0
  tests/interop/run.sh all 2>&1 | tee "$LOG/interop.txt" | grep -E 'RESULT|passed, .* failed|harness' || true
  count_suite interop "$LOG/interop.txt"
fi

# ---- 4b. secure: DH-HMAC-CHAP and NVMe/TCP TLS both ways against Debian 13's kernel (6.12,
# nvme-cli 2.13, tlshd) in a guest of its own; its TLS checks SKIP while flashpool has no TLS
if [ "${SKIP_SECURE:-0}" != 1 ]; then
  say "secure suite (QEMU guest on Debian 13's kernel: DH-HMAC-CHAP, TLS)"
  tests/interop/secure.sh all 2>&1 | tee "$LOG/secure.txt" | grep -E 'RESULT|SKIP|passed, .* failed' || true
  count_suite secure "$LOG/secure.txt"
fi

# ---- 5. cluster harness: enclosure nodes in network namespaces (root); the cluster scenario
# itself (fio in the guest while nodes are killed and links cut) is the interop suite's
# cluster phase above
if [ "${SKIP_CLUSTER:-0}" != 1 ] && [ "$(id -u)" = 0 ]; then
  say "cluster plumbing (network namespaces, kill/restart, link down, loss)"
  tests/cluster/run.sh plumbing 2>&1 | tee "$LOG/cluster.txt" | grep -E 'RESULT|passed, .* failed|cannot' || true
  count_suite "cluster plumbing" "$LOG/cluster.txt"
  # encryption at rest (~10 s): a canary written through an encrypted raid5 thin pool on
  # three enclosures is in none of their drive files (an unencrypted control's files hold
  # it), their blocks have the entropy of ciphertext, and it reads back after a restart
  say "cluster at rest (encrypted thin pool on enclosures: canary search, entropy)"
  tests/cluster/run.sh atrest 2>&1 | tee "$LOG/cluster-atrest.txt" | grep -E 'RESULT|passed, .* failed|cannot' || true
  count_suite "cluster atrest" "$LOG/cluster-atrest.txt"
  # the rack-scale bench, small (etcd, 3 controllers, 4 volumes; ~1.5 min): every volume
  # served by a survivor after kill -9, drain and SIGSTOP, 0 stale writes, 0 verify errors
  say "cluster scale, small (docs/bench/cluster-scale.sh CHECK=1)"
  tests/cluster/run.sh scale 2>&1 | tee "$LOG/cluster-scale.txt" | grep -E 'RESULT|passed, .* failed|cannot' || true
  count_suite "cluster scale" "$LOG/cluster-scale.txt"
  # `flashpool attach` on a cluster subsystem (~20 s): ANA multipath through a kill -9 of the
  # owner and a volume move back (etcd, 3 enclosures, 2 controllers; its own net 10.94.0.0/24)
  if [ "${SKIP_ATTACH:-0}" != 1 ]; then
    say "attach failover (FUSE file on a cluster volume: kill -9 of the owner, then a move)"
    tests/attach/failover.sh 2>&1 | tee "$LOG/attach-failover.txt" | grep -E '^FAIL|passed, .* failed' || true
    count_suite "attach failover" "$LOG/attach-failover.txt"
  fi
fi

# ---- 6. cluster failover: etcd, three controller nodes in cluster mode, the Linux kernel
# host with native multipath in the QEMU guest; fio verify while owners are moved, killed,
# frozen and cut, the etcd leader is killed, an enclosure is cut while the owner is killed,
# and the owner is cut from an enclosure and etcd (tests/failover/README.md); Debian 12's
# kernel (6.1), then Debian 13's (6.12)
if [ "${SKIP_CLUSTER:-0}" != 1 ] && [ "${SKIP_FAILOVER:-0}" != 1 ] && [ "$(id -u)" = 0 ]; then
  say "cluster failover suite (etcd, 3 controller nodes, QEMU guest on native multipath)"
  tests/failover/run.sh all 2>&1 | tee "$LOG/failover.txt" | grep -E 'RESULT|passed, .* failed|cannot' || true
  count_suite "cluster failover" "$LOG/failover.txt"
  # the same cases against Debian 13's kernel (6.12; the secure suite's cached kernel), whose
  # nvme-tcp lets go of a silent path after one keep-alive timeout (docs/cluster.md)
  say "cluster failover suite on Debian 13's kernel (GUEST_SUITE=trixie)"
  GUEST_SUITE=trixie tests/failover/run.sh all 2>&1 | tee "$LOG/failover-trixie.txt" | grep -E 'RESULT|passed, .* failed|cannot' || true
  count_suite "cluster failover (6.12 host)" "$LOG/failover-trixie.txt"
fi

echo
if [ ${#failures[@]} -gt 0 ]; then
  # the failed checks themselves, last, where a reader of the output's tail sees them (a
  # guest's own "[guest] RESULT" lines are left out: the suite's final RESULT judges them)
  grep -hE '(^RESULT [^ ]+ FAIL|^FAIL |^test .* FAILED|panicked at)' "$LOG"/*.txt 2> /dev/null | cut -c1-400 | tail -n 40
  printf 'failed: %s\n' "${failures[@]}"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
