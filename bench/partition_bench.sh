#!/usr/bin/env bash
# Partition recovery (issue 34, docs/distributed.md "Partitions"): runs the
# two-worker case of tests/cli/partition_test.sh RUNS times (default 5) and
# prints, for each run and as min / median / max, the time from the moment
# the router stops forwarding to the first step the surviving worker
# commits, and from healing to the first step with both workers again.
# Root (network namespaces). elastic.collective_timeout is 4 s there.
#   bench/partition_bench.sh build/morph [RUNS]
set -euo pipefail
morph=$1
runs=${2:-5}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= runs; r++)); do
  PARTITION_CASES=two bash "$here/../tests/cli/partition_test.sh" "$morph" | tee -a "$out" | grep 'first step'
done
python3 - "$out" <<'PY'
import re, statistics, sys
cut, heal = [], []
for line in open(sys.argv[1]):
    m = re.search(r"partition: ([0-9.]+) s .* after healing: ([0-9.]+) s", line)
    if m:
        cut.append(float(m.group(1))); heal.append(float(m.group(2)))
def row(name, v):
    print(f"{name:<42} min {min(v):6.2f} s  median {statistics.median(v):6.2f} s  max {max(v):6.2f} s  ({len(v)} runs)")
row("partition -> first step of the survivor", cut)
row("healing -> first step with both workers", heal)
PY
