#!/usr/bin/env bash
# An application on `flashpool attach`, small (CI; ~1 min): docs/bench/apps.sh CHECK=1.
# RocksDB's db_bench (rocksdb-tools) fills 50,000 keys and runs readrandomwriterandom with
# 80% reads for 10 s on ext4 over a loop device over (1) a local file on tmpfs and (3)
# `flashpool attach` of a node's RAM namespace over NVMe/TCP on 127.0.0.1; each run must
# finish without an error, report reads and writes, and `ldb checkconsistency` must pass
# on both databases afterwards. Not a timed assertion: the numbers are only logged.
# Ends with "N passed, N failed". Root (FUSE, loop devices).
#
#   tests/attach/apps.sh            # KEYS=, DB_SECS=, OUT= as docs/bench/apps.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
if [ -z "${OUT:-}" ]; then
  OUT=$(mktemp -d /tmp/flashpool-apps-ci.XXXXXX) || { echo "mktemp failed (is the disk full?)" >&2; exit 1; }
fi
export OUT CHECK=1
docs/bench/apps.sh
rc=$?
if [ "$rc" = 0 ]; then rm -rf "$OUT"; else echo "(kept $OUT)"; fi
exit "$rc"
