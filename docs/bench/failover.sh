#!/usr/bin/env bash
# docs/bench/failover.sh -- the host-visible stall of each failover case, over many runs.
#
# Runs tests/failover/run.sh once with RUNS=N (each fault case N times in one guest boot;
# default 10) and prints, per case, the median and the worst of the largest fio completion
# latency (clat max: how long the Linux host's I/O waited during the failover) and of the
# longest gap without an I/O completion the guest saw, over the runs. The suite itself
# never fails on latency; this is where the numbers go (docs/performance.md).
#
#   docs/bench/failover.sh                 RUNS=10, all cases
#   RUNS=5 CASES=kill9-owner,planned-move docs/bench/failover.sh
#   docs/bench/failover.sh --from LOG      the table from a saved suite output (or its
#                                          .cache/failover/run/stalls.txt)
# Any other knob of tests/failover/run.sh (KATO, LEASE_MS, STOP_S, ...) passes through, the
# host's kernel and settings too: GUEST_SUITE=trixie (Debian 13's 6.12), PATH_IO_TIMEOUT_MS
# (1000 by default; 0 for the kernel's), IO_TIMEOUT (docs/performance.md, "Silent failure").
# Needs root, like the suite. The suite's output goes to $LOG (default
# target/failover-bench.log), its per-case timelines to .cache/failover/run/timeline.txt.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FROM=""
while [ $# -gt 0 ]; do
  case $1 in
    --from) FROM=${2:?--from needs a file}; shift 2;;
    -h|--help) sed -n '2,21p' "$0"; exit 0;;
    *) echo "usage: $0 [--from LOG]"; exit 2;;
  esac
done

if [ -z "$FROM" ]; then
  export RUNS=${RUNS:-10}
  LOG=${LOG:-$ROOT/target/failover-bench.log}
  mkdir -p "$(dirname "$LOG")"
  echo "tests/failover/run.sh with RUNS=$RUNS (output in $LOG)"
  "$ROOT/tests/failover/run.sh" all 2>&1 | tee "$LOG" | grep -E '^RESULT|passed, .* failed'
  FROM=$LOG
fi

# RESULT lines ("... host-visible stall: clat max N ms, longest I/O gap M ms ...") or
# stalls.txt lines ("TAG clat_ms=N gap_ms=M PASS")
python3 - "$FROM" << 'EOF'
import re, statistics, sys
rows, last = {}, {}
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^RESULT (\S+) (PASS|FAIL) .*clat max (\d+) ms, longest I/O gap (\d+|\?) ms", line)
    if m:
        tag, ok, clat, gap = m.groups()
    else:
        m = re.match(r"^(\S+) clat_ms=(\d*) gap_ms=(\d*) (PASS|FAIL)", line)
        if not m:
            continue
        tag, clat, gap, ok = m.groups()
    last[tag] = (clat, gap, ok)   # a RESULT line is printed twice (progress, summary)
for tag, (clat, gap, ok) in last.items():
    case = tag.split("#")[0]
    r = rows.setdefault(case, {"clat": [], "gap": [], "fail": 0})
    if clat not in ("", "?"):
        r["clat"].append(int(clat))
    if gap not in ("", "?"):
        r["gap"].append(int(gap))
    r["fail"] += ok != "PASS"
if not rows:
    sys.exit("no fault case results in " + sys.argv[1])
fmt = "%-18s %4s %5s %12s %11s %11s %10s"
print(fmt % ("case", "runs", "fails", "clat median", "clat worst", "gap median", "gap worst"))
for case, r in rows.items():
    c, g = r["clat"], r["gap"]
    med = lambda v: "%d ms" % statistics.median(v) if v else "-"
    top = lambda v: "%d ms" % max(v) if v else "-"
    print(fmt % (case, len(c), r["fail"], med(c), top(c), med(g), top(g)))
EOF
