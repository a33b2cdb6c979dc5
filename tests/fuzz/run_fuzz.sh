#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (AddressSanitizer, UBSan) and runs
# each for SECONDS (default 5) from its seed corpus in tests/fuzz/corpus/.
# A crash fails the run; libFuzzer leaves the input as crash-* in the
# working folder: add it to the corpus and fix the decoder.
#   tests/fuzz/run_fuzz.sh [SECONDS] [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)/src
seconds=${1:-5}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
command -v clang++ > /dev/null || { echo "run_fuzz: clang++ is not installed (bash scripts/install-deps.sh installs it)"; exit 1; }
for target in store_protocol; do
  bin="$out/${target}_fuzz"
  clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I "$src" \
    "$here/${target}_fuzz.cpp" "$src/control/store_protocol.cpp" -lcrypto -o "$bin"
  corpus="$out/corpus-$target"
  mkdir -p "$corpus"
  cp "$here/corpus/$target"/* "$corpus/" 2>/dev/null || true
  (cd "$out" && "$bin" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 "$corpus" 2>&1 | \
     grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|ERROR|SUMMARY" || true)
  ls "$out"/crash-* > /dev/null 2>&1 && { echo "run_fuzz: $target crashed"; exit 1; }
  echo "run_fuzz: $target: no crash in $seconds s"
done
