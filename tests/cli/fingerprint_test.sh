#!/usr/bin/env bash
# Workers of an exact job must run the same build, settings and data: a
# worker joining with another MORPH_BUCKET_BYTES (which changes how the
# gradient is cut into all-reduces) is refused with exit 2 naming the
# setting, and the job goes on; a matching worker then completes it with
# the single-process model.
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
make_work
mlp_job "$work/job.toml" fp 9

ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)
"$MORPH" run "$work/job.toml" --quiet --workers 2 --spawn 1 --out "$work/two" > "$work/manager.log" 2>&1 &
mpid=$!
port=$(manager_port "$work/manager.log")
set +e
MORPH_BUCKET_BYTES=4096 timeout 60 "$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/two/token" \
  > "$work/bad.log" 2>&1
rc=$?
set -e
[[ $rc -eq 2 ]] || { echo "FAIL: mismatched worker exited $rc, expected 2"; cat "$work/bad.log"; exit 1; }
grep -q 'MORPH_BUCKET_BYTES: manager "", worker "4096"' "$work/bad.log" ||
  { echo "FAIL: message does not name the setting"; cat "$work/bad.log"; exit 1; }
timeout 120 "$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/two/token" > "$work/good.log" 2>&1
wait "$mpid"
got=$(tail -n 1 "$work/manager.log")
[[ "$got" == "$ref" ]] || { echo "FAIL: $got vs $ref"; cat "$work/manager.log"; exit 1; }
grep -q "refusing worker" "$work/manager.log" || { echo "FAIL: the manager did not say it refused"; exit 1; }
echo "fingerprint test passed"
