#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (AddressSanitizer, UBSan) and runs
# each for SECONDS (default 2, as ctest runs it) from its seed corpus in
# tests/fuzz/corpus/.
# A crash fails the run; libFuzzer leaves the input as crash-* in the
# working folder: add it to the corpus and fix the code.
#   tests/fuzz/run_fuzz.sh [SECONDS] [BUILD_DIR] [TARGET...]
# Objects and binaries stay in BUILD_DIR and are rebuilt only when a source
# under src/ or tests/fuzz/ is newer, so a second run spends its time fuzzing.
# Libraries are linked as the CMake build links them: toml++ as Debian's
# shared library (compiled with NDEBUG: its internal asserts are off, as in
# `morph`), libtorch, xxhash, zlib.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)/src
seconds=${1:-2}
out=${2:-$(mktemp -d)}
shift $(( $# < 2 ? $# : 2 ))
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(store_protocol generation_plan member_report generation_want resize_request job_file resources profile plan_file checkpoint idx npy cluster_trace packed_ints)
mkdir -p "$out/obj"
command -v clang++ > /dev/null || { echo "run_fuzz: clang++ is not installed (bash scripts/install-deps.sh installs it)"; exit 1; }
torch_inc="-isystem /usr/include/torch/csrc/api/include -D_GLIBCXX_USE_CXX11_ABI=1"
# The code under test is instrumented for coverage (fuzzer-no-link) as well as the targets;
# line tables (not full debug information, which doubles the compile time) name
# the file and line of every frame in a crash report.
flags=(-std=c++17 -O1 -gline-tables-only -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined
       -fno-sanitize-recover=all -fdebug-prefix-map="$(dirname "$src")"=. -I "$src" $torch_inc
       -DTOML_HEADER_ONLY=0 -DTOML_SHARED_LIB=1)

# Sources of the code under test (besides the target), extra compile flags and libraries, per target.
declare -A sources=(
  [store_protocol]="store/protocol.cpp"
  [generation_plan]="control/protocol/generation_plan.cpp control/protocol/message.cpp exec/schedule.cpp"
  [member_report]="control/protocol/member_report.cpp control/protocol/message.cpp"
  [generation_want]="control/protocol/generation_want.cpp control/protocol/message.cpp"
  [resize_request]="control/protocol/resize_request.cpp control/protocol/message.cpp"
  [job_file]="core/job_spec.cpp core/npy.cpp"
  [resources]="plan/resources.cpp plan/profile.cpp core/job_spec.cpp core/npy.cpp core/parse_number.cpp core/sys.cpp"
  [profile]="plan/profile.cpp core/job_spec.cpp core/npy.cpp core/parse_number.cpp core/sys.cpp"
  [plan_file]="plan/plan_file.cpp exec/schedule.cpp"
  [checkpoint]="ckpt/checkpoint_store.cpp"
  [idx]="data/dataset.cpp data/sampler.cpp core/npy.cpp"
  [npy]="core/npy.cpp"
  [cluster_trace]="sched/cluster_sim.cpp sched/policy.cpp"
  [packed_ints]="wsp/packed_ints.cpp"
)
declare -A libs=(
  [store_protocol]="-lcrypto"
  [generation_plan]=""
  [member_report]=""
  [generation_want]=""
  [resize_request]=""
  [job_file]="-ltomlplusplus -lxxhash"
  [resources]="-ltomlplusplus -ltorch_cpu -lc10 -lxxhash"
  [profile]="-ltomlplusplus -ltorch_cpu -lc10 -lxxhash"
  [plan_file]=""
  [checkpoint]="-ltorch -ltorch_cpu -lc10 -lxxhash"
  [idx]="-ltorch -ltorch_cpu -lc10 -lz"
  [npy]=""
  [cluster_trace]=""
  [packed_ints]=""
)
# Files that rely on src/pch.h (torch/torch.h) in the CMake build get it with -include.
pch_sources=" data/dataset.cpp ckpt/checkpoint_store.cpp "

stale() {  # stale OUTPUT: true if OUTPUT is missing or older than any source
  [[ ! -e $1 ]] || [[ -n $(find "$src" "$here" -type f -name '*.[ch]*' -newer "$1" -print -quit) ]]
}

# Through ccache where it is installed, as the CMake build (MORPH_CCACHE=0
# turns it off): the sanitized libtorch headers are most of the compile, and
# a fresh clone on a machine that ran this before compiles nothing again.
# The line tables name files relative to the checkout (-fdebug-prefix-map),
# so the working folder need not be part of ccache's key (hash_dir).
cxx=(clang++)
if [[ ${MORPH_CCACHE:-1} != 0 ]] && command -v ccache > /dev/null; then
  cxx=(env CCACHE_BASEDIR="$(dirname "$src")" CCACHE_NOHASHDIR=1
       CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime ccache clang++)
fi

compile() {  # compile SOURCE OBJECT [EXTRA FLAGS...]
  local s=$1 o=$2
  shift 2
  stale "$o" || return 0
  nice -n 5 "${cxx[@]}" "${flags[@]}" "$@" -c "$s" -o "$o"
}

# Compile every object first, $(nproc) at a time (most of the time goes to the
# libtorch headers), then link and run the targets one after another.
for target in "${targets[@]}"; do
  [[ -v "sources[$target]" ]] || { echo "run_fuzz: no target '$target'"; exit 1; }
done
declare -A compiled=()
jobs_max=$(nproc)
for target in "${targets[@]}"; do
  for s in ${sources[$target]} "fuzz:$target"; do
    [[ -v "compiled[$s]" ]] && continue
    compiled[$s]=1
    if [[ $s == fuzz:* ]]; then file="$here/${target}_fuzz.cpp"; o="$out/obj/${target}_fuzz.o"
    else file="$src/$s"; o="$out/obj/$(basename "$s" .cpp).o"; fi
    extra=()
    [[ $pch_sources == *" $s "* ]] && extra=(-include torch/torch.h)
    while [[ $(jobs -rp | wc -l) -ge $jobs_max ]]; do wait -n || true; done
    { compile "$file" "$o" "${extra[@]}" || touch "$out/obj/FAILED"; } &
  done
done
wait
[[ ! -e $out/obj/FAILED ]] || { rm -f "$out/obj/FAILED"; echo "run_fuzz: compilation failed"; exit 1; }

failed=0
for target in "${targets[@]}"; do
  bin="$out/${target}_fuzz"
  objs=("$out/obj/${target}_fuzz.o")
  for s in ${sources[$target]}; do objs+=("$out/obj/$(basename "$s" .cpp).o"); done
  if stale "$bin"; then
    # shellcheck disable=SC2086
    clang++ -fsanitize=fuzzer,address,undefined "${objs[@]}" ${libs[$target]} -o "$bin"
  fi
  corpus="$out/corpus-$target"
  mkdir -p "$corpus"
  cp "$here/corpus/$target"/* "$corpus/"
  rm -f "$out"/crash-* "$out"/leak-* "$out"/timeout-* "$out"/oom-*
  status=0
  (cd "$out" && "$bin" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=4096 \
     -print_final_stats=1 "$corpus" > "$out/$target.log" 2>&1) || status=$?
  grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|ERROR|SUMMARY" "$out/$target.log" || true
  if [[ $status -ne 0 ]] || ls "$out"/crash-* "$out"/leak-* "$out"/timeout-* "$out"/oom-* > /dev/null 2>&1; then
    echo "run_fuzz: $target FAILED (exit $status); log: $out/$target.log; input:" "$out"/crash-* "$out"/leak-* \
      "$out"/timeout-* "$out"/oom-* 2> /dev/null
    failed=1
    mkdir -p "$out/failed-$target"
    mv "$out"/crash-* "$out"/leak-* "$out"/timeout-* "$out"/oom-* "$out/failed-$target/" 2> /dev/null || true
    continue
  fi
  echo "run_fuzz: $target: no crash in $seconds s"
done
exit $failed
