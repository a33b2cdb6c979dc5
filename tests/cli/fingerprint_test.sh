#!/usr/bin/env bash
# Workers of an exact job must run the same build, settings and data: a
# worker joining with another MORPH_BUCKET_BYTES (which changes how the
# gradient is cut into all-reduces), or with libtorch's or oneDNN's CPU
# kernels at another level (they change a VN's bits), is refused with exit
# 2 naming the key, and the job goes on; a matching worker then completes
# it with the single-process model. (The kernel cases assume a CPU with
# AVX2, as every x86-64 server since 2013 has: pinned below it, the worker
# differs from the manager.)
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
make_work
mlp_job "$work/job.toml" fp 9

ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)
"$MORPH" run "$work/job.toml" --quiet --workers 2 --spawn 1 --out "$work/two" > "$work/manager.log" 2>&1 &
mpid=$!
port=$(manager_port "$work/manager.log")
# refused ENV_ASSIGNMENT PATTERN: a worker started with that variable exits
# 2 and its message matches the pattern.
refused() {
  set +e
  env "$1" timeout 60 "$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/two/token" > "$work/bad.log" 2>&1
  local rc=$?
  set -e
  [[ $rc -eq 2 ]] || { echo "FAIL: worker with $1 exited $rc, expected 2"; cat "$work/bad.log"; exit 1; }
  grep -E -q "$2" "$work/bad.log" || { echo "FAIL: message for $1 does not match $2"; cat "$work/bad.log"; exit 1; }
  grep -E "$2" "$work/bad.log"
}
refused MORPH_BUCKET_BYTES=4096 'MORPH_BUCKET_BYTES: manager "", worker "4096"'
refused ATEN_CPU_CAPABILITY=default 'aten_cpu: manager "[A-Z0-9]+", worker "NO AVX"'
refused ONEDNN_MAX_CPU_ISA=SSE41 'onednn_isa: manager "cpu_isa_[a-z0-9_]+", worker "cpu_isa_sse41"'
timeout 120 "$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/two/token" > "$work/good.log" 2>&1
wait "$mpid"
got=$(tail -n 1 "$work/manager.log")
[[ "$got" == "$ref" ]] || { echo "FAIL: $got vs $ref"; cat "$work/manager.log"; exit 1; }
grep -q "refusing worker" "$work/manager.log" || { echo "FAIL: the manager did not say it refused"; exit 1; }
echo "fingerprint test passed"
