#!/usr/bin/env bash
# A job on 3 workers: one is SIGKILLed mid-step, another joins later (with a
# label, which `morph status` lists under the id it took), one
# leaves gracefully (SIGTERM). The final model must equal the undisturbed
# single-process run's, and summary.json must list exactly the three
# resizes. Then: a live join of a model with batch norm (the CNN); `morph
# resize` growing 2 -> 3 and shrinking 3 -> 2; a job that loses its only
# worker (exit 3); a pipeline stage lost (a morph from the checkpoint).
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
work=$(mktemp -d)
cleanup() {
  pkill -9 -f "morph worker --join 127.0.0.1:${port:-none}" 2>/dev/null || true
  [[ -n "${mpid:-}" ]] && kill -9 "$mpid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The generations counted below are the membership changes' alone
# (straggler_test.sh).
elastic_mlp_job "$work/job.toml" elastic 4 2500

ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)

"$MORPH" run "$work/job.toml" --quiet --workers 3 --out "$work/el" > "$work/manager.log" 2>&1 &
mpid=$!
wait_for() {  # wait_for DESCRIPTION COMMAND...: poll up to 60 s
  local what=$1; shift
  for _ in $(seq 1 600); do
    if "$@" > /dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "timed out waiting for: $what"; cat "$work/manager.log"; exit 1
}
lines() { [[ -f "$work/el/metrics.jsonl" ]] && (( $(wc -l < "$work/el/metrics.jsonl") >= $1 )); }
generation() { grep -q "\"generation\":$1[,}]" "$work/el/metrics.jsonl"; }

