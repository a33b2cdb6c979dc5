#!/usr/bin/env bash
# The live cluster scheduler (docs/cluster.md): four small jobs with
# different priorities on a 3-slot `morph cluster` under fifo, wfs and
# morph (tests/cli/cluster_live_check.py: same hashes as the standalone
# runs, never more than 3 slots held, resizes under wfs and morph); bad
# input: an unknown policy, a demand above the slots, a job file that fails
# validation (nothing queued), a wrong token, all exit 2.
#
#   cluster_live_test.sh MORPH [PART [DIR]]
#
# PART "refs" writes the four job files (j0..j3.toml) and their standalone
# runs' hashes (refs.json) into DIR (those files removed first, so that
# nothing of an earlier run counts) and runs the bad-input checks: nothing
# there depends on timing, so ctest runs it beside other tests
# (cluster.LiveReferences, a fixture). PART "live"
# runs the three policies on DIR's jobs and hashes (their resizes are
# timing-sensitive: ctest runs it alone, cluster.LiveFourJobsSameHashes);
# it fails if DIR lacks a file or if the job files differ from the ones
# this script writes. "all" (default) runs both (DIR default: a scratch
# folder).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/shell_util.sh"
cluster_parts "$@"

# write_jobs DIR: j0..j3.toml. j0 runs first and longest: the others arrive
# while it runs. Straggler re-plans off: on busy cores one would shrink j0
# before the scheduler does, and only the scheduler's resizes are under test.
write_jobs() {
  local no_replan=$'[elastic]\nstraggler_replan = false'
  STEPS=2500 mlp_job "$1/j0.toml" j0 1 "$no_replan"
  for i in 1 2 3; do STEPS=600 mlp_job "$1/j$i.toml" "j$i" $((i + 1)) "$no_replan"; done
}

references() {
  mkdir -p "$refs"
  rm -f "$refs"/j[0-3].toml "$refs/refs.json"
  write_jobs "$refs"
  # Standalone references: each job alone, in one process.
  for i in 0 1 2 3; do
    "$MORPH" run "$refs/j$i.toml" --out "$work/ref$i" --quiet --status off > /dev/null
  done
  python3 - "$work" "$refs" <<'PY'
import json, os, sys
w, r = sys.argv[1], sys.argv[2]
json.dump({str(i): json.load(open(f"{w}/ref{i}/summary.json"))["model_hash"] for i in range(4)}, open(f"{r}/refs.json.tmp", "w"))
os.replace(f"{r}/refs.json.tmp", f"{r}/refs.json")
PY
  bad_input
}

# Bad input.
expect2() {  # expect2 PATTERN ARGS...
  local pattern=$1; shift
  set +e; "$MORPH" "$@" > "$work/err" 2>&1; local rc=$?; set -e
  [[ $rc == 2 ]] || { echo "FAIL: exit $rc for $*"; cat "$work/err"; exit 1; }
  grep -qF -- "$pattern" "$work/err" || { echo "FAIL: no '$pattern' for $*"; cat "$work/err"; exit 1; }
}
bad_input() {
  expect2 "unknown policy 'lifo'" cluster --slots 3 --policy lifo --out "$work/bad"
  expect2 "morph cluster needs --slots N" cluster --out "$work/bad"
  "$MORPH" cluster --slots 3 --out "$work/c" > "$work/c.log" 2>&1 &
  cluster_pid=$!
  for _ in $(seq 1 200); do [[ -s "$work/c/address" ]] && break; sleep 0.05; done
  addr=$(cat "$work/c/address")
  tok="$work/c/token"
  expect2 "--demand 4: the cluster has 3 slots" submit --cluster "$addr" --token-file "$tok" "$refs/j0.toml" --demand 4
  sed 's/^lr = 0.05/lr = "fast"/' "$refs/j0.toml" > "$work/bad.toml"
  expect2 "bad.toml" submit --cluster "$addr" --token-file "$tok" "$work/bad.toml"
  echo "not-the-token" > "$work/wrong"
  expect2 "refused the token" queue --cluster "$addr" --token-file "$work/wrong"
  expect2 "refused the token" submit --cluster "$addr" --token-file "$work/wrong" "$refs/j0.toml"
  n=$("$MORPH" queue --cluster "$addr" --token-file "$tok" --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["jobs"]))')
  [[ $n == 0 ]] || { echo "FAIL: $n jobs queued by refused submissions"; exit 1; }
  kill -TERM "$cluster_pid"; wait "$cluster_pid"; cluster_pid=""
  grep -q "cluster stopped" "$work/c.log" || { echo "FAIL: the cluster did not stop cleanly"; cat "$work/c.log"; exit 1; }
}

# The three policies, on copies of DIR's jobs and hashes in the scratch
# folder (cluster_live_check.py writes its clusters' folders beside them).
live() {
  local f
  for f in j0.toml j1.toml j2.toml j3.toml refs.json; do
    [[ -s "$refs/$f" ]] || { echo "FAIL: no $refs/$f: run the references first (ctest runs cluster.LiveReferences; by hand: $0 MORPH refs $refs)"; exit 1; }
  done
  mkdir -p "$work/live"
  write_jobs "$work/live"
  for f in j0.toml j1.toml j2.toml j3.toml; do
    cmp -s "$work/live/$f" "$refs/$f" || { echo "FAIL: $refs/$f is not the job this script writes (stale references: run them again)"; exit 1; }
  done
  cp "$refs/refs.json" "$work/live/refs.json"
  for policy in fifo wfs morph; do
    python3 "$HERE/cluster_live_check.py" "$MORPH" "$policy" "$work/live"
  done
}

if [[ $part != live ]]; then references; fi
if [[ $part != refs ]]; then live; fi
echo "PASS ($part)"
