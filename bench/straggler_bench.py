#!/usr/bin/env python3
"""Straggler: step time before a worker slows down, while it is slow, and
after the manager re-planned around it, against doing nothing
(elastic.straggler_replan = false) in the same run of this script.

Three workers train an MLP (synthetic data, 12 VNs); after --slow-at steps
worker 1 is made --factor times slower with `morph slow`. With --pipeline,
four workers train the same MLP as 2 stages x 2 replicas and worker 3 (the
last stage of replica 1) is slowed: the re-plan gives that replica fewer VNs.

Every figure is wall clock between step commits (`unix_time` of the
metrics lines), so what happens between steps counts: the re-plan (the
workers leave their generation, the manager publishes the next, they
regroup) lies between two steps and is inside these windows. A phase
[lo, hi) is the time from the commit of step lo - 1 to that of step hi - 1,
divided by its hi - lo steps:
  before:  steps [10, slowdown)
  during:  from the slowdown to the re-plan (replan run)
  re-plan: the first step of the new generation, the pause before it included
  after:   from 5 steps after the re-plan to the end (replan run)
The do-nothing run's phases are the same numbers of steps, counted from the
step where its own metrics first show the slowdown. The headline is the
whole window from the slowdown on: the seconds the same number of steps
took in each run, and their ratio re-plan / do nothing (< 1: re-planning
pays, its own cost included).
Re-plans before the slowdown (timing noise: 3 workers on a shared 2-core
machine) are counted and reported, not hidden.

  python3 bench/straggler_bench.py [--morph build/morph] [--factor 4] [--steps 600] [--pipeline] [--json out.json]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = """[job]
