#!/usr/bin/env bash
# A slow evaluation is not a failure (issue 13): with elastic.
# collective_timeout lowered to 2 s, rank 0 of 3 workers evaluates for 6 s
# (the fault seam of morph_crashy) while the others wait in the next step's
# all-reduce. They see its heartbeats and wait on: no resize, and the
# single-process model.
set -euo pipefail
MORPH=$1
CRASHY=$2
source "$(dirname "$0")/shell_util.sh"
make_work
fail() { echo "FAIL: $1"; shift; for f in "$@"; do echo "--- $f"; cat "$f"; done; exit 1; }

STEPS=8 mlp_job "$work/job.toml" sloweval 8 $'[eval]\nevery = 4\n[elastic]\ncollective_timeout = 2\nstraggler_replan = false'
ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)
[[ "$ref" == model_hash:* ]] || fail "no reference hash: $ref"
set +e
MORPH_TEST_FAULT=evaluate:0:sleep=6 timeout 90 "$CRASHY" run "$work/job.toml" --workers 3 --out "$work/three" \
  > "$work/three.log" 2>&1
rc=$?
set -e
[[ $rc -eq 0 ]] || fail "exit $rc" "$work/three.log"
[[ "$(tail -n 1 "$work/three.log")" == "$ref" ]] || fail "another model" "$work/three.log"
grep -q "worker 0 at 'evaluate': sleep=6" "$work/three.log" || fail "the evaluation was not slowed" "$work/three.log"
grep -q "every member still heart-beats, so it waits on" "$work/three.log" ||
  fail "the waiting members did not pass their deadline" "$work/three.log"
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s['resizes']==[] and s['workers']==3 else 1)" \
  "$work/three/summary.json" || fail "a resize happened" "$work/three.log" "$work/three/summary.json"
echo "slow evaluation test passed"
