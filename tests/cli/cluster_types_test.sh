#!/usr/bin/env bash
# Slot types in the live scheduler (docs/cluster.md, "Slot types"):
# `morph cluster --resources` with 1 fast slot and 1 slow one (slowdown 1.5)
# under the morph policy, two jobs with linear speed tables:
#  - A (priority 10, demand 2, 3100 steps) is submitted first and starts on
#    both slots (2 slots at 1/1.5 each: 1.33 steps/s against 1 on the fast
#    one);
#  - B (priority 1, demand 1, 1000 steps) arrives: the policy keeps A on
#    the fast slot and gives B the slow one (weights priority / steps
#    left^2: B's 1 / 1000^2 lies between half and all of A's 10 / 3100^2
#    for as long as A has 2240 to 3160 steps left; with 600 steps B would
#    take the fast slot, with 1500 it would wait for A), so A shrinks
#    releasing its slow worker by id and B starts on
#    the slow slot, its job's resources file listing one "slow" device, so
#    that `morph run --resources` emulates it;
#  - B ends and A grows back onto the slow slot; that new worker runs at
#    its slot's speed through `morph slow` (the cluster's slow.log says so).
#    A must still run when B ends: A's layer is 512 wide (about 2.5 ms a
#    step here against B's 1.3 ms on the slow slot), so that its 2700-odd
#    steps left outlast B's start and 1000 steps (here A had 1800-1900
#    left when B ended). With A as small as B, the two took about the
#    same wall time whatever the step counts say, and A could end first
#    (CI, 2026-12-05).
# Both hashes equal their standalone runs'; the cluster never holds more
# slots of a type than exist (queue polls). Bad input: --slots that is not
# the resources' device count exits 2.
#
# PART "move", a move between slot types at an unchanged count (the same
# slots and policy): F (priority 10, demand 1, 3000 steps) is submitted
# first and takes the fast slot, M (priority 1, demand 1, 4000 steps) the
# slow one; when F ends the policy wants M on the fast slot at the same count, and
# the scheduler moves it: a new worker joins on the fast slot (M on 2
# workers, one slot more held in between), then the slow one, worker 0, is
# released by id (`morph resize --release 0`). M's hash equals its
# standalone run's; it ends on the worker that joined (its summary's
# devices: [null], not its file's "slow" device); the queue shows M on the
# slow slot, then on the fast one, never more slots of a type than exist.
#
#   cluster_types_test.sh MORPH [PART [DIR]]
#
# PART "refs" writes the job and resources files (a.toml, b.toml, f.toml,
# m.toml, res.toml) and the standalone runs' hashes (refs.json) into DIR (those
# files removed first) and runs the bad-input check: nothing there depends
# on timing, so ctest runs it beside other tests
# (cluster.LiveSlotTypesReferences, a fixture). PARTs "live" and "move" run
# the cluster on DIR's files (their resizes are timing-sensitive: ctest
# runs each alone, cluster.LiveSlotTypes and cluster.LiveSlotTypesMove);
# they fail if DIR lacks a file or if the files differ from the ones this
# script writes. "all" (default) runs the three (DIR default: a scratch
# folder).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/shell_util.sh"
CLUSTER_LIVE_PARTS="live move"
cluster_parts "$@"

# write_files DIR: the two jobs and the resources file.
write_files() {
  local no_replan=$'[elastic]\nstraggler_replan = false'
  STEPS=3100 HIDDEN=512 mlp_job "$1/a.toml" A 1 "$no_replan"
  STEPS=1000 mlp_job "$1/b.toml" B 2 "$no_replan"
  STEPS=3000 mlp_job "$1/f.toml" F 4 "$no_replan"
  STEPS=4000 mlp_job "$1/m.toml" M 3 "$no_replan"
  fast_and_slow 1.5 "$1/res.toml" 4096
}

references() {
  mkdir -p "$refs"
  rm -f "$refs"/a.toml "$refs"/b.toml "$refs"/f.toml "$refs"/m.toml "$refs"/res.toml "$refs/refs.json"
  write_files "$refs"
  for j in a b f m; do "$MORPH" run "$refs/$j.toml" --out "$work/ref-$j" --quiet --status off > /dev/null; done
  python3 - "$work" "$refs" <<'PY'
import json, os, sys
w, r = sys.argv[1], sys.argv[2]
json.dump({n: json.load(open(f"{w}/ref-{n}/summary.json"))["model_hash"] for n in "abfm"}, open(f"{r}/refs.json.tmp", "w"))
os.replace(f"{r}/refs.json.tmp", f"{r}/refs.json")
PY
  set +e; "$MORPH" cluster --resources "$refs/res.toml" --slots 3 --out "$work/bad" > "$work/err.out" 2>&1; local rc=$?; set -e
  [[ $rc == 2 ]] && grep -qF "lists 2 devices, but --slots is 3" "$work/err.out" || { echo "FAIL: exit $rc"; cat "$work/err.out"; exit 1; }
}

