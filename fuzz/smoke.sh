#!/usr/bin/env bash
# fuzz/smoke.sh -- a short run of every cargo-fuzz target, for CI and by hand.
#
#   fuzz/smoke.sh [SECONDS]          # default: $FUZZ_SECONDS or 20 s per target
#   FUZZ_TARGETS="pdu_decode" fuzz/smoke.sh 60
#
# Installs cargo-fuzz when it is missing (from crates.io) and uses the nightly
# toolchain (rustup). Each target starts from its checked-in seeds
# (fuzz/seeds/<target>/, copied to a scratch corpus so the seeds stay as they
# are) and first replays fuzz/regressions/<target>/ if there is anything there.
# Prints the executions per target. Exits non-zero if a target crashed, hung,
# or did not build; a crashing input is left in fuzz/artifacts/<target>/ (keep
# it under fuzz/regressions/<target>/ once the bug is known).
#
# Env: FUZZ_SECONDS, FUZZ_TARGETS (space-separated), FUZZ_REQUIRED=0 to exit 0
# with a SKIP line when no nightly toolchain can be had (default: fail).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SECONDS_PER=${1:-${FUZZ_SECONDS:-20}}
TARGETS=${FUZZ_TARGETS:-"pdu_decode command_dispatch conn_stream auth_messages tls_psk"}
ART=$ROOT/fuzz/artifacts
WORK=$(mktemp -d "${TMPDIR:-/tmp}/flashpool-fuzz.XXXXXX") || { echo "mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -rf "$WORK"' EXIT

say() { echo "== fuzz: $*"; }

skip_or_fail() {
  if [ "${FUZZ_REQUIRED:-1}" = 0 ]; then
    say "SKIP: $1"
    echo "0 passed, 0 failed"
    exit 0
  fi
  say "FAIL: $1"
  echo "0 passed, 1 failed"
  exit 1
}

# ---- toolchain and cargo-fuzz
if ! command -v cargo >/dev/null; then skip_or_fail "cargo not found"; fi
if ! cargo +nightly --version >/dev/null 2>&1; then
  say "installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal >/dev/null 2>&1 ||
    skip_or_fail "no nightly toolchain (rustup toolchain install nightly failed)"
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  say "installing cargo-fuzz"
  cargo install cargo-fuzz --locked >"$WORK/install.log" 2>&1 || {
    tail -n 20 "$WORK/install.log"
    skip_or_fail "cargo install cargo-fuzz failed"
  }
fi
say "$(cargo fuzz --version), $(cargo +nightly --version)"

# ---- build all targets once
say "building targets"
if ! cargo +nightly fuzz build >"$WORK/build.log" 2>&1; then
  tail -n 40 "$WORK/build.log"
  say "FAIL: build"
  echo "0 passed, 1 failed"
  exit 1
fi

passed=0
failed=0
summary=()
for t in $TARGETS; do
  mkdir -p "$WORK/corpus/$t" "$ART/$t"
  opts=(-timeout=10 -rss_limit_mb=2048 "-artifact_prefix=$ART/$t/" -print_final_stats=1)
  env_asan="detect_odr_violation=0"
  # The in-process server's threads hold allocations at exit by design.
  [ "$t" = conn_stream ] && env_asan="$env_asan:detect_leaks=0"

  # Known crashers first: each must run clean now.
  reg=$ROOT/fuzz/regressions/$t
  if [ -d "$reg" ] && [ -n "$(ls -A "$reg" 2>/dev/null)" ]; then
    say "$t: replaying $(ls -A "$reg" | wc -l) regression input(s)"
    if ! ASAN_OPTIONS=$env_asan cargo +nightly fuzz run "$t" "$reg"/* -- "${opts[@]}" -runs=1 \
        >"$WORK/$t.regress.log" 2>&1; then
      grep -E 'panicked|ERROR|SUMMARY' "$WORK/$t.regress.log" | head -n 10
      say "FAIL $t: a regression input still crashes (log above)"
      failed=$((failed + 1))
      summary+=("$t: regression crash")
      continue
    fi
  fi

  say "$t: ${SECONDS_PER}s from $(ls "$ROOT/fuzz/seeds/$t" 2>/dev/null | wc -l) seed(s)"
  ASAN_OPTIONS=$env_asan timeout $((SECONDS_PER + 120)) \
    cargo +nightly fuzz run "$t" "$WORK/corpus/$t" "$ROOT/fuzz/seeds/$t" -- \
    "${opts[@]}" -max_total_time="$SECONDS_PER" >"$WORK/$t.log" 2>&1
  rc=$?
  execs=$(sed -nE 's/^Done ([0-9]+) runs in.*/\1/p' "$WORK/$t.log" | tail -n 1)
  [ -z "$execs" ] && execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$WORK/$t.log" | tail -n 1)
  cov=$(grep -E '^#[0-9]+' "$WORK/$t.log" | tail -n 1 | sed -nE 's/.*cov: ([0-9]+).*/\1/p')
  if [ "$rc" -eq 0 ]; then
    say "PASS $t: ${execs:-?} executions, coverage ${cov:-?}"
    passed=$((passed + 1))
    summary+=("$t: ${execs:-?} execs")
  else
    grep -E 'panicked|ERROR|SUMMARY|Test unit written|deadly signal|timeout' "$WORK/$t.log" | head -n 20
    crash=$(sed -nE 's/.*Test unit written to (.*)$/\1/p' "$WORK/$t.log" | tail -n 1)
    if [ -n "$crash" ] && [ -f "$crash" ]; then
      say "crashing input: $crash ($(wc -c <"$crash") bytes)"
      od -An -tx1 -v "$crash" | head -n 16
    fi
    [ "$rc" -eq 124 ] && say "$t did not finish in time"
    say "FAIL $t (exit $rc) after ${execs:-?} executions"
    failed=$((failed + 1))
    summary+=("$t: FAILED (exit $rc)")
  fi
done

say "summary: ${summary[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