wait_for "manager port" grep -q "manager on port" "$work/manager.log"
port=$(sed -n 's/.*manager on port \([0-9]*\).*/\1/p' "$work/manager.log")
wait_for "training to start" lines 50
mapfile -t pids < <(pgrep -f "^$MORPH worker --join 127.0.0.1:$port")
(( ${#pids[@]} == 3 )) || { echo "expected 3 workers, found ${#pids[@]}"; exit 1; }

kill -9 "${pids[1]}"
wait_for "the failure to be survived" generation 1
"$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/el/token" --label joiner-1 > "$work/joiner.log" 2>&1 &
wait_for "the joiner to be placed" generation 2
# Its label (the only one) is listed by morph status with the id it took: 3.
for try in $(seq 1 30); do  # the status record is rewritten every few tenths of a second
  status=$("$MORPH" status --join "127.0.0.1:$port" --token-file "$work/el/token")
  python3 -c 'import json, sys; sys.exit(json.loads(sys.argv[1]).get("labels") != {"3": "joiner-1"})' "$status" && break
  (( try < 30 )) || { echo "FAIL: morph status does not list the joiner's label as worker 3's: $status"; exit 1; }
  sleep 0.1
done
kill -TERM "${pids[2]}"
wait_for "the leave to be handled" generation 3
steps_done=$(wc -l < "$work/el/metrics.jsonl")
(( steps_done < 2500 )) || { echo "the job ended before the last membership change"; exit 1; }

wait "$mpid"
mpid=""
got=$(tail -n 1 "$work/manager.log")
echo "undisturbed single process: $ref"
echo "kill + join + leave:        $got"
[[ "$got" == "$ref" ]] || { echo "FAIL: hashes differ"; cat "$work/manager.log"; exit 1; }
causes=$(/usr/bin/env python3 -c "import json,sys; print(' '.join(r['cause'] for r in json.load(open(sys.argv[1]))['resizes']))" "$work/el/summary.json" 2>/dev/null || grep -o '"cause": "[a-z]*"' "$work/el/summary.json" | cut -d'"' -f4 | tr '\n' ' ')
echo "resizes: $causes"
[[ "$causes" == "failure join leave" ]] || { echo "FAIL: expected resizes failure, join, leave"; exit 1; }
# Every step's metrics line is there exactly once.
(( $(wc -l < "$work/el/metrics.jsonl") == 2500 )) || { echo "FAIL: metrics lines"; exit 1; }

# pace TOKEN FACTOR ID...: the workers ID of the job at $port emulate
# devices FACTOR times slower (`morph slow`; timing only, never the model).
pace() {
  local token=$1 f=$2 id
  shift 2
  for id in "$@"; do
    "$MORPH" slow --join "127.0.0.1:$port" --worker "$id" --factor "$f" --token-file "$token" > /dev/null ||
      echo "note: morph slow --worker $id --factor $f failed (the worker left?)"
  done
}

# A live join of a model with batch norm (the CNN, dropout too): the
# joiner receives the running statistics with the parameters (syncState),
# so its model and the final one are the single process's. The job is
# short and the join late on purpose: running statistics are an
# exponential average (momentum 0.1), so an error in them shrinks by 0.9
# per step and is below float resolution after about 400 steps. A long job
# would end with the single process's hash even if the joiner started from
# fresh statistics; with at most 100 steps after the join it cannot.
cat > "$work/cnn.toml" <<'TOML'
[job]
name = "elastic-cnn"
seed = 6
steps = 100
[data]
dataset = "synthetic"
train_size = 300
test_size = 40
[model]
name = "cnn"
channels = [4, 8]
fc = 16
dropout = 0.2
[batch]
global = 36
virtual_nodes = 6
[optim]
lr = 0.05
momentum = 0.9
[elastic]
straggler_replan = false
TOML
cnn_ref=$("$MORPH" run "$work/cnn.toml" --quiet --out "$work/cnn-ref" | tail -n 1)
"$MORPH" run "$work/cnn.toml" --quiet --workers 3 --spawn 0 --out "$work/cnn" > "$work/cnn.log" 2>&1 &
mpid=$!
cnn_lines() { [[ -f "$work/cnn/metrics.jsonl" ]] && (( $(wc -l < "$work/cnn/metrics.jsonl") >= $1 )); }
cnn_generation() { grep -q "\"generation\":$1[,}]" "$work/cnn/metrics.jsonl"; }
wait_for "the CNN job's manager" grep -q "manager on port" "$work/cnn.log"
port=$(sed -n 's/.*manager on port \([0-9]*\).*/\1/p' "$work/cnn.log")
# Until the joiner is in, the workers emulate devices 300x slower (timing
# only; some 1 s a step): the short job must not end while the joiner
# loads. The workers start one at a time and each is slowed once it has
# registered, before the next starts: the job begins when the third
# registers, already paced by the first two, however long `morph slow`
# takes to start (with --workers 3 they registered at once, and under load
# the job ran ahead before any slowdown took effect).
slow_cnn() { "$MORPH" slow --join "127.0.0.1:$port" --worker "$1" --factor 300 --token-file "$work/cnn/token"; }
for id in 0 1 2; do
  "$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/cnn/token" > "$work/cnn-w$id.log" 2>&1 &
  wait_for "CNN worker $id to register" slow_cnn "$id"
done
wait_for "the CNN job to train" cnn_lines 1
mapfile -t pids < <(pgrep -f "^$MORPH worker --join 127.0.0.1:$port")
(( ${#pids[@]} == 3 )) || { echo "expected 3 CNN workers, found ${#pids[@]}"; exit 1; }
kill -9 "${pids[2]}"
wait_for "the CNN job to survive the failure" cnn_generation 1
"$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/cnn/token" > "$work/cnn-joiner.log" 2>&1 &
wait_for "the CNN joiner to be placed" cnn_generation 2
(( $(wc -l < "$work/cnn/metrics.jsonl") < 90 )) || { echo "FAIL: the CNN joiner came in too late to check its statistics"; exit 1; }
pace "$work/cnn/token" 1 0 1 2
wait "$mpid"
mpid=""
got=$(tail -n 1 "$work/cnn.log")
echo "CNN single process:          $cnn_ref"
echo "CNN 3 workers, kill, join:   $got"
[[ "$got" == "$cnn_ref" ]] || { echo "FAIL: CNN hashes differ"; cat "$work/cnn.log"; exit 1; }
grep -q '"workers":3' "$work/cnn/metrics.jsonl" || { echo "FAIL: the joiner never trained"; exit 1; }

# `morph resize` to another size while the job runs: grow 2 -> 3 (the
# manager starts a worker), then shrink 3 -> 2 (it releases one). Both are
# recorded with cause "request", and the model is the undisturbed one.
"$MORPH" run "$work/job.toml" --quiet --workers 2 --out "$work/rs" > "$work/rs.log" 2>&1 &
mpid=$!
rs_workers() { tail -n 1 "$work/rs/metrics.jsonl" 2>/dev/null | grep -q "\"workers\":$1[,}]"; }
rs_lines() { [[ -f "$work/rs/metrics.jsonl" ]] && (( $(wc -l < "$work/rs/metrics.jsonl") >= $1 )); }
wait_for "the resize job to train" grep -q "manager on port" "$work/rs.log"
port=$(sed -n 's/.*manager on port \([0-9]*\).*/\1/p' "$work/rs.log")
wait_for "the resize job to train" rs_lines 1
pace "$work/rs/token" 40 0 1  # the job must outlast the new worker's start (the resize below)
"$MORPH" resize --join "127.0.0.1:$port" --workers 3 --token-file "$work/rs/token"
wait_for "the job to grow to 3 workers" rs_workers 3
"$MORPH" resize --join "127.0.0.1:$port" --workers 2 --token-file "$work/rs/token"
wait_for "the job to shrink to 2 workers" rs_workers 2
(( $(wc -l < "$work/rs/metrics.jsonl") < 2500 )) || { echo "FAIL: the job ended before the shrink"; exit 1; }
pace "$work/rs/token" 1 0 1
wait "$mpid"
mpid=""
got=$(tail -n 1 "$work/rs.log")
echo "resized 2 -> 3 -> 2:         $got"
[[ "$got" == "$ref" ]] || { echo "FAIL: hashes differ"; cat "$work/rs.log"; exit 1; }
python3 - "$work/rs/summary.json" <<'PY' || { echo "FAIL: resizes"; cat "$work/rs/summary.json"; exit 1; }
import json, sys
r = [(x["from"], x["to"], x["cause"]) for x in json.load(open(sys.argv[1]))["resizes"]]
print("resizes:", r)
sys.exit(0 if r == [(2, 3, "request"), (3, 2, "request")] else 1)
PY

# The manager ($mpid) exits with code 3, naming the last committed step and
# the newest good checkpoint (its output is in $1).
expect_stopped() {
  local rc
  set +e
  wait "$mpid"
  rc=$?
  set -e
  mpid=""
  echo "$(tail -n 1 "$1")"
  (( rc == 3 )) || { echo "FAIL: expected exit code 3, got $rc"; cat "$1"; exit 1; }
  grep -q "last committed step is" "$1" || { echo "FAIL: no committed step named"; exit 1; }
  grep -q "checkpoints/step-" "$1" || { echo "FAIL: no checkpoint named"; exit 1; }
}

# No worker left: the job stops with exit code 3, naming the last committed
# step and the newest good checkpoint to resume from.
"$MORPH" run "$work/job.toml" --quiet --workers 1 --out "$work/alone" --set checkpoint.every=20 \
  > "$work/alone.log" 2>&1 &
mpid=$!
wait_for "the lone worker to train" grep -q '"step":60,' "$work/alone/metrics.jsonl"
port=$(sed -n 's/.*manager on port \([0-9]*\).*/\1/p' "$work/alone.log")
pkill -9 -f "^$MORPH worker --join 127.0.0.1:$port"
expect_stopped "$work/alone.log"
# A pipeline of 2 stages that loses one has no replica of the lost layers:
# it morphs to 1 stage from the newest checkpoint, redoes the steps since,
# and ends with the undisturbed run's model.
ref300=$("$MORPH" run "$work/job.toml" --quiet --steps 300 --out "$work/ref300" | tail -n 1)
"$MORPH" run "$work/job.toml" --quiet --steps 300 --stages 2 --out "$work/pipe" --set checkpoint.every=20 \
  > "$work/pipe.log" 2>&1 &
mpid=$!
wait_for "the pipeline to train" grep -q '"step":60,' "$work/pipe/metrics.jsonl"
port=$(sed -n 's/.*manager on port \([0-9]*\).*/\1/p' "$work/pipe.log")
mapfile -t pids < <(pgrep -f "^$MORPH worker --join 127.0.0.1:$port")
(( ${#pids[@]} == 2 )) || { echo "expected 2 pipeline workers, found ${#pids[@]}"; exit 1; }
kill -9 "${pids[1]}"
wait "$mpid"
mpid=""
got=$(tail -n 1 "$work/pipe.log")
echo "pipeline stage killed, morphed to 1 stage: $got"
[[ "$got" == "$ref300" ]] || { echo "FAIL: morphed pipeline hash differs from $ref300"; cat "$work/pipe.log"; exit 1; }
grep -q "to 1 x 1" "$work/pipe.log" || { echo "FAIL: no morph to one stage reported"; cat "$work/pipe.log"; exit 1; }
echo "elastic test passed"
