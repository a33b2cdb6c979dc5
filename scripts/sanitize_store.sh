#!/usr/bin/env bash
# Builds the store's unit tests (tests/store/: server, client, protocol
# under malformed, oversized and unauthenticated input; the in-memory table) with AddressSanitizer + UBSan and with ThreadSanitizer, and runs
# them. About 3 minutes on 2 cores; not part of ctest.
#   scripts/sanitize_store.sh [WORK_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d)}
torch="-isystem /usr/include/torch/csrc/api/include -D_GLIBCXX_USE_CXX11_ABI=1 -DUSE_C10D_GLOO -DUSE_DISTRIBUTED"
sources=(src/store/protocol.cpp src/store/table.cpp src/store/server.cpp src/store/client.cpp
         src/store/local_store.cpp src/store/abortable_store.cpp src/comm/communicator.cpp
         tests/store/server_test.cpp tests/store/local_store_test.cpp)
for san in address,undefined thread; do
  dir="$work/${san%%,*}"
  mkdir -p "$dir"
  objs=()
  for s in "${sources[@]}"; do
    o="$dir/$(basename "$s").o"
    # shellcheck disable=SC2086
    g++ -std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=$san -I "$root/src" $torch -c "$root/$s" -o "$o"
    objs+=("$o")
  done
  g++ -fsanitize=$san "${objs[@]}" -o "$dir/store_test" -ltorch -ltorch_cpu -lc10 -lgtest -lgtest_main -lcrypto \
    -lpthread
  # Gloo (uninstrumented) is left out under TSan: its threads would be reported, not ours.
  filter='*'
  [[ $san == thread ]] && filter='-*Gloo*'
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 TSAN_OPTIONS=halt_on_error=1 \
    "$dir/store_test" --gtest_filter="$filter"
  echo "sanitize_store: $san: passed"
done
