#!/usr/bin/env bash
# Builds Morph and its tests with AddressSanitizer + UBSan (-DMORPH_SANITIZE=ON)
# in a build folder of its own and runs ctest there, optionally only the tests
# matching FILTER (a ctest -R regex). A sanitizer report aborts the test that
# triggered it (halt_on_error), so it shows as a failed test. Not part of
# ctest: the build alone took 42 minutes on 2 shared cores, and the suite
# runs several times slower than in a Release build.
#   scripts/sanitize_tests.sh [FILTER] [BUILD_DIR]      (default BUILD_DIR: build-sanitize)
#   scripts/sanitize_tests.sh "CheckpointStore|Trainer|Store|JobSpec"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
filter=${1:-}
build=${2:-$root/build-sanitize}
jobs=${JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMORPH_SANITIZE=ON -DMORPH_BUILD_BENCH=OFF
cmake --build "$build" -j "$jobs"
# libtorch and Gloo are not instrumented: leaks at exit in them are not ours,
# and ODR/container checks would report their code too.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:halt_on_error=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
args=(--test-dir "$build" --output-on-failure)
[[ -n $filter ]] && args+=(-R "$filter")
ctest "${args[@]}"
echo "sanitize_tests: passed${filter:+ (tests matching '$filter')}"
