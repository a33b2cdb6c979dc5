#!/usr/bin/env bash
# Losing the manager (issue 13): `morph run` is SIGKILLed mid-run while a
# remote worker (`morph worker --join`) trains. Every worker exits 3 within
# the bound (kManagerLostAfterS = 10 s, plus slack) naming the newest good
# checkpoint and the exact `morph run ... --resume ...` command; running
# that command (and joining a worker again, as it asks for one) finishes
# with the single-process model.
set -euo pipefail
MORPH=$1
CRASHY=$2
source "$(dirname "$0")/shell_util.sh"
make_work
fail() { echo "FAIL: $1"; shift; for f in "$@"; do echo "--- $f"; cat "$f"; done; exit 1; }

STEPS=80 mlp_job "$work/job.toml" mloss 6 $'[checkpoint]\nevery = 5\n[eval]\nevery = 1\n[elastic]\nstraggler_replan = false'
ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)
[[ "$ref" == model_hash:* ]] || fail "no reference hash: $ref"

"$MORPH" run "$work/job.toml" --workers 2 --spawn 1 --out "$work/run" > "$work/manager.log" 2>&1 &
mpid=$!
port=$(manager_port "$work/manager.log")
# The remote worker: the tests' build, whose evaluations (every step, on
# whichever worker reports) take 0.1 s, so the run lasts long enough to be
# interrupted.
MORPH_TEST_FAULT=evaluate:0:sleep=0.1,evaluate:1:sleep=0.1 \
  "$CRASHY" worker --join "127.0.0.1:$port" --token-file "$work/run/token" > "$work/remote.log" 2>&1 &
wpid=$!
for _ in $(seq 1 600); do
  [[ -f "$work/run/metrics.jsonl" ]] && (( $(wc -l < "$work/run/metrics.jsonl") >= 22 )) && break
  sleep 0.05
done
(( $(wc -l < "$work/run/metrics.jsonl") >= 22 )) || fail "the job did not get to step 22" "$work/manager.log"
kill -9 "$mpid"
t0=$(date +%s.%N)
set +e
wait "$wpid"
rc=$?
set -e
took=$(echo "$(date +%s.%N) - $t0" | bc)
[[ $rc -eq 3 ]] || fail "the remote worker exited $rc, expected 3" "$work/remote.log"
(( $(echo "$took < 16" | bc) )) || fail "the remote worker took $took s to give up (bound 10 s)" "$work/remote.log"
grep -q "lost the manager" "$work/remote.log" || fail "no message" "$work/remote.log"
grep -q "Newest good checkpoint: $work/run/checkpoints/step-" "$work/remote.log" ||
  fail "the message does not name the newest checkpoint" "$work/remote.log"
cmd=$(grep -A1 "Continue the job with:" "$work/remote.log" | tail -n 1 | sed 's/^ *//')
[[ "$cmd" == *" run "*" --resume $work/run/checkpoints"* ]] || fail "no resume command: '$cmd'" "$work/remote.log"
# The local worker was told too (the manager's death signal).
grep -q "lost the manager (the manager process ended)" "$work/manager.log" ||
  fail "the local worker did not report the loss" "$work/manager.log"

# The printed command, as a user would run it; it waits for one remote worker.
bash -c "exec timeout 120 $cmd" > "$work/resumed.log" 2>&1 &
rpid=$!
port=$(manager_port "$work/resumed.log")
timeout 120 "$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/run/token" > "$work/remote2.log" 2>&1
wait "$rpid" || fail "the resumed job failed" "$work/resumed.log" "$work/remote2.log"
[[ "$(tail -n 1 "$work/resumed.log")" == "$ref" ]] || fail "the resumed job ended with another model" "$work/resumed.log"
grep -A1 "lost the manager" "$work/remote.log"
echo "manager loss test passed (the remote worker gave up $took s after the kill)"
