#!/usr/bin/env bash
# Stragglers: on 3 workers, worker 1 is made 40x slower mid-run (`morph
# slow`). The slowdown's onset is the first step whose metrics line shows
# it in worker 1's own report (its seconds per VN, `vn_seconds`, at least
# 10x every other member's). A VN here computes for a few milliseconds, so
# the scheduling noise of 2 shared cores (a few milliseconds at a time)
# cannot mimic that, and straggler_factor 8 keeps it from flagging anyone.
# The manager must flag worker 1 within elastic.straggler_steps steps of
# the onset, with no re-plan before it, re-plan (a "straggler" entry in
# summary.json's resizes; worker 1 gets fewer VNs or is dropped), and the
# final model must equal the single-process run's; in float mode too (its
# control values ride in the gradient sum), without the hash. Also: `morph
# slow` exits 2 for a bad factor or an unknown worker. Then the same in a
# pipeline of 2 stages x 2 replicas: within the window of the onset, the
# slowed worker's replica gets fewer VNs (nothing moves), same hash.
#
#   straggler_test.sh MORPH [PART [DIR]]
#
# PART "refs" writes the job file (job.toml) and the single-process runs'
# hash lines (ref.txt: 400 steps, ref100.txt: 100 steps) into DIR, those
# files removed first (nothing of an earlier run counts): nothing there
# depends on timing, so ctest runs it beside other tests
# (straggler.References, a fixture). PART "slowed" runs the slowed jobs and
# compares their hashes with DIR's (the detection is timing-sensitive: ctest
# runs it alone, straggler.SlowWorkerReplannedSameHash); it fails if DIR
# lacks a file or if its job file differs from the one this script writes.
# "all" (default) runs both (DIR default: a scratch folder).
set -euo pipefail
MORPH=$1
part=${2:-all}
source "$(dirname "$0")/shell_util.sh"
case $part in refs|slowed|all) ;; *) echo "usage: $0 MORPH [refs|slowed|all [DIR]]" >&2; exit 2 ;; esac
make_work
refs=${3:-$work/refs}
WINDOW=4

# write_job FILE: the job.
write_job() {
  cat > "$1" <<TOML
[job]
name = "straggler"
seed = 5
steps = 400
[data]
dataset = "synthetic"
train_size = 960
test_size = 60
[model]
name = "mlp"
hidden = [512, 256]
[batch]
global = 192
virtual_nodes = 12
[optim]
lr = 0.02
momentum = 0.9
[elastic]
straggler_factor = 8.0
straggler_steps = $WINDOW
TOML
}

# The single-process references: the whole job, and its first 100 steps
# (the pipeline's).
if [[ $part != slowed ]]; then
  mkdir -p "$refs"
  rm -f "$refs/job.toml" "$refs/ref.txt" "$refs/ref100.txt"
  write_job "$refs/job.toml"
  "$MORPH" run "$refs/job.toml" --quiet --out "$work/ref" | tail -n 1 > "$work/ref.txt"
  "$MORPH" run "$refs/job.toml" --quiet --steps 100 --out "$work/ref100" | tail -n 1 > "$work/ref100.txt"
  mv "$work/ref.txt" "$work/ref100.txt" "$refs/"
  echo "references: $(cat "$refs/ref.txt"), 100 steps: $(cat "$refs/ref100.txt")"
  if [[ $part == refs ]]; then echo "straggler test (refs) passed"; exit 0; fi
fi
for f in job.toml ref.txt ref100.txt; do
  [[ -s "$refs/$f" ]] || { echo "FAIL: no $refs/$f: run the references first (ctest runs straggler.References; by hand: $0 MORPH refs $refs)"; exit 1; }
done
write_job "$work/job.toml"
cmp -s "$work/job.toml" "$refs/job.toml" \
  || { echo "FAIL: $refs/job.toml is not the job this script writes (stale references: run them again)"; exit 1; }
ref=$(cat "$refs/ref.txt")
ref100=$(cat "$refs/ref100.txt")