name = "straggler-bench"
seed = 3
steps = {steps}
[data]
dataset = "synthetic"
train_size = 1920
test_size = 64
[model]
name = "mlp"
hidden = {hidden}
[batch]
global = 192
virtual_nodes = 12
[optim]
lr = 0.02
momentum = 0.9
[elastic]
straggler_factor = 1.5
straggler_steps = 5
straggler_replan = {replan}
"""


def lines_of(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except FileNotFoundError:
        return []


def run(morph, work, tag, replan, a):
    job = os.path.join(work, tag + ".toml")
    with open(job, "w") as f:
        f.write(JOB.format(steps=a.steps, hidden=a.hidden, replan="true" if replan else "false"))
    out = os.path.join(work, tag)
    log = open(os.path.join(work, tag + ".log"), "w")
    shape = ["--workers", "4", "--stages", "2"] if a.pipeline else ["--workers", "3"]
    p = subprocess.Popen([morph, "run", job] + shape + ["--out", out], stdout=log, stderr=subprocess.STDOUT)
    metrics = os.path.join(out, "metrics.jsonl")
    port = None
    end = time.time() + 120
    while time.time() < end and (port is None or len(lines_of(metrics)) < a.slow_at):
        if port is None:
            for l in open(log.name):
                if "manager on port" in l:
                    port = l.split("manager on port")[1].split()[0].rstrip(",")
        time.sleep(0.02)
    subprocess.run([morph, "slow", "--join", "127.0.0.1:" + port, "--worker", str(a.slow_worker), "--factor", str(a.factor),
                    "--token-file", os.path.join(out, "token")], check=True, stdout=subprocess.DEVNULL)
    if p.wait() != 0:
        sys.exit("morph run failed: see " + log.name)
    lines = lines_of(metrics)
    summary = json.load(open(os.path.join(out, "summary.json")))
    with open(log.name) as f:
        text = f.read()
    # Each generation's members in rank order, from the manager's VN plans.
    ranks = {int(m.group(1)): [int(w) for w in re.findall(r" w(\d+)=", m.group(2))]
             for m in re.finditer(r"generation (\d+), \d+ workers, VN plan:(.*)", text)}
    return lines, summary, text.strip().splitlines()[-1], ranks


def onset_of(lines, ranks, w, peers):
    """First of 3 steps in a row where worker w's seconds per VN are over 2x its peers'
    (every other member's; in a pipeline, the other replica's worker of the same stage)."""
    def slow(l):
        ids = ranks.get(l["generation"], [])
        if w not in ids or "vn_seconds" not in l:
            return False
        s = dict(zip(ids, l["vn_seconds"]))
        return all(s[w] > 2 * v for i, v in s.items() if i != w and (peers is None or i in peers))
    for i, l in enumerate(lines):
        if all(slow(x) for x in lines[i:i + 3]):
            return l["step"]
    return None


def commits(lines):
    """{step: wall-clock time of its (last) commit}."""
    return {l["step"]: l["unix_time"] for l in lines}


def wall(t, lo, hi):
    """Seconds per step of steps [lo, hi): commit of hi - 1 minus commit of lo - 1."""
    if lo < 1 or hi <= lo or lo - 1 not in t or hi - 1 not in t:
        return float("nan")
    return (t[hi - 1] - t[lo - 1]) / (hi - lo)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    ap.add_argument("--factor", type=float, default=4.0)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--slow-at", type=int, default=150)
    ap.add_argument("--hidden", default="[512, 256]")
    ap.add_argument("--pipeline", action="store_true", help="2 stages x 2 replicas on 4 workers; worker 3 slowed")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    a.slow_worker = 3 if a.pipeline else 1
    peers = [1] if a.pipeline else None  # worker 1 runs stage 1 of replica 0
    work = tempfile.mkdtemp(prefix="straggler-bench-")
    on, on_sum, on_hash, on_ranks = run(a.morph, work, "replan", True, a)
    off, off_sum, off_hash, off_ranks = run(a.morph, work, "nothing", False, a)
    o_on = onset_of(on, on_ranks, a.slow_worker, peers)
    o_off = onset_of(off, off_ranks, a.slow_worker, peers)
    if o_on is None or o_off is None:
        sys.exit("the slowdown does not show in the metrics (%s, %s); see %s" % (o_on, o_off, work))
    early = [r for r in on_sum["resizes"] if r["cause"] == "straggler" and r["detected_step"] < o_on]
    st = [r for r in on_sum["resizes"] if r["cause"] == "straggler" and r["detected_step"] >= o_on and r["worker"] == a.slow_worker]
    if not st:
        sys.exit("no straggler re-plan for worker %d in %s" % (a.slow_worker, on_sum["resizes"]))
    r = st[0]
    replan_step = r["step"]
    t_on, t_off = commits(on), commits(off)
    n = a.steps - max(o_on, o_off)  # steps from each run's own onset of the slowdown
    window_on = (t_on[o_on - 1 + n] - t_on[o_on - 1])
    window_off = (t_off[o_off - 1 + n] - t_off[o_off - 1])
    res = {
        "factor": a.factor, "hidden": a.hidden, "steps": a.steps, "pipeline": a.pipeline,
        "window_steps": n, "window_seconds": {"replan": window_on, "nothing": window_off},
        "replan": {
            "before": wall(t_on, 10, o_on), "during": wall(t_on, o_on, replan_step),
            "replan": wall(t_on, replan_step, replan_step + 1),
            "after": wall(t_on, replan_step + 5, a.steps), "slow_from_step": o_on,
            "flagged_at_step": r["detected_step"], "replanned_after_step": replan_step - 1,
            "replan_seconds": r["seconds"], "vn_shares": r["vn_shares"], "dropped": r["dropped"],
            "model_hash": on_hash, "replans_before_slowdown": len(early),
            "replans_after": len([x for x in on_sum["resizes"] if x["cause"] == "straggler"]) - len(early) - 1,
        },
        "nothing": {
            # The same phases, counted from this run's own onset of the slowdown.
            "before": wall(t_off, 10, o_off), "during": wall(t_off, o_off, o_off + replan_step - o_on),
            "replan": wall(t_off, o_off + replan_step - o_on, o_off + replan_step - o_on + 1),
            "after": wall(t_off, o_off + replan_step + 5 - o_on, a.steps), "slow_from_step": o_off,
            "model_hash": off_hash,
        },
    }
    # Ideal after the re-plan: the new shares at the speeds measured then.
    print("straggler bench: %s, MLP %s, 12 VNs, worker %d made %gx slower at step ~%d (%s)"
          % ("2 stages x 2 replicas" if a.pipeline else "3 workers", a.hidden, a.slow_worker, a.factor, a.slow_at,
             a.morph))
    print("%-22s %10s %10s %10s %10s" % ("wall ms per step", "before", "slow", "re-plan", "after"))
    for k, name in (("nothing", "do nothing"), ("replan", "re-plan")):
        x = res[k]
        print("%-22s %10.2f %10.2f %10.2f %10.2f" % (name, x["before"] * 1e3, x["during"] * 1e3, x["replan"] * 1e3,
                                                     x["after"] * 1e3))
    print("the %d steps from the slowdown on: re-plan %.2f s, do nothing %.2f s, re-plan / do nothing %.3f"
          % (n, window_on, window_off, window_on / window_off))
    x = res["replan"]
    print("slow from step %d, flagged at step %d, re-planned after step %d (%.3f s to the first step of the new "
          "generation); new VN shares %s%s" % (x["slow_from_step"], x["flagged_at_step"], x["replanned_after_step"],
                                               x["replan_seconds"], x["vn_shares"], ", worker dropped" if x["dropped"] else ""))
    print("after / before: re-plan %.2f, do nothing %.2f; re-plans before the slowdown (noise) %d, after the first %d"
          % (x["after"] / x["before"], res["nothing"]["after"] / res["nothing"]["before"],
             x["replans_before_slowdown"], x["replans_after"]))
    print("model_hash equal: %s (%s); runs in %s" % (on_hash == off_hash, on_hash, work))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
