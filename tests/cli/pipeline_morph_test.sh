#!/usr/bin/env bash
# Pipeline jobs morph in place (docs/pipeline.md, "Morphing"), and the model
# stays the undisturbed single-process run's:
#  A. 2 stages x 2 replicas: SIGKILL one worker -> 2 x 1 with the survivors'
#     state (nothing reloaded), then a joiner -> 2 x 2 again, its layers sent
#     by the workers holding them;
#  B. 3 stages x 1: SIGKILL the middle stage (no replica holds its layers) ->
#     2 stages from the newest checkpoint, the steps since redone;
#  C. a joiner killed as the morph that sends it its layers starts: the
#     reference model, or exit 3 naming a checkpoint; never another model.
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
make_work
[[ -n "${KEEP_WORK:-}" ]] && trap - EXIT && echo "work: $work"

cat > "$work/job.toml" <<'TOML'
[job]
name = "pmorph"
seed = 11
steps = 900
[data]
dataset = "synthetic"
train_size = 400
test_size = 40
[model]
name = "mlp"
hidden = [32, 32, 32]
[batch]
global = 32
virtual_nodes = 8
[optim]
lr = 0.02
momentum = 0.9
[eval]
every = 500
TOML

wait_for() {  # wait_for DESCRIPTION LOG COMMAND...: poll up to 90 s
  local what=$1 log=$2; shift 2
  for _ in $(seq 1 900); do
    if "$@" > /dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "FAIL: timed out waiting for: $what"; cat "$log"; exit 1
}
lines() { [[ -f "$1/metrics.jsonl" ]] && (( $(wc -l < "$1/metrics.jsonl") >= $2 )); }
generation() { grep -q "\"generation\":$2[,}]" "$1/metrics.jsonl"; }
workers_of() { pgrep -f "^$MORPH worker --join 127.0.0.1:$1" || true; }
field() {  # field SUMMARY PYTHON-EXPRESSION over the summary object s
  python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print($2)" "$1"
}

ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)
ref400=$("$MORPH" run "$work/job.toml" --quiet --steps 400 --out "$work/ref400" | tail -n 1)
echo "single process: $ref (400 steps: $ref400)"

# A. 2 x 2: kill, then join.
"$MORPH" run "$work/job.toml" --quiet --workers 4 --stages 2 --out "$work/a" > "$work/a.log" 2>&1 &
mpid=$!
port=$(manager_port "$work/a.log")
wait_for "training to start" "$work/a.log" lines "$work/a" 100
mapfile -t pids < <(workers_of "$port")
(( ${#pids[@]} == 4 )) || { echo "FAIL: expected 4 workers, found ${#pids[@]}"; exit 1; }
kill -9 "${pids[3]}"
wait_for "the pipeline to morph after the failure" "$work/a.log" generation "$work/a" 1
"$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/a/token" > "$work/joiner.log" 2>&1 &
wait_for "the joiner to be placed" "$work/a.log" generation "$work/a" 2
(( $(wc -l < "$work/a/metrics.jsonl") < 900 )) || { echo "FAIL: the job ended before the join"; exit 1; }
wait "$mpid" || { echo "FAIL: exit $?"; cat "$work/a.log"; exit 1; }
got=$(tail -n 1 "$work/a.log")
echo "2x2, kill, join: $got"
[[ "$got" == "$ref" ]] || { echo "FAIL: hashes differ"; cat "$work/a.log"; exit 1; }
shapes=$(field "$work/a/summary.json" "' '.join(r['cause']+':'+'x'.join(map(str,r['from_shape']))+'>'+'x'.join(map(str,r['to_shape'])) for r in s['resizes'])")
echo "resizes: $shapes"
[[ "$shapes" == "failure:2x2>2x1 join:2x1>2x2" ]] || { echo "FAIL: expected a failure to 2x1 and a join to 2x2"; exit 1; }
[[ $(field "$work/a/summary.json" "all(r['live'] for r in s['resizes'])") == True ]] || { echo "FAIL: a morph was not live"; exit 1; }
moved=$(field "$work/a/summary.json" "s['resizes'][1]['bytes_moved']")
(( moved > 0 )) || { echo "FAIL: the joiner received no bytes"; exit 1; }
(( $(wc -l < "$work/a/metrics.jsonl") == 900 )) || { echo "FAIL: metrics lines"; exit 1; }

# B. 3 x 1: the middle stage dies; back to 2 stages from the checkpoint.
"$MORPH" run "$work/job.toml" --quiet --steps 400 --workers 3 --stages 3 --out "$work/b" --set checkpoint.every=50 \
  > "$work/b.log" 2>&1 &
mpid=$!
port=$(manager_port "$work/b.log")
wait_for "training to start" "$work/b.log" lines "$work/b" 130
mapfile -t pids < <(workers_of "$port")
(( ${#pids[@]} == 3 )) || { echo "FAIL: expected 3 workers, found ${#pids[@]}"; exit 1; }
kill -9 "${pids[1]}"
wait "$mpid" || { echo "FAIL: exit $?"; cat "$work/b.log"; exit 1; }
got=$(tail -n 1 "$work/b.log")
echo "3x1, middle stage killed: $got"
[[ "$got" == "$ref400" ]] || { echo "FAIL: hashes differ"; cat "$work/b.log"; exit 1; }
grep -q "steps are done again" "$work/b.log" || { echo "FAIL: the redone steps were not reported"; cat "$work/b.log"; exit 1; }
r=$(field "$work/b/summary.json" "'x'.join(map(str,s['resizes'][0]['to_shape']))+' live='+str(s['resizes'][0]['live'])+' redone='+str(s['resizes'][0]['steps_redone'])")
echo "resize: $r"
[[ "$r" == "2x1 live=False redone="* ]] || { echo "FAIL: expected a checkpoint morph to 2x1"; exit 1; }

# C. A kill while state moves: the joiner dies as soon as the manager has
# published the morph that sends it its layers.
"$MORPH" run "$work/job.toml" --quiet --workers 4 --stages 2 --out "$work/c" --set checkpoint.every=50 \
  > "$work/c.log" 2>&1 &
mpid=$!
port=$(manager_port "$work/c.log")
wait_for "training to start" "$work/c.log" lines "$work/c" 60
mapfile -t pids < <(workers_of "$port")
kill -9 "${pids[3]}"
wait_for "the pipeline to morph after the failure" "$work/c.log" generation "$work/c" 1
"$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/c/token" > "$work/joiner2.log" 2>&1 &
joiner=$!
for _ in $(seq 1 3000); do
  grep -q "to 2 x 2" "$work/c.log" && break
  sleep 0.01
done
kill -9 "$joiner"
grep -q "to 2 x 2" "$work/c.log" || { echo "FAIL: the join was not morphed in before the end"; cat "$work/c.log"; exit 1; }
set +e
wait "$mpid"
rc=$?
set -e
got=$(tail -n 1 "$work/c.log")
echo "joiner killed in a morph: exit $rc, $got"
if (( rc == 0 )); then
  [[ "$got" == "$ref" ]] || { echo "FAIL: finished with another model"; cat "$work/c.log"; exit 1; }
else
  (( rc == 3 )) && grep -q "checkpoints/step-" "$work/c.log" || { echo "FAIL: exit $rc without a checkpoint named"; cat "$work/c.log"; exit 1; }
fi
echo "pipeline morph test passed"
