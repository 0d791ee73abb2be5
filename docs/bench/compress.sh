#!/usr/bin/env bash
# Compressed thin pools on RocksDB data: db_bench (rocksdb-tools) fills a
# database with --compression_ratio=0.5 and no compression of its own; its
# SST files are the data `cargo bench -p volume --bench compress` writes
# through pools without compression, with LZ4 and with zstd (beside random
# data), reporting what it takes on the device against LZ4 and zstd alone.
#
#   docs/bench/compress.sh            # 64 MiB, 3 rounds
#   MIB=128 ROUNDS=5 docs/bench/compress.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
MIB=${MIB:-64}
ROUNDS=${ROUNDS:-3}
command -v db_bench >/dev/null || { echo "db_bench not found (apt install rocksdb-tools)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# 100-byte values, 16-byte keys: enough SST bytes for the range written.
num=$(( MIB * 1024 * 1024 / 100 + 100000 ))
db_bench --benchmarks=fillseq --db="$work/db" --num="$num" --value_size=100 \
  --compression_type=none --compression_ratio=0.5 --disable_wal=1 >"$work/db_bench.log" 2>&1
cat "$work"/db/*.sst >"$work/data"
echo "db_bench data: $(du -m "$work/data" | cut -f1) MiB of SST files (fillseq, ratio 0.5, uncompressed)"
COMPRESS_DATA="$work/data" COMPRESS_MIB="$MIB" COMPRESS_ROUNDS="$ROUNDS" \
  cargo bench -q -p volume --bench compress 2>/dev/null
