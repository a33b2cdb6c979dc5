#!/usr/bin/env bash
# The live cluster scheduler (docs/cluster.md): four small jobs with
# different priorities on a 3-slot `morph cluster` under fifo, wfs and
# morph (tests/cli/cluster_live_check.py: same hashes as the standalone
# runs, never more than 3 slots held, resizes under wfs and morph); then bad
# input: an unknown policy, a demand above the slots, a job file that fails
# validation (nothing queued), a wrong token, all exit 2.
set -euo pipefail
MORPH=$1
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/shell_util.sh"
work=$(mktemp -d)
cluster_pid=""
cleanup() {
  if [[ -n "$cluster_pid" ]]; then kill -TERM "$cluster_pid" 2>/dev/null || true; wait "$cluster_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# j0 runs first and longest: the others arrive while it runs. Straggler
# re-plans off: on busy cores one would shrink j0 before the scheduler does,
# and only the scheduler's resizes are under test.
no_replan=$'[elastic]\nstraggler_replan = false'
STEPS=2500 mlp_job "$work/j0.toml" j0 1 "$no_replan"
for i in 1 2 3; do STEPS=600 mlp_job "$work/j$i.toml" "j$i" $((i + 1)) "$no_replan"; done
# Standalone references: each job alone, in one process.
for i in 0 1 2 3; do
  "$MORPH" run "$work/j$i.toml" --out "$work/ref$i" --quiet --status off > /dev/null
done
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
json.dump({str(i): json.load(open(f"{w}/ref{i}/summary.json"))["model_hash"] for i in range(4)}, open(f"{w}/refs.json", "w"))
PY

for policy in fifo wfs morph; do
  python3 "$HERE/cluster_live_check.py" "$MORPH" "$policy" "$work"
done

# Bad input.
expect2() {  # expect2 PATTERN ARGS...
  local pattern=$1; shift
  set +e; "$MORPH" "$@" > "$work/err" 2>&1; local rc=$?; set -e
  [[ $rc == 2 ]] || { echo "FAIL: exit $rc for $*"; cat "$work/err"; exit 1; }
  grep -qF -- "$pattern" "$work/err" || { echo "FAIL: no '$pattern' for $*"; cat "$work/err"; exit 1; }
}
expect2 "unknown policy 'lifo'" cluster --slots 3 --policy lifo --out "$work/bad"
expect2 "morph cluster needs --slots N" cluster --out "$work/bad"
"$MORPH" cluster --slots 3 --out "$work/c" > "$work/c.log" 2>&1 &
cluster_pid=$!
for _ in $(seq 1 200); do [[ -s "$work/c/address" ]] && break; sleep 0.05; done
addr=$(cat "$work/c/address")
tok="$work/c/token"
expect2 "--demand 4: the cluster has 3 slots" submit --cluster "$addr" --token-file "$tok" "$work/j0.toml" --demand 4
sed 's/^lr = 0.05/lr = "fast"/' "$work/j0.toml" > "$work/bad.toml"
expect2 "bad.toml" submit --cluster "$addr" --token-file "$tok" "$work/bad.toml"
echo "not-the-token" > "$work/wrong"
expect2 "refused the token" queue --cluster "$addr" --token-file "$work/wrong"
expect2 "refused the token" submit --cluster "$addr" --token-file "$work/wrong" "$work/j0.toml"
n=$("$MORPH" queue --cluster "$addr" --token-file "$tok" --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["jobs"]))')
[[ $n == 0 ]] || { echo "FAIL: $n jobs queued by refused submissions"; exit 1; }
kill -TERM "$cluster_pid"; wait "$cluster_pid"; cluster_pid=""
grep -q "cluster stopped" "$work/c.log" || { echo "FAIL: the cluster did not stop cleanly"; cat "$work/c.log"; exit 1; }
echo PASS
