#!/usr/bin/env bash
# What CI pays: the README's test command from a fresh clone, timed by
# phase (dependency check, configure + build, ctest), with the slowest ten
# tests and the process starts of the ctest phase: those of the engine and
# the test programs load Debian's libtorch and its 290 shared objects (about
# 0.7 CPU-s each); those of the `morph` front alone do not (about 12 ms).
#   bash bench/suite_time.sh [REPO] [WORK_DIR]
# REPO defaults to this checkout (its committed HEAD), WORK_DIR to a new
# temporary folder. Nothing else should run beside it (`cpu quiet` on the
# development machine). The build and the fuzz test compile through ccache
# (MORPH_CCACHE): SUITE_CACHE=cold (default) gives them an empty cache, as
# on a machine that never built Morph; SUITE_CACHE=warm uses this machine's
# (~/.cache/ccache), as CI on a machine that built Morph before.
# The process count needs perf (linux-perf) and root; without it the line
# says so.
set -euo pipefail
repo=${1:-$(cd "$(dirname "$0")/.." && pwd)}
work=${2:-$(mktemp -d)}
git clone -q "$repo" "$work/morph"
cd "$work/morph"
now() { date +%s.%N; }
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.0f}')" "$1" "$2"; }
t0=$(now)
bash scripts/install-deps.sh > "$work/install.log" 2>&1
t1=$(now)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" 2>&1
[[ ${SUITE_CACHE:-cold} == warm ]] || export CCACHE_DIR=$work/ccache
/usr/bin/time -f "%U %S" -o "$work/build.cpu" cmake --build build -j2 > "$work/build.log" 2>&1
t2=$(now)
ctest_cmd=(ctest --test-dir build --output-on-failure -j2)
rc=0
if command -v perf > /dev/null && [[ $(id -u) == 0 ]]; then
  perf record -q -a -e sched:sched_process_exec -o "$work/exec.data" -- "${ctest_cmd[@]}" > "$work/ctest.log" 2>&1 || rc=$?
else
  "${ctest_cmd[@]}" > "$work/ctest.log" 2>&1 || rc=$?
fi
t3=$(now)
read -r bu bs < "$work/build.cpu"
echo "fresh clone of $(git rev-parse --short HEAD), $(nproc) cores, ${SUITE_CACHE:-cold} compiler cache, logs in $work"
echo "install check $(secs "$t0" "$t1") s | configure + build $(secs "$t1" "$t2") s (CPU ${bu%.*} user + ${bs%.*} sys) |" \
  "ctest $(secs "$t2" "$t3") s (exit $rc) | total $(secs "$t0" "$t3") s"
echo "slowest ten tests (s):"
grep -E 'Test +#' "$work/ctest.log" | awk '{print $(NF-1), $4}' | sort -rn | head -n 10 | sed 's/^/  /'
if [[ -e $work/exec.data ]]; then
  perf script -F trace -i "$work/exec.data" 2> /dev/null | grep -o "filename=$work/morph/build/[^ ]*" > "$work/execs.txt" || true
  starts=$(wc -l < "$work/execs.txt")
  # The binaries that load libtorch: the engine, the test programs, morph_crashy.
  torch=$(grep -vc "/build/morph$" "$work/execs.txt" || true)
  echo "process starts of Morph's binaries during ctest: $starts (of them loading libtorch: $torch;" \
    "the rest are the libtorch-free front, \`morph\`)"
else
  echo "process starts: not counted (needs perf and root)"
fi
exit "$rc"
