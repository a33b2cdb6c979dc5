#!/usr/bin/env bash
# A worker dies at every point of a step (issue 33): before its first VN,
# with its sums in flight, after they ended, at the start of an evaluation
# and at a checkpoint snapshot; rank 0 (metrics, checkpoints) and the
# others. Each time the survivors must regroup and commit the first step of
# the new generation within the documented recovery deadline
# (docs/distributed.md, "Deadlines": 5 s after the manager saw the death),
# and the job must end with the undisturbed single-process model.
#
# Three workers, exact mode on the sharded wire (rings of sends and
# receives): when worker 1 dies, worker 2 sees its connection close, but
# worker 0 waits for worker 2, which gave the sum up and never sends. Before
# the group's watchdog (src/comm/communicator.cpp) that wait lasted Gloo's
# whole timeout: a minute.
set -euo pipefail
MORPH=$1
CRASHY=$2
source "$(dirname "$0")/shell_util.sh"
make_work
fail() { echo "FAIL: $1"; shift; for f in "$@"; do echo "--- $f"; tail -n 60 "$f"; done; exit 1; }

export MORPH_EXACT_WIRE=sharded
STEPS=60 mlp_job "$work/job.toml" killanywhere 3 \
  $'[eval]\nevery = 20\n[checkpoint]\nevery = 10\n[elastic]\nstraggler_replan = false'
ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)
[[ "$ref" == model_hash:* ]] || fail "no reference hash: $ref"
deadline=5

# run NAME FAULT: three workers; FAULT (MORPH_TEST_FAULT) kills one of them.
run() {
  local name=$1 fault=$2 rc
  set +e
  MORPH_TEST_FAULT=$fault timeout 120 "$CRASHY" run "$work/job.toml" --quiet --workers 3 --out "$work/$name" \
    > "$work/$name.log" 2>&1
  rc=$?
  set -e
  (( rc == 0 )) || fail "$name: exit $rc" "$work/$name.log"
  grep -q "test hook: worker .* at '.*': exit" "$work/$name.log" || fail "$name: the fault did not strike" "$work/$name.log"
  [[ "$(tail -n 1 "$work/$name.log")" == "$ref" ]] || fail "$name: another model than the single process's" "$work/$name.log"
  python3 - "$work/$name/summary.json" "$work/$name/metrics.jsonl" "$deadline" "$name" <<'PY' || fail "$name" "$work/$name.log"
import json, sys
summary, metrics, deadline, name = json.load(open(sys.argv[1])), sys.argv[2], float(sys.argv[3]), sys.argv[4]
r = summary["resizes"]
assert len(r) == 1 and r[0]["cause"] == "failure" and r[0]["from"] == 3 and r[0]["to"] == 2, f"resizes: {r}"
assert r[0]["seconds"] <= deadline, f"recovery took {r[0]['seconds']:.3f} s, over the {deadline} s deadline"
steps = [json.loads(l)["step"] for l in open(metrics)]
assert steps == list(range(60)), "every step's metrics line once, in order"
print(f"{name}: failure at step {r[0]['step']}, first step of the new generation after {r[0]['seconds']:.3f} s")
PY
}

run compute-1 compute@25:1:exit
run reduce-1 reduce@25:1:exit
run reduced-1 reduced@25:1:exit
run reduce-0 reduce@33:0:exit
run reduce-2 reduce@33:2:exit
run evaluate-0 evaluate:0:exit
run snapshot-0 checkpoint@29:0:exit
echo "kill-anywhere test passed"
