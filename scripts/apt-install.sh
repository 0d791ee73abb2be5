#!/usr/bin/env bash
# Installs the Debian packages the test suites need: apt-get update, then
# apt-get install, each waiting up to 10 minutes for the dpkg lock (another
# apt run, unattended upgrades). Quiet when all goes well. A step that fails
# is named, with the end of its output (stderr included); the whole output
# is kept in LOGDIR/apt-update.txt and LOGDIR/apt-install.txt. A failed
# update is reported and the install goes on from the package lists already
# here. Exits with apt-get install's status.
#
#   scripts/apt-install.sh LOGDIR PACKAGE...
#
# Tested by scripts/apt-install.test.sh (a fake apt-get on PATH).
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 LOGDIR PACKAGE..." >&2
  exit 2
fi
logdir=$1
shift
mkdir -p "$logdir"
export DEBIAN_FRONTEND=noninteractive

# step NAME ARGS...: apt-get ARGS, output to LOGDIR/apt-NAME.txt; on failure
# its last lines are shown.
step() {
  local name=$1
  shift
  local out="$logdir/apt-$name.txt"
  apt-get -o DPkg::Lock::Timeout=600 "$@" >"$out" 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "apt-get $name failed (exit $rc); the end of its output (all of it in $out):"
    tail -n 25 "$out" | sed 's/^/    /'
  fi
  return "$rc"
}

step update update -qq ||
  echo "apt-get update failed (above): installing from the package lists already on this machine"
step install install -y -qq --no-install-recommends "$@"
