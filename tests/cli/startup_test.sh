#!/usr/bin/env bash
# Start-up faults (issue 13): a worker that cannot start is reported and the
# job goes on without it, or stops with exit 2 naming the cause; nothing
# waits for an hour.
#  1. Worker 0 dies right after registering, before it loaded its data or
#     told the manager the job's steps (the fault seam of morph_crashy):
#     the job starts with the other worker and ends with the
#     single-process model.
#  2. Worker 0 dies after taking its id, before announcing its pid: later
#     ids are not held up; same model.
#  3. A remote worker (`morph worker --join`) without the job's data (the
#     data folder hidden by an empty mount in a mount namespace of its own,
#     as on a host without the files) says why and exits 2; the manager prints the cause and finishes with
#     its local worker; same model.
#  4. The same remote worker as the job's only worker: the manager exits 2
#     naming the cause.
#  5. A remote worker whose machine cannot hold the job's model (the
#     manager starts no local worker, so only the worker checks its own
#     memory): it exits 2 before allocating, naming model.hidden, and the
#     manager exits 2 with that cause.
set -euo pipefail
MORPH=$1
CRASHY=$2
source "$(dirname "$0")/shell_util.sh"
make_work
fail() { echo "FAIL: $1"; shift; for f in "$@"; do echo "--- $f"; cat "$f"; done; exit 1; }

mlp_job "$work/job.toml" startup 3
ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)
[[ "$ref" == model_hash:* ]] || fail "no reference hash: $ref"

# 1, 2: a local worker dies during start-up.
for point in registered registering; do
  set +e
  MORPH_TEST_FAULT=$point:0:exit timeout 60 "$CRASHY" run "$work/job.toml" --workers 2 --out "$work/$point" \
    > "$work/$point.log" 2>&1
  rc=$?
  set -e
  [[ $rc -eq 0 ]] || fail "worker 0 dying at '$point': exit $rc" "$work/$point.log"
  [[ "$(tail -n 1 "$work/$point.log")" == "$ref" ]] || fail "worker 0 dying at '$point': another model" "$work/$point.log"
  grep -q "could not start" "$work/$point.log" || fail "the manager did not report the failed start" "$work/$point.log"
  grep -q "starting with 1 of 2 workers" "$work/$point.log" || fail "did not start with the worker left" "$work/$point.log"
done

# 3, 4: a remote worker whose data is missing.
# data.path is relative to the job file's folder, on every host; a remote
# worker whose host lacks the files is emulated by mounting an empty folder
# over the data folder in a mount namespace of the worker's own.
mkdir -p "$work/fm" "$work/empty"
ln -s /usr/share/datasets/fashion-mnist/* "$work/fm/"
without_data() {  # without_data COMMAND...: run it where $work/fm is empty
  unshare --mount --propagation private sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' _ \
    "$work/empty" "$work/fm" "$@"
}
cat > "$work/fm.toml" <<'TOML'
[job]
name = "startup-fm"
seed = 2
steps = 4
[data]
dataset = "fashion-mnist"
path = "fm"
[model]
name = "mlp"
hidden = [16]
[batch]
global = 32
virtual_nodes = 4
[optim]
lr = 0.05
TOML
ref2=$("$MORPH" run "$work/fm.toml" --quiet --out "$work/ref2" | tail -n 1)
[[ "$ref2" == model_hash:* ]] || fail "no reference hash: $ref2"

timeout 120 "$MORPH" run "$work/fm.toml" --workers 2 --spawn 1 --out "$work/two" \
  > "$work/two.log" 2>&1 &
mpid=$!
port=$(manager_port "$work/two.log")
set +e
without_data timeout 60 "$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/two/token" \
  > "$work/remote.log" 2>&1
rc=$?
wait "$mpid"
mrc=$?
set -e
[[ $rc -eq 2 ]] || fail "the remote worker without data exited $rc, expected 2" "$work/remote.log"
[[ $mrc -eq 0 ]] || fail "the manager exited $mrc" "$work/two.log"
grep -q "could not start: .*data.path" "$work/two.log" || fail "the manager did not print the cause" "$work/two.log"
[[ "$(tail -n 1 "$work/two.log")" == "$ref2" ]] || fail "another model" "$work/two.log"

timeout 60 "$MORPH" run "$work/fm.toml" --workers 1 --spawn 0 --out "$work/none" \
  > "$work/none.log" 2>&1 &
mpid=$!
port=$(manager_port "$work/none.log")
set +e
without_data timeout 60 "$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/none/token" \
  > "$work/remote2.log" 2>&1
wait "$mpid"
mrc=$?
set -e
[[ $mrc -eq 2 ]] || fail "no worker could start: the manager exited $mrc, expected 2" "$work/none.log"
grep -q "no worker could start (worker 0: .*data.path" "$work/none.log" || fail "the message does not name the cause" "$work/none.log"

# 5: a model no machine holds (4 x 2^20 x 2^20 parameters).
mlp_job "$work/huge.toml" startup-huge 3 && sed -i 's/^hidden = .*/hidden = [1048576, 1048576, 1048576, 1048576]/' "$work/huge.toml"
grep -q "^hidden = \[1048576" "$work/huge.toml" || fail "could not write the huge job" "$work/huge.toml"
timeout 60 "$MORPH" run "$work/huge.toml" --workers 1 --spawn 0 --out "$work/huge" > "$work/huge.log" 2>&1 &
mpid=$!
port=$(manager_port "$work/huge.log")
set +e
timeout 60 "$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/huge/token" > "$work/remote3.log" 2>&1
rc=$?
wait "$mpid"
mrc=$?
set -e
[[ $rc -eq 2 ]] || fail "the worker that cannot hold the model exited $rc, expected 2" "$work/remote3.log"
grep -q "model.hidden: the job needs at least .* available" "$work/remote3.log" ||
  fail "the worker's message does not name the memory estimate" "$work/remote3.log"
[[ $mrc -eq 2 ]] || fail "a worker without the memory: the manager exited $mrc, expected 2" "$work/huge.log"
grep -q "no worker could start (worker 0: .*model.hidden: the job needs at least" "$work/huge.log" ||
  fail "the manager does not print the worker's memory refusal" "$work/huge.log"
echo "startup test passed"
