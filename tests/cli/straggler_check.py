#!/usr/bin/env python3
"""Checks of tests/cli/straggler_test.sh on one finished run.

straggler_check.py MODE OUT LOG WINDOW WORKER

MODE: "dp" (data parallel: the re-plan gives WORKER fewer VNs than every
other member, or drops it), or "pipe" (2 stages x 2 replicas: WORKER's
replica gets fewer VNs, nothing moves). OUT is the run's --out folder, LOG
the manager's output (its "generation G, N workers, VN plan: w<id>=[a,b)"
lines give each generation's members in rank order).

The onset is the first step whose metrics line shows the slowdown in
WORKER's own report: its seconds per VN (`vn_seconds`, rank order) at
least ONSET_RATIO x every other member's (a pipeline: its stage peer's),
at that step and the two after it. The manager must flag within WINDOW
steps of the onset, and nothing before it.
"""
import json
import re
import sys

ONSET_RATIO = 10.0

mode, out, log, window, worker = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
lines = [json.loads(l) for l in open(out + "/metrics.jsonl")]
summary = json.load(open(out + "/summary.json"))
text = open(log).read()
plans = {int(m.group(1)): [(int(w), int(b) - int(a)) for w, a, b in re.findall(r" w(\d+)=\[(\d+),(\d+)\)", m.group(2))]
         for m in re.finditer(r"generation (\d+), \d+ workers, VN plan:(.*)", text)}
ranks = {g: [w for w, _ in p] for g, p in plans.items()}


def fail(why):
    print("FAIL: %s\nresizes: %s" % (why, summary["resizes"]))
    sys.exit(1)


def peers(ids, me):
    if mode == "dp":
        return [i for i in ids if i != me]
    stages = summary["plan"]["stages"]
    r = ids.index(me)
    return [ids[k] for k in range(r % stages, len(ids), stages) if k != r]


def slowed(line):
    ids = ranks[line["generation"]]
    if worker not in ids or "vn_seconds" not in line:
        return False
    s = dict(zip(ids, line["vn_seconds"]))
    return all(s[worker] >= ONSET_RATIO * s[p] for p in peers(ids, worker))


onset = next((l["step"] for i, l in enumerate(lines) if all(slowed(x) for x in lines[i:i + 3])), None)
if onset is None:
    fail("worker %d's slowdown never showed in its own report (vn_seconds)" % worker)
stragglers = [r for r in summary["resizes"] if r["cause"] == "straggler"]
early = [r for r in stragglers if r["detected_step"] < onset]
if early:
    fail("re-planned before the slowdown began at step %d" % onset)
if not stragglers:
    fail("no straggler entry in resizes after the slowdown began at step %d" % onset)
r = stragglers[0]
if not {"step", "from", "to", "cause", "seconds", "worker", "detected_step"} <= set(r):
    fail("incomplete resize entry %s" % r)
if mode == "dp" and r["worker"] != worker:
    fail("the first re-plan after the slowdown flagged worker %d, not %d" % (r["worker"], worker))
if mode == "pipe":
    # A stage's watch compares its replicas: with two, the slowed worker is
    # slower, or its stage peer is equally "faster" (ratio < 1) than expected.
    stage_peer = peers(ranks[next(l["generation"] for l in lines if l["step"] == onset)], worker)
    if not (r["worker"] == worker and r["ratio"] > 1 or r["worker"] in stage_peer and r["ratio"] < 1):
        fail("the first re-plan after the slowdown flagged worker %d (ratio %.2f)" % (r["worker"], r["ratio"]))
# Flagged at the metrics line of the window's last slow step at the latest.
seen = r["detected_step"] - onset + 1
if seen > window:
    fail("flagged after %d slow steps, window %d" % (seen, window))
new_gen = next(l["generation"] for l in lines if l["step"] == r["step"])
if r["step"] - 1 - r["detected_step"] > 4:
    fail("the re-plan took effect %d steps after it was flagged" % (r["step"] - 1 - r["detected_step"]))
counts = dict(plans[new_gen])
if mode == "dp":
    if worker in counts:
        if not all(counts[worker] < n for w, n in counts.items() if w != worker):
            fail("the slow worker kept %s" % counts)
    elif r["to"] != r["from"] - 1:
        fail("dropped, but %s -> %s workers" % (r["from"], r["to"]))
else:
    if not (r["from_shape"] == r["to_shape"] == [2, 2] and r["live"] and r.get("bytes_moved", 0) == 0):
        fail("a pipeline straggler re-plan moves nothing: %s" % r)
    ids = ranks[new_gen]
    stages = summary["plan"]["stages"]
    mine = ids.index(worker) // stages
    share = [counts[ids[k * stages]] for k in range(len(ids) // stages)]
    if not all(share[mine] < n for k, n in enumerate(share) if k != mine):
        fail("the slow worker's replica kept %d VNs against %s" % (share[mine], share))
print("%s: slowdown from step %d, flagged at step %d (slow steps seen: %d, window %d), generation %d from step %d: "
      "VNs per worker %s; re-plan took %.3f s" % (mode, onset, r["detected_step"], seen, window, new_gen, r["step"],
                                                   counts, r["seconds"]))