# live_cluster FOLDER: the reference files written and checked into
# $work/FOLDER, the cluster started there ($cluster_pid, $addr).
live_cluster() {
  local f
  for f in a.toml b.toml f.toml m.toml res.toml refs.json; do
    [[ -s "$refs/$f" ]] || { echo "FAIL: no $refs/$f: run the references first (ctest runs cluster.LiveSlotTypesReferences; by hand: $0 MORPH refs $refs)"; exit 1; }
  done
  mkdir -p "$work/$1"
  write_files "$work/$1"
  for f in a.toml b.toml f.toml m.toml res.toml; do
    cmp -s "$work/$1/$f" "$refs/$f" || { echo "FAIL: $refs/$f is not the file this script writes (stale references: run them again)"; exit 1; }
  done
  cp "$refs/refs.json" "$work/$1/refs.json"
  cd "$work/$1"
  "$MORPH" cluster --resources res.toml --policy morph --out c > c.log 2>&1 &
  cluster_pid=$!
  for _ in $(seq 1 200); do [[ -s c/address ]] && break; sleep 0.05; done
  addr=$(cat c/address)
  grep -q "2 slots" c.log || { echo "FAIL: the cluster does not have the resources' 2 slots"; cat c.log; exit 1; }
}

live() {
  live_cluster live
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

move() {
  live_cluster move
  "$MORPH" submit --cluster "$addr" --token-file c/token f.toml --priority 10 --demand 1 > /dev/null
  "$MORPH" submit --cluster "$addr" --token-file c/token m.toml --priority 1 --demand 1 > /dev/null
  python3 - "$MORPH" "$addr" <<'PY' || { cat c.log; exit 1; }
import json, subprocess, sys, time
morph, addr = sys.argv[1], sys.argv[2]
deadline = time.time() + 120
seen = []  # M's slot types, each change
# c/queue.json: the queue after every change, read every 20 ms (a `morph
# queue` process each time would miss M's seconds on the slow slot on a
# busy machine).
while time.time() < deadline:
    try:
        q = json.load(open("c/queue.json"))
    except (OSError, ValueError):
        time.sleep(0.02)
        continue
    for t in ("fast", "slow"):
        assert sum(j["slot_types"].get(t, 0) for j in q["jobs"]) <= 1, q
    m = q["jobs"][1]["slot_types"] if len(q["jobs"]) == 2 else {}
    if m and (not seen or seen[-1] != m):
        seen.append(m)
    if len(q["jobs"]) == 2 and all(j["state"] in ("done", "failed", "cancelled") for j in q["jobs"]):
        break
    time.sleep(0.02)
else:
    sys.exit("FAIL: the jobs did not end in time")
q = json.loads(subprocess.check_output([morph, "queue", "--cluster", addr, "--token-file", "c/token", "--json"]))
assert all(j["slot_types"] == {} for j in q["jobs"]), q
refs = json.load(open("refs.json"))
for j, n in zip(q["jobs"], "fm"):
    assert j["state"] == "done", j
    assert j["model_hash"] == refs[n], (j, refs[n])
assert seen and seen[0] == {"slow": 1} and {"fast": 1} in seen, f"M's slots over time: {seen}"
assert seen.index({"fast": 1}) > 0 and seen[-1] == {"fast": 1}, f"M's slots over time: {seen}"
# M stepped on the slow slot alone before it moved (F, 3000 steps, ran long
# enough for that).
first = json.loads(open("c/jobs/1/metrics.jsonl").readline())
assert first["generation"] == 0 and first["workers"] == 1, ("M did not start alone on the slow slot", first)
sm = json.load(open("c/jobs/1/summary.json"))
# Worker 0 (the slow device of M's file) was released, the joiner stayed.
assert sm.get("devices") == [None], sm.get("devices")
assert [(r["from"], r["to"]) for r in sm["resizes"]] == [(1, 2), (2, 1)], sm["resizes"]
print("hashes equal; M's slots over time:", seen, "- ended on", sm["devices"])
PY
  grep -q "job 1: moving worker 0 (slow) to a fast slot" c.log || { echo "FAIL: M was not moved"; cat c.log; exit 1; }
  grep -q "job 1 moved: now on 1 fast" c.log || { echo "FAIL: M's move did not complete"; cat c.log; exit 1; }
  grep -q "resize requested: 2 -> 1 workers, releasing worker(s) 0" c/jobs/1/log || { echo "FAIL: M's manager was not asked to release worker 0"; cat c/jobs/1/log; exit 1; }
}

if [[ $part == refs || $part == all ]]; then references; fi
# Ends the cluster a part started (the next part starts its own).
stop_cluster() {
  kill -TERM "$cluster_pid" 2>/dev/null || true
  wait "$cluster_pid" 2>/dev/null || true
  cluster_pid=""
}
if [[ $part == live || $part == all ]]; then live; stop_cluster; fi
if [[ $part == move || $part == all ]]; then move; stop_cluster; fi
echo "PASS ($part)"
