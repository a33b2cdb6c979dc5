#!/usr/bin/env bash
# morph cluster generate / simulate (docs/cluster.md) through the binary:
# the seeded generator gives the same file twice; VirtualFlow's example
# (A demands 2, B demands 8, 8 slots) gives the hand-computed figures under
# each policy; a trace job given as a job file and a calibration profile
# runs at the step time `morph plan` predicts; bad input exits 2 naming the
# file, job and key.
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# Seeded generator: same seed, same trace; another seed, another trace.
"$MORPH" cluster generate --jobs 20 --per-hour 12 --seed 5 --out a.json >/dev/null
"$MORPH" cluster generate --jobs 20 --per-hour 12 --seed 5 > b.json
"$MORPH" cluster generate --jobs 20 --per-hour 12 --seed 6 > c.json
cmp a.json b.json || { echo "FAIL: the same seed gave two traces"; exit 1; }
if cmp -s a.json c.json; then echo "FAIL: seeds 5 and 6 gave the same trace"; exit 1; fi

# VirtualFlow's example in time: A 100 steps at 1 step/s on 2 workers; B 800
# steps, linear (8 s a step on one worker); resizes cost 10 s.
cat > vf.json <<'JSON'
{"jobs": [
 {"name": "A", "arrival": 0, "priority": 1, "demand": 2, "steps": 100, "step_seconds": {"1": 2, "2": 1}},
 {"name": "B", "arrival": 0, "priority": 1, "demand": 8, "steps": 800,
  "step_seconds": {"1": 8, "2": 4, "3": 2.6666666666666665, "4": 2, "5": 1.6, "6": 1.3333333333333333, "7": 1.1428571428571428, "8": 1}}
]}
JSON
for p in fifo wfs morph; do
  "$MORPH" cluster simulate vf.json --slots 8 --policy $p --resize-seconds 10 --json > $p.out
done
python3 - <<'PY'
import json
want = {  # policy: (makespan, mean JCT, mean queue, B's resizes)
    "fifo": (900, 500, 50, 0),      # B waits for A, then 800 s on 8
    "wfs": (860, 480, 0, 1),        # B on 4 beside A, 8 after A (10 s pause)
    "morph": (835, 467.5, 0, 1),    # B on 6 beside A, 8 after A (10 s pause)
}
for p, (mk, jct, q, rs) in want.items():
    d = json.load(open(p + ".out"))
    for key in ("makespan_seconds", "mean_jct_seconds", "median_jct_seconds", "mean_queue_seconds", "utilisation"):
        assert key in d, (p, key)
    assert abs(d["makespan_seconds"] - mk) < 1e-6, (p, d["makespan_seconds"])
    assert abs(d["mean_jct_seconds"] - jct) < 1e-6, (p, d["mean_jct_seconds"])
    assert abs(d["mean_queue_seconds"] - q) < 1e-6, (p, d["mean_queue_seconds"])
    assert d["jobs"][1]["resizes"] == rs, (p, d["jobs"][1])
    for row in d["allocations"]:
        assert sum(row["workers"]) <= 8, (p, row)
print("vf example ok")
PY
"$MORPH" cluster simulate vf.json --slots 8 --policy fifo > fifo.txt
grep -q "^makespan_seconds   900.0" fifo.txt || { echo "FAIL: text output"; cat fifo.txt; exit 1; }
grep -q "allocations" fifo.txt || { echo "FAIL: no allocation table"; cat fifo.txt; exit 1; }

