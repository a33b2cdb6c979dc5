#!/usr/bin/env bash
# Workers of an exact job must run the same build, settings and data: a
# worker joining with another MORPH_BUCKET_BYTES (which changes how the
# gradient is cut into all-reduces) is refused with exit 2 naming the
# setting, and the job goes on; a matching worker then completes it with
# the single-process model.
set -euo pipefail
MORPH=$1
work=$(mktemp -d)
cleanup() {
  [[ -n "${mpid:-}" ]] && kill -9 "$mpid" 2>/dev/null || true
  pkill -9 -f "$work/" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/job.toml" <<'TOML'
[job]
name = "fp"
seed = 9
steps = 6
[data]
dataset = "synthetic"
train_size = 200
test_size = 20
[model]
name = "mlp"
hidden = [16]
[batch]
global = 20
virtual_nodes = 4
[optim]
lr = 0.05
TOML

ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)
"$MORPH" run "$work/job.toml" --quiet --workers 2 --spawn 1 --out "$work/two" > "$work/manager.log" 2>&1 &
mpid=$!
port=""
for _ in $(seq 1 200); do
  port=$(sed -n 's/.*manager on port \([0-9]*\).*/\1/p' "$work/manager.log")
  [[ -n "$port" ]] && break
  sleep 0.05
done
[[ -n "$port" ]] || { echo "FAIL: manager did not start"; cat "$work/manager.log"; exit 1; }
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
mpid=""
got=$(tail -n 1 "$work/manager.log")
[[ "$got" == "$ref" ]] || { echo "FAIL: $got vs $ref"; cat "$work/manager.log"; exit 1; }
grep -q "refusing worker" "$work/manager.log" || { echo "FAIL: the manager did not say it refused"; exit 1; }
echo "fingerprint test passed"
