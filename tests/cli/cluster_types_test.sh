#!/usr/bin/env bash
# Slot types in the live scheduler (docs/cluster.md, "Slot types"):
# `morph cluster --resources` with 1 fast slot and 1 slow one (slowdown 1.5)
# under the morph policy, two jobs with linear speed tables:
#  - A (priority 10, demand 2, long) is submitted first and starts on both
#    slots (2 slots at 1/1.5 each: 1.33 steps/s against 1 on the fast one);
#  - B (priority 1, demand 1, short) arrives: A shrinks to its fast slot (a
#    shrink releases the last rank, the slow one) and B starts on the slow
#    slot, its job's resources file listing one "slow" device, so that
#    `morph run --resources` emulates it;
#  - B ends and A grows back onto the slow slot; that new worker runs at
#    its slot's speed through `morph slow` (the cluster's slow.log says so).
# Both hashes equal their standalone runs'; the cluster never holds more
# slots of a type than exist (queue polls). Bad input: --slots that is not
# the resources' device count exits 2.
#
#   cluster_types_test.sh MORPH [PART [DIR]]
#
# PART "refs" writes the job and resources files (a.toml, b.toml, res.toml)
# and the standalone runs' hashes (refs.json) into DIR (those files removed
# first) and runs the bad-input check: nothing there depends on timing, so
# ctest runs it beside other tests (cluster.LiveSlotTypesReferences, a
# fixture). PART "live" runs the cluster on DIR's files (its resizes are
# timing-sensitive: ctest runs it alone, cluster.LiveSlotTypes); it fails
# if DIR lacks a file or if the files differ from the ones this script
# writes. "all" (default) runs both (DIR default: a scratch folder).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/shell_util.sh"
cluster_parts "$@"

# write_files DIR: the two jobs and the resources file.
write_files() {
  local no_replan=$'[elastic]\nstraggler_replan = false'
  STEPS=15000 mlp_job "$1/a.toml" A 1 "$no_replan"
  STEPS=200 mlp_job "$1/b.toml" B 2 "$no_replan"
  fast_and_slow 1.5 "$1/res.toml" 4096
}

references() {
  mkdir -p "$refs"
  rm -f "$refs"/a.toml "$refs"/b.toml "$refs"/res.toml "$refs/refs.json"
  write_files "$refs"
  for j in a b; do "$MORPH" run "$refs/$j.toml" --out "$work/ref-$j" --quiet --status off > /dev/null; done
  python3 - "$work" "$refs" <<'PY'
import json, os, sys
w, r = sys.argv[1], sys.argv[2]
json.dump({n: json.load(open(f"{w}/ref-{n}/summary.json"))["model_hash"] for n in "ab"}, open(f"{r}/refs.json.tmp", "w"))
os.replace(f"{r}/refs.json.tmp", f"{r}/refs.json")
PY
  set +e; "$MORPH" cluster --resources "$refs/res.toml" --slots 3 --out "$work/bad" > "$work/err.out" 2>&1; local rc=$?; set -e
  [[ $rc == 2 ]] && grep -qF "lists 2 devices, but --slots is 3" "$work/err.out" || { echo "FAIL: exit $rc"; cat "$work/err.out"; exit 1; }
}

live() {
  local f
  for f in a.toml b.toml res.toml refs.json; do
    [[ -s "$refs/$f" ]] || { echo "FAIL: no $refs/$f: run the references first (ctest runs cluster.LiveSlotTypesReferences; by hand: $0 MORPH refs $refs)"; exit 1; }
  done
  mkdir -p "$work/live"
  write_files "$work/live"
  for f in a.toml b.toml res.toml; do
    cmp -s "$work/live/$f" "$refs/$f" || { echo "FAIL: $refs/$f is not the file this script writes (stale references: run them again)"; exit 1; }
  done
  cp "$refs/refs.json" "$work/live/refs.json"
  cd "$work/live"
  "$MORPH" cluster --resources res.toml --policy morph --out c > c.log 2>&1 &
  cluster_pid=$!
  for _ in $(seq 1 200); do [[ -s c/address ]] && break; sleep 0.05; done
  addr=$(cat c/address)
  grep -q "2 slots" c.log || { echo "FAIL: the cluster does not have the resources' 2 slots"; cat c.log; exit 1; }
  "$MORPH" submit --cluster "$addr" --token-file c/token a.toml --priority 10 --demand 2 > /dev/null
  # B once A steps on both slots.
  for _ in $(seq 1 600); do grep -qs '"workers":2' c/jobs/0/metrics.jsonl && break; sleep 0.05; done
  grep -qs '"workers":2' c/jobs/0/metrics.jsonl || { echo "FAIL: A did not start on both slots"; cat c.log; exit 1; }
  "$MORPH" submit --cluster "$addr" --token-file c/token b.toml --priority 1 --demand 1 > /dev/null
  python3 - "$MORPH" "$addr" <<'PY' || { cat c.log; exit 1; }
import json, subprocess, sys, time
morph, addr = sys.argv[1], sys.argv[2]
deadline = time.time() + 240
while time.time() < deadline:
    q = json.loads(subprocess.check_output([morph, "queue", "--cluster", addr, "--token-file", "c/token", "--json"]))
    held = sum(j["workers"] for j in q["jobs"])
    assert held <= 2, q
    if all(j["state"] in ("done", "failed", "cancelled") for j in q["jobs"]) and len(q["jobs"]) == 2:
        break
    time.sleep(0.2)
else:
    sys.exit("FAIL: the jobs did not end in time")
refs = json.load(open("refs.json"))
for j, n in zip(q["jobs"], "ab"):
    assert j["state"] == "done", j
    assert j["model_hash"] == refs[n], (j, refs[n])
sa = json.load(open("c/jobs/0/summary.json"))
sb = json.load(open("c/jobs/1/summary.json"))
res_b = open("c/jobs/1/resources.toml").read()
assert sb.get("devices") == ["slow"], sb.get("devices")
assert 'type = "slow"' in res_b and 'type = "fast"' not in res_b, res_b
assert sa.get("devices", [None])[0] == "fast", sa.get("devices")
print("hashes equal; B ran on", sb["devices"], "A ended on", sa["devices"])
PY
  grep -q "job 0 resized 2 -> 1" c.log || { echo "FAIL: A did not shrink for B"; cat c.log; exit 1; }
  grep -q "job 0 resized 1 -> 2" c.log || { echo "FAIL: A did not grow back after B"; cat c.log; exit 1; }
  grep -q "to run 1.5 times slower" c/slow.log || { echo "FAIL: A's new worker was not slowed to its slot's type"; cat c/slow.log c.log; exit 1; }
}

if [[ $part != live ]]; then references; fi
if [[ $part != refs ]]; then live; fi
echo "PASS ($part)"