# A job given as a job file and its profile: on its demand of 2 workers, a
# lone job takes steps x the step time `morph plan --workers 2` predicts.
mkdir sub
mlp_job sub/job.toml cl 1
"$MORPH" calibrate sub/job.toml --out sub/prof.json --budget 0.2 --quiet >/dev/null
cat > sub/t.json <<'JSON'
{"jobs": [{"name": "mlp", "arrival": 0, "priority": 1, "demand": 2, "steps": 1000, "job": "job.toml", "profile": "prof.json"}]}
JSON
"$MORPH" cluster simulate sub/t.json --slots 2 --policy fifo --json > prof.out
"$MORPH" plan sub/job.toml --profile sub/prof.json --workers 2 --top 1 --json > plan.out
python3 - <<'PY'
import json
d = json.load(open("prof.out"))
step = json.load(open("plan.out"))["plans"][0]["step_seconds"]
jct = d["jobs"][0]["jct_seconds"]
assert abs(jct - 1000 * step) <= 1e-9 * jct, (jct, 1000 * step)
print("profile job ok", jct)
PY

# Slot types (a resources file): 1 fast slot and 1 three times slower. The
# job's speed on each allocation is the planner's on those devices: fifo
# (types unknown to it) places it on both slots, as `morph plan --resources`
# with both devices predicts; morph takes whichever of fast alone and
# fast + slow the planner predicts faster (a tie to fewer slots).
fast_and_slow 3.0 sub/res.toml 4096
"$MORPH" cluster simulate sub/t.json --resources sub/res.toml --policy fifo --json > typed-fifo.out
"$MORPH" cluster simulate sub/t.json --resources sub/res.toml --policy morph --json > typed-morph.out
"$MORPH" plan sub/job.toml --profile sub/prof.json --resources sub/res.toml --top 1 --json > plan-both.out
"$MORPH" plan sub/job.toml --profile sub/prof.json --workers 1 --top 1 --json > plan-fast.out
python3 - <<'PY'
import json
both = json.load(open("plan-both.out"))["plans"][0]["step_seconds"]
fast = json.load(open("plan-fast.out"))["plans"][0]["step_seconds"]
f = json.load(open("typed-fifo.out"))
m = json.load(open("typed-morph.out"))
assert [t["name"] for t in f["types"]] == ["fast", "slow"], f["types"]
assert f["allocations"][0]["by_type"] == [[1, 1]], f["allocations"][0]
assert abs(f["jobs"][0]["jct_seconds"] - 1000 * both) <= 1e-9 * 1000 * both, (f["jobs"][0], both)
best = min(fast, both)
assert abs(m["jobs"][0]["jct_seconds"] - 1000 * best) <= 1e-9 * 1000 * best, (m["jobs"][0], fast, both)
assert m["allocations"][0]["by_type"] == [[1, 1] if both < fast * (1 - 1e-12) else [1, 0]], (m["allocations"][0], fast, both)
print("slot types ok: fast alone %.3g ms, fast + slow %.3g ms per step" % (fast * 1e3, both * 1e3))
PY

# Bad input: exit 2, the file, the job and the key named.
expect2() {  # expect2 PATTERN ARGS...
  local pattern=$1; shift
  set +e; "$MORPH" "$@" > err.out 2>&1; local rc=$?; set -e
  [[ $rc == 2 ]] || { echo "FAIL: exit $rc for $*"; cat err.out; exit 1; }
  grep -qF "$pattern" err.out || { echo "FAIL: no '$pattern' for $*"; cat err.out; exit 1; }
}
expect2 "unknown policy 'lifo' (expected fifo, wfs or morph)" cluster simulate vf.json --slots 8 --policy lifo
expect2 "jobs[1] (B): demand 8 is above the 4 slots" cluster simulate vf.json --slots 4
expect2 "nope.json: cannot read the trace" cluster simulate nope.json --slots 4
sed 's/"priority": 1, "demand": 2/"priority": 1, "demand": "two"/' vf.json > bad.json
expect2 "bad.json: jobs[0] (A).demand: expected an integer worker count >= 1" cluster simulate bad.json --slots 8
sed 's/"job.toml"/"missing.toml"/' sub/t.json > sub/bad.json
expect2 "missing.toml" cluster simulate sub/bad.json --slots 2
expect2 "lists 2 devices, but --slots is 3" cluster simulate sub/t.json --slots 3 --resources sub/res.toml
expect2 "needs --slots N or --resources FILE" cluster simulate vf.json
echo PASS
