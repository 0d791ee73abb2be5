#!/usr/bin/env bash
# Tests scripts/apt-install.sh against a fake apt-get that can be told to
# fail its update or its install. Ends with "N passed, N failed".
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# Without its temp dir the fake would land in /bin (a full disk did that).
tmp=$(mktemp -d) && [ -d "$tmp" ] || {
  echo "apt-install.test.sh: cannot make a temp dir"
  echo "0 passed, 1 failed"
  exit 1
}
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"
cat >"$tmp/bin/apt-get" <<'FAKE'
#!/bin/sh
echo "apt-get $*" >>"$FAKE_APT_CALLS"
step=
for a in "$@"; do
  case $a in update | install) step=$a ;; esac
done
echo "Reading package lists..."
if [ "$step" = "${FAKE_APT_FAIL:-}" ]; then
  case $step in
    update) echo "E: Failed to fetch http://deb.example/dists/bookworm/InRelease  Temporary failure resolving 'deb.example'" >&2 ;;
    install) echo "E: Unable to locate package libisal-dev" >&2 ;;
  esac
  exit 100
fi
exit 0
FAKE
chmod +x "$tmp/bin/apt-get"

passed=0
failed=0
check() { # what, condition...
  local what=$1
  shift
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $what"
    echo "  output was:"
    sed 's/^/    /' "$tmp/out"
  fi
}

# run FAIL_STEP: runs apt-install.sh with the fake; sets $rc, $tmp/out, $tmp/calls.
run() {
  : >"$tmp/calls"
  FAKE_APT_CALLS=$tmp/calls FAKE_APT_FAIL=$1 PATH="$tmp/bin:$PATH" \
    "$here/apt-install.sh" "$tmp/logs" libisal-dev fio >"$tmp/out" 2>&1
  rc=$?
}

run none
check "all good: exit 0" [ "$rc" -eq 0 ]
check "all good: nothing printed" [ ! -s "$tmp/out" ]
check "update waits for the dpkg lock" grep -q -- '-o DPkg::Lock::Timeout=600 update' "$tmp/calls"
check "install waits for the dpkg lock" grep -q -- '-o DPkg::Lock::Timeout=600 install .*libisal-dev fio' "$tmp/calls"

run install
check "failed install: non-zero exit" [ "$rc" -ne 0 ]
check "failed install: apt's stderr is shown" grep -q 'E: Unable to locate package libisal-dev' "$tmp/out"
check "failed install: the step is named" grep -q 'apt-get install failed (exit 100)' "$tmp/out"
check "failed install: the log keeps it all" grep -q 'Unable to locate package' "$tmp/logs/apt-install.txt"

run update
check "failed update: apt's stderr is shown" grep -q "E: Failed to fetch" "$tmp/out"
check "failed update: the step is named" grep -q 'apt-get update failed (exit 100)' "$tmp/out"
check "failed update: the install still runs" grep -q ' install ' "$tmp/calls"
check "failed update, good install: exit 0" [ "$rc" -eq 0 ]

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