# start_slowed NAME WORKER FACTOR RUN_ARGS...: runs the job with RUN_ARGS
# into $work/NAME (log $work/NAME.log) in the background (mpid, port) and,
# once 30 steps are in its metrics, makes WORKER FACTOR times slower.
start_slowed() {
  local name=$1 worker=$2 factor=$3
  shift 3
  "$MORPH" run "$work/job.toml" "$@" --out "$work/$name" > "$work/$name.log" 2>&1 &
  mpid=$!
  port=$(manager_port "$work/$name.log")
  local m="$work/$name/metrics.jsonl"
  for _ in $(seq 1 600); do [[ -f "$m" ]] && (( $(wc -l < "$m") >= 30 )) && break; sleep 0.05; done
  [[ -f "$m" ]] && (( $(wc -l < "$m") >= 30 )) || { echo "FAIL: $name: training did not start"; cat "$work/$name.log"; exit 1; }
  "$MORPH" slow --join "127.0.0.1:$port" --worker "$worker" --factor "$factor" --token-file "$work/$name/token"
}

start_slowed st 1 40 --workers 3

# Bad input: exit 2, and nothing changes.
set +e
"$MORPH" slow --join "127.0.0.1:$port" --worker 1 --factor 0.5 --token-file "$work/st/token" 2> "$work/bad1.log"
rc1=$?
"$MORPH" slow --join "127.0.0.1:$port" --worker 99 --factor 4 --token-file "$work/st/token" 2> "$work/bad2.log"
rc2=$?
set -e
(( rc1 == 2 && rc2 == 2 )) || { echo "FAIL: morph slow with bad input: exit $rc1 and $rc2, expected 2"; exit 1; }
grep -q -- "--factor" "$work/bad1.log" && grep -q "no such worker" "$work/bad2.log" \
  || { echo "FAIL: messages"; cat "$work/bad1.log" "$work/bad2.log"; exit 1; }

wait "$mpid"
got=$(tail -n 1 "$work/st.log")
echo "single process: $ref"
echo "straggler:      $got"
[[ "$got" == "$ref" ]] || { echo "FAIL: hashes differ"; cat "$work/st.log"; exit 1; }
grep "straggler" "$work/st.log" || true

check="$(dirname "$0")/straggler_check.py"
python3 "$check" dp "$work/st" "$work/st.log" "$WINDOW" 1

# Float mode gathers the control values in the gradient sum (no MAX
# all-reduce): the members' seconds per VN still reach the manager, which
# re-plans around the slowed worker, and the workers follow its generation.
# Float steps are short, and `morph slow` (a process that loads libtorch)
# may take effect a hundred steps after it is started on a loaded machine:
# this job runs 600 steps (no hash to compare in float mode). (For the same
# reason the job above has 400: the bad-input calls need its manager.)
start_slowed fst 1 40 --workers 3 --set reduce.mode=float --steps 600
wait "$mpid" || { echo "FAIL: float mode exit $?"; cat "$work/fst.log"; exit 1; }
python3 - "$work/fst" <<'PY' || { echo "FAIL: float mode vn_seconds"; exit 1; }
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
sys.exit(0 if all(len(l["vn_seconds"]) == l["workers"] and min(l["vn_seconds"]) > 0 for l in lines) else 1)
PY
python3 "$check" dp "$work/fst" "$work/fst.log" "$WINDOW" 1

# A pipeline: 2 stages x 2 replicas; worker 3 (stage 1 of replica 1) 40x
# slower (its stage's compute is the replica's whole step).
start_slowed pst 3 40 --workers 4 --stages 2 --steps 100
wait "$mpid" || { echo "FAIL: pipeline exit $?"; cat "$work/pst.log"; exit 1; }
got=$(tail -n 1 "$work/pst.log")
echo "pipeline straggler: $got"
[[ "$got" == "$ref100" ]] || { echo "FAIL: pipeline hashes differ"; cat "$work/pst.log"; exit 1; }
grep "straggler" "$work/pst.log" || true
python3 "$check" pipe "$work/pst" "$work/pst.log" "$WINDOW" 3
echo "straggler test ($part) passed"
