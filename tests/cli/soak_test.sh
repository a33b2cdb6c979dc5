#!/usr/bin/env bash
# A short soak (bench/soak.sh is the long one): a job on 3 workers loses
# one to SIGKILL and gains a fresh one, four times over (8 resizes). The
# store's key count (`morph status`, store_keys, with no metrics line
# waiting to be read) must be the same after every cycle — past
# generations', departed workers' and read steps' keys are deleted — and
# the final model must equal the undisturbed single-process run's.
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
make_work
fail() { echo "FAIL: $1"; shift; for f in "$@"; do echo "--- $f"; tail -n 40 "$f"; done; exit 1; }

# Only the membership changes below make generations.
elastic_mlp_job "$work/job.toml" soak-test 5 3000
ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)
[[ "$ref" == model_hash:* ]] || fail "no reference hash: $ref"

"$MORPH" run "$work/job.toml" --quiet --workers 3 --out "$work/soak" > "$work/manager.log" 2>&1 &
mpid=$!
port=$(manager_port "$work/manager.log")
workers() { pgrep -f "^$MORPH worker --join 127.0.0.1:$port" || true; }
# The job's pace: while the cycles run, every member emulates a device 30x
# slower (`morph slow`; timing only, never the model: steps of some 20 ms),
# so that the job outlasts the cycles without running thousands of steps
# after them; the members run at full speed again once the cycles are done.
pace() {  # pace FACTOR ID...
  local f=$1 id
  shift
  for id in "$@"; do
    "$MORPH" slow --join "127.0.0.1:$port" --worker "$id" --factor "$f" --token-file "$work/soak/token" > /dev/null ||
      fail "morph slow --worker $id" "$work/manager.log"
  done
}
members() {
  "$MORPH" status --join "127.0.0.1:$port" --token-file "$work/soak/token" |
    python3 -c 'import json, sys; print(" ".join(str(m) for m in json.load(sys.stdin)["members"]))'
}
store_keys() {
  "$MORPH" status --join "127.0.0.1:$port" --token-file "$work/soak/token" | sed -n 's/.*"store_keys": \([0-9]*\).*/\1/p'
}
# The key count with no step's metrics line waiting to be read: the least
# of five status records (the manager writes one every 0.5 s; a step's
# `metrics/<step>` lives from the worker's write to the manager's read),
# all written after what came before (the record may be 0.5 s old).
settled_keys() {
  local k least=""
  sleep 0.6
  for _ in 1 2 3 4 5; do
    k=$(store_keys)
    [[ -n "$k" ]] || fail "morph status has no store_keys" "$work/manager.log"
    [[ -z "$least" || $k -lt $least ]] && least=$k
    sleep 0.6
  done
  echo "$least"
}
# The generation of the newest committed step (-1 before the first).
gen_now() {
  local g
  g=$(tail -n 1 "$work/soak/metrics.jsonl" 2>/dev/null | sed -n 's/.*"generation":\([0-9]*\).*/\1/p')
  echo "${g:--1}"
}
# next_gen G: until a step of a generation after G is committed (120 s at
# most); prints that generation.
next_gen() {
  local g
  for _ in $(seq 1 1200); do
    g=$(gen_now)
    (( g > $1 )) && { echo "$g"; return 0; }
    kill -0 "$mpid" 2>/dev/null || fail "the job ended after generation $1 (too fast for this test?)" "$work/manager.log" >&2
    sleep 0.1
  done
  fail "no generation after $1 started" "$work/manager.log" >&2
}
g=$(next_gen -1)
pace 30 0 1 2
for cycle in 1 2 3 4; do
  victim=$(workers | tail -n 1)
  kill -9 "$victim"
  g=$(next_gen "$g")
  "$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/soak/token" > "$work/joiner$cycle.log" 2>&1 &
  g=$(next_gen "$g")
  pace 30 $((2 + cycle))  # the joiner (ids are given in order: 3, 4, 5, 6)
  keys=$(settled_keys)
  echo "after cycle $cycle (generation $g, $(workers | wc -l) workers): $keys store keys"
  [[ $cycle -eq 1 ]] && first=$keys
  # Each cycle leaves the job as it was (3 workers, two generations kept):
  # the count is flat (docs/distributed.md, "The store stays bounded").
  # Without the deletions every generation adds its plan, reports and
  # rendezvous keys, every departed worker its keys, and every step its
  # metrics.
  (( keys == first )) || fail "the store holds $keys keys after cycle $cycle, $first after cycle 1" "$work/manager.log"
done
# shellcheck disable=SC2046
pace 1 $(members)
set +e
wait "$mpid"
rc=$?
set -e
[[ $rc -eq 0 ]] || fail "the job exited $rc" "$work/manager.log"
got=$(tail -n 1 "$work/manager.log")
[[ "$got" == "$ref" ]] || fail "another model: $got, reference $ref" "$work/manager.log"
echo "soak test passed"
