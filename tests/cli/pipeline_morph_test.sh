#!/usr/bin/env bash
# Pipeline jobs morph in place (docs/pipeline.md, "Morphing"), and the model
# stays the undisturbed single-process run's:
#  A. 2 stages x 2 replicas: SIGKILL one worker -> 2 x 1 with the survivors'
#     state (nothing reloaded), then a joiner -> 2 x 2 again, its layers sent
#     by the workers holding them;
#  B. 3 stages x 1: SIGKILL the middle stage (no replica holds its layers) ->
#     2 stages from the newest checkpoint, the steps since redone;
#  C. a joiner killed as the morph that sends it its layers starts: the
#     survivors leave that morph and regroup; the reference model;
#  D. a job started with --plan auto morphs to the planner's choice for the
#     workers left (another depth and cut than the rule's), state moved live;
#  E. a step's last collective lost on the only survivor of a stage while
#     the others committed the step (the test build's fault hook): it
#     finishes the step from its buffer and the morph is live.
set -euo pipefail
MORPH=$1
CRASHY=$2  # the fault-injecting build (tests/cli/crashy_main.cpp)
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
[elastic]
# The resizes are checked one by one: noise on shared cores must not add
# straggler re-plans (straggler_test.sh tests those in pipelines).
straggler_replan = false
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
# A short deadline: a member stuck in the morph (still heart-beating) is
# declared dead after 3 x 5 s instead of 3 x 60 s.
"$MORPH" run "$work/job.toml" --quiet --workers 4 --stages 2 --out "$work/c" --set checkpoint.every=50 \
  --set elastic.collective_timeout=5 > "$work/c.log" 2>&1 &
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
(( rc == 0 )) || { echo "FAIL: exit $rc"; cat "$work/c.log"; exit 1; }
[[ "$got" == "$ref" ]] || { echo "FAIL: finished with another model"; cat "$work/c.log"; exit 1; }

# D. The planner re-plans. The measured profile is edited so that its choice
# differs from the rule's whatever this machine measured: every layer takes
# 200x longer (compute dominates), cores do not contend (the older model at
# 1.0 on 16 cores, and the measured co-located factors dropped: with them,
# in one of two suite runs on 2026-12-05, 2 x 1 beat 3 x 1), and each
# weighted layer holds 20 MiB more, so that under --memory-cap 370 no single
# stage fits the model. On 4 workers it chooses 2 x 2; on 3, 3 x 1 with a new
# cut, where the rule would keep 2 x 1 and a spare. The planner is asked
# with the run's checkpoint.every: a checkpointing stage holds a copy of its
# state (about 300 MiB for two weighted layers, 440 for four); a cap of 300
# without it in the question failed CI on 2026-12-05, when a calibration that
# measured 1.5 MiB more runtime put 2 x 2 over the cap in the run only.
mkdir -p "$work/d"
"$MORPH" calibrate "$work/job.toml" --out "$work/measured.json" > /dev/null
python3 - "$work/measured.json" "$work/d/profile.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for l in p["layers"]:
    for k in ("forward_s", "backward_s", "recompute_s", "forward_nograd_s"):
        l[k] *= 200
    if l["params"] > 0:
        l["param_bytes"] += 20 << 20
p["compute_contention"] = 1.0
p["host_cores"] = 16
p.pop("host_contention", None)
json.dump(p, open(sys.argv[2], "w"))
PY
best() {  # best WORKERS: the planner's best plan as "PxD cuts"
  "$MORPH" plan "$work/job.toml" --profile "$work/d/profile.json" --workers "$1" --memory-cap 370 \
    --set checkpoint.every=50 --json |
    python3 -c "import json,sys; p=json.load(sys.stdin)['plans'][0]; print('%dx%d' % (p['stages'], p['replicas']), p['cuts'])"
}
start=$(best 4)
want=$(best 3)
echo "planner: 4 workers $start, 3 workers $want"
[[ "$start" == 2x2* && "$want" != 2x1* ]] || { echo "FAIL: the edited profile does not separate planner and rule"; exit 1; }
"$MORPH" run "$work/job.toml" --quiet --steps 400 --plan auto --workers 4 --memory-cap 370 --out "$work/d" \
  --set checkpoint.every=50 > "$work/d.log" 2>&1 &
mpid=$!
port=$(manager_port "$work/d.log")
wait_for "training to start" "$work/d.log" lines "$work/d" 100
grep -q "^morph: --plan auto chose 2 stages x 2 replicas" "$work/d.log" ||
  { echo "FAIL: --plan auto did not choose the planner's $start"; cat "$work/d.log"; exit 1; }
mapfile -t pids < <(workers_of "$port")
(( ${#pids[@]} == 4 )) || { echo "FAIL: expected 4 workers, found ${#pids[@]}"; exit 1; }
kill -9 "${pids[3]}"
wait "$mpid" || { echo "FAIL: exit $?"; cat "$work/d.log"; exit 1; }
got=$(tail -n 1 "$work/d.log")
echo "--plan auto 2x2, kill: $got"
[[ "$got" == "$ref400" ]] || { echo "FAIL: hashes differ"; cat "$work/d.log"; exit 1; }
r=$(field "$work/d/summary.json" "(lambda r: r['chosen_by']+' '+'x'.join(map(str,r['to_shape']))+' '+str(r['to_cuts'])+' live='+str(r['live']))(s['resizes'][0])")
echo "resize: $r"
[[ "$r" == "planner $want live=True" ]] || { echo "FAIL: expected a live morph to the planner's $want"; cat "$work/d.log"; exit 1; }

# E. 2 x 2; step 150's last world collective ends everywhere, then worker 3
# (stage 1 of replica 1) dies and worker 1 (stage 1 of replica 0) takes it as
# lost (MORPH_TEST_FAULT: exit, lose). Workers 0 and 2 committed step 150;
# worker 1 reports step 149 committed and 150 prepared, and is the only
# survivor holding stage 1: it finishes step 150 from its buffer and the
# morph to 2 x 1 is live. (Without a checkpoint, anything else stops the job.)
MORPH_TEST_FAULT="last-sum@150:1:lose,last-sum@150:3:exit" "$CRASHY" run "$work/job.toml" --quiet --steps 400 \
  --workers 4 --stages 2 --out "$work/e" > "$work/e.log" 2>&1 || { echo "FAIL: part E exit $?"; cat "$work/e.log"; exit 1; }
grep -q "test hook: worker 1 at 'last-sum@150': lose" "$work/e.log" || { echo "FAIL: the hook did not act"; cat "$work/e.log"; exit 1; }
grep -q "worker 1 finishes step 150 from its buffer" "$work/e.log" || { echo "FAIL: not finished from the buffer"; cat "$work/e.log"; exit 1; }
got=$(tail -n 1 "$work/e.log")
echo "2x2, a step's last collective lost on the only survivor of a stage: $got"
[[ "$got" == "$ref400" ]] || { echo "FAIL: hashes differ"; cat "$work/e.log"; exit 1; }
r=$(field "$work/e/summary.json" "' '.join('x'.join(map(str,r['to_shape']))+' live='+str(r['live'])+' redone='+str(r.get('steps_redone', 0)) for r in s['resizes'])")
echo "resize: $r"
[[ "$r" == "2x1 live=True redone=0" ]] || { echo "FAIL: expected one live morph to 2x1, nothing redone"; cat "$work/e.log"; exit 1; }
(( $(wc -l < "$work/e/metrics.jsonl") == 400 )) || { echo "FAIL: metrics lines"; exit 1; }
echo "pipeline morph test passed"
