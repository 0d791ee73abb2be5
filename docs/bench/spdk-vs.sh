#!/usr/bin/env bash
# The same client (SPDK's spdk_nvme_perf, CPU 1) against three targets on CPU 0, one after
# the other in each round: SPDK's nvmf_tgt (malloc bdev), flashpool with the default
# poll_us = 50 (docs/bench/node-poll.toml) and with poll_us = 0 (docs/bench/node.toml).
# Namespace 1 of each is a 1 GiB RAM namespace with 512-byte blocks; one connection.
#
#   docs/bench/spdk-vs.sh SPDK_DIR [FLASHPOOL_BIN]  > out.txt
#   docs/bench/spdk-vs-summary.py out.txt
#
# SPDK_DIR: a build from ../shared/tools/build-spdk.sh (SPDK v25.09). Env: ROUNDS (5), T
# (seconds per run, 4). Needs root (hugepages). Run it on a quiet machine: it reports what
# else ran (load average) with each round.
set -u
SPDK=${1:?SPDK build dir}; BIN=${2:-target/release/flashpool}
HERE=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$SPDK/build/lib
PERF=$SPDK/build/bin/spdk_nvme_perf
[ "$(cat /proc/sys/vm/nr_hugepages)" -ge 1024 ] || echo 1600 > /proc/sys/vm/nr_hugepages
mkdir -p /dev/hugepages; mountpoint -q /dev/hugepages || mount -t hugetlbfs nodev /dev/hugepages
R='trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2026-01.io.flashpool:bench'
R="$R hostnqn:nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555 ns:1"
ROUNDS=${ROUNDS:-5}; T=${T:-4}
WLS=("-o 4096 -q 1 -w randread" "-o 4096 -q 32 -w randread" "-o 4096 -q 32 -w randwrite"
     "-o 131072 -q 16 -w read" "-o 131072 -q 16 -w write")
for r in $(seq "$ROUNDS"); do
  echo "LOAD round=$r $(cut -d' ' -f1-3 /proc/loadavg)"
  for tgt in spdk default poll0; do
    case $tgt in
      spdk) "$SPDK/build/bin/nvmf_tgt" -m 0x1 --json "$HERE/spdk-nvmf.json" >/tmp/spdk-vs-tgt.log 2>&1 & sleep 3 ;;
      default) taskset -c 0 "$BIN" serve --config "$HERE/node-poll.toml" >/tmp/spdk-vs-fp.log 2>&1 & sleep 1 ;;
      poll0) taskset -c 0 "$BIN" serve --config "$HERE/node.toml" >/tmp/spdk-vs-fp.log 2>&1 & sleep 1 ;;
    esac
    pid=$!
    for i in "${!WLS[@]}"; do
      # shellcheck disable=SC2086
      out=$(taskset -c 1 "$PERF" -r "$R" ${WLS[$i]} -t "$T" -c 0x2 2>&1 | awk '/^Total/ {print $3, $5}')
      echo "RES round=$r tgt=$tgt wl=$i iops_lat=$out"
    done
    kill "$pid"; wait "$pid" 2>/dev/null; sleep 0.5
  done
done
