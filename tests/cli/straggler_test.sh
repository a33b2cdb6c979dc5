#!/usr/bin/env bash
# Stragglers: on 3 workers, worker 1 is made 8x slower mid-run (`morph
# slow`). The manager must flag it within elastic.straggler_steps steps of
# the slowdown showing in the metrics, re-plan (a "straggler" entry in
# summary.json's resizes; worker 1 gets fewer VNs or is dropped), and the
# final model must equal the single-process run's; in float mode too (its
# control values ride in the gradient sum), without the hash. Also: `morph slow`
# exits 2 for a bad factor or an unknown worker. Then the same in a
# pipeline of 2 stages x 2 replicas: the slowed worker's replica gets fewer
# VNs (nothing moves), same hash.
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
make_work
WINDOW=4

cat > "$work/job.toml" <<TOML
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
hidden = [256, 128]
[batch]
global = 192
virtual_nodes = 12
[optim]
lr = 0.02
momentum = 0.9
[elastic]
straggler_factor = 2.0
straggler_steps = $WINDOW
TOML

ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)

# start_slowed NAME WORKER FACTOR RUN_ARGS...: runs the job with RUN_ARGS
# into $work/NAME (log $work/NAME.log) in the background (mpid, port) and,
# once 30 steps are in its metrics, makes WORKER FACTOR times slower. A VN
# here computes for about a millisecond, and on 2 shared cores the other
# workers' figures swing by 2-3x from step to step: 8x keeps a slowed
# worker clear of straggler_factor (2) against them (at 4x, noisy steps
# delayed the flag by 12 to 37 steps now and then).
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

start_slowed st 1 8 --workers 3

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

python3 - "$work/st" "$WINDOW" "$work/st.log" <<'PY'
import json, re, sys
out, window, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = [json.loads(l) for l in open(out + "/metrics.jsonl")]
summ = json.load(open(out + "/summary.json"))
# Each generation's members in rank order, from the manager's VN plans.
ranks = {int(m.group(1)): [int(w) for w in re.findall(r" w(\d+)=", m.group(2))]
         for m in re.finditer(r"generation (\d+), \d+ workers, VN plan:(.*)", open(log).read())}
def slow1(l):  # worker 1's figure at least 2x every other member's
    ids = ranks[l["generation"]]
    if 1 not in ids or "vn_seconds" not in l: return False
    s = dict(zip(ids, l["vn_seconds"]))
    return all(s[1] > 2 * v for i, v in s.items() if i != 1)
# The first step of the slowdown: worker 1 slow there and at the next 2.
onset = next(l["step"] for i, l in enumerate(lines) if all(slow1(x) for x in lines[i:i + 3]))
early = [r for r in summ["resizes"] if r["cause"] == "straggler" and r["detected_step"] < onset]
if early:
    print("note: re-plans before the slowdown (timing noise on shared cores): %s" % early)
st = [r for r in summ["resizes"] if r["cause"] == "straggler" and r["detected_step"] >= onset]
assert st, "FAIL: no straggler entry in resizes after step %d: %s" % (onset, summ["resizes"])
r = st[0]
assert {"step", "from", "to", "cause", "seconds"} <= set(r), r
# The first re-plan after the slowdown must shift work off worker 1, within
# the window. It is normally worker 1's own; on shared, overloaded cores
# another worker's timing noise may trigger it first, and that re-plan
# already uses worker 1's measured speed.
if r["worker"] != 1:
    print("note: the first re-plan after the slowdown was for worker %d (noise); it still counts" % r["worker"])
# Flagged at the line of the window's last slow step; the workers regroup at
# the next step boundary that sees the request (r["step"]: steps committed).
seen = r["detected_step"] - onset + 1
new_gen = next(l["generation"] for l in lines if l["step"] == r["step"])
members = ranks[new_gen]
print("slowdown from step %d, flagged at step %d (slow steps seen: %d, window %d), re-planned after step %d; "
      "%s -> %s workers, generation %d: members %s, VN shares %s; re-plan took %.3f s"
      % (onset, r["detected_step"], seen, window, r["step"] - 1, r["from"], r["to"], new_gen, members,
         r["vn_shares"], r["seconds"]))
# The window counts steps whose own figure is off by the factor, net of
# steps within it; on shared, overloaded cores a step of worker 1 can fall
# short of it (or another worker's can spike), each such step delaying the
# flag by two, so allow two of them here (tests/control/straggler_test.cpp
# checks the count exactly).
assert seen <= 2 * window, "FAIL: flagged after %d slow steps, window %d" % (seen, window)
assert r["step"] - 1 - r["detected_step"] <= 4, "FAIL: the re-plan took effect late"
if 1 in members:
    shares = dict(zip(members, r["vn_shares"]))
    assert all(shares[1] < n for i, n in shares.items() if i != 1), "FAIL: the slow worker kept %s" % shares
else:
    assert r["to"] == r["from"] - 1, r
before = [l["step_seconds"] for l in lines if onset + 1 <= l["step"] < r["step"]]
after = [l["step_seconds"] for l in lines if l["generation"] > 0][5:]
print("step seconds: while slow %.4f, after the re-plan %.4f" % (sum(before) / len(before), sum(after) / len(after)))
PY

# Float mode gathers the control values in the gradient sum (no MAX
# all-reduce): the members' seconds per VN still reach the manager, which
# re-plans around the slowed worker, and the workers follow its generation.
# Float steps are short, and `morph slow` (a process that loads libtorch)
# may take effect a hundred steps after it is started on a loaded machine:
# this job runs 600 steps (no hash to compare in float mode). (For the same
# reason the job above has 400: the bad-input calls need its manager.)
start_slowed fst 1 8 --workers 3 --set reduce.mode=float --steps 600
wait "$mpid" || { echo "FAIL: float mode exit $?"; cat "$work/fst.log"; exit 1; }
python3 - "$work/fst" "$work/fst.log" <<'PY'
import json, re, sys
out, log = sys.argv[1], sys.argv[2]
lines = [json.loads(l) for l in open(out + "/metrics.jsonl")]
assert all(len(l["vn_seconds"]) == l["workers"] and min(l["vn_seconds"]) > 0 for l in lines), "FAIL: float mode vn_seconds"
# Each generation's VN counts by worker id, in rank order, from the manager's log.
plans = {int(m.group(1)): {int(w): int(b) - int(a) for w, a, b in re.findall(r" w(\d+)=\[(\d+),(\d+)\)", m.group(2))}
         for m in re.finditer(r"generation (\d+), \d+ workers, VN plan:(.*)", open(log).read())}
def slow1(l):  # worker 1's figure at least 2x every other member's
    s = dict(zip(plans[l["generation"]], l["vn_seconds"]))
    return 1 in s and all(s[1] > 2 * v for i, v in s.items() if i != 1)
onset = next((l["step"] for i, l in enumerate(lines) if all(slow1(x) for x in lines[i:i + 3])), None)
assert onset is not None, "FAIL: float mode: worker 1's slowdown never showed in vn_seconds"
# A generation that starts after the slowdown and gives worker 1 fewer VNs
# than every other member, or leaves it out. Normally worker 1's own
# re-plan; on overloaded cores another worker's noise may trigger it first,
# and that re-plan already uses worker 1's measured speed.
first_step = {}
for l in lines:
    first_step.setdefault(l["generation"], l["step"])
around = [g for g, p in sorted(plans.items()) if first_step.get(g, -1) > onset
          and (1 not in p or all(p[1] < n for w, n in p.items() if w != 1))]
assert around, "FAIL: float mode: worker 1 was not re-planned around after step %d: %s" % (onset, plans)
resizes = [r for r in json.load(open(out + "/summary.json"))["resizes"] if r["cause"] == "straggler"]
assert resizes, "FAIL: float mode: no straggler entry in resizes"
print("float mode: slowdown from step %d, generation %d from step %d: VN counts %s"
      % (onset, around[0], first_step[around[0]], plans[around[0]]))
PY

# A pipeline: 2 stages x 2 replicas; worker 3 (stage 1 of replica 1) 4x
# slower (its stage's compute is the replica's whole step).
start_slowed pst 3 4 --workers 4 --stages 2
wait "$mpid" || { echo "FAIL: pipeline exit $?"; cat "$work/pst.log"; exit 1; }
got=$(tail -n 1 "$work/pst.log")
echo "pipeline straggler: $got"
[[ "$got" == "$ref" ]] || { echo "FAIL: pipeline hashes differ"; cat "$work/pst.log"; exit 1; }
grep "straggler" "$work/pst.log" || true
python3 - "$work/pst" "$work/pst.log" <<'PY'
import json, re, sys
out, log = sys.argv[1], sys.argv[2]
summ = json.load(open(out + "/summary.json"))
text = open(log).read()
ranks = {int(m.group(1)): [int(w) for w in re.findall(r" w(\d+)=", m.group(2))]
         for m in re.finditer(r"generation (\d+), \d+ workers, VN plan:(.*)", text)}
# Worker 3 flagged as slow, or its stage's other worker (1), judged against
# worker 3's time, flagged first as faster (ratio < 1): the same re-plan.
st = [r for r in summ["resizes"] if r["cause"] == "straggler" and
      (r.get("worker") == 3 or (r.get("worker") == 1 and r.get("ratio", 1) < 1))]
assert st, "FAIL: worker 3 was not re-planned around: %s" % summ["resizes"]
r = st[0]
assert r["from_shape"] == r["to_shape"] == [2, 2] and r["live"] and r.get("bytes_moved", 0) == 0, r
lines = [json.loads(l) for l in open(out + "/metrics.jsonl")]
gen = next(l["generation"] for l in lines if l["step"] == r["step"])
shares = dict(zip(ranks[gen], r["vn_shares"]))
print("pipeline re-plan after step %d: VNs per worker %s" % (r["step"] - 1, shares))
assert shares[3] < shares[ranks[gen][0]] or 3 in ranks[gen][:2], shares
rank3 = ranks[gen].index(3)
mine, other = shares[3], shares[ranks[gen][(rank3 + 2) % 4]]
assert mine < other, "FAIL: the slow worker's replica kept %d VNs against %d" % (mine, other)
PY
echo "straggler test passed"
