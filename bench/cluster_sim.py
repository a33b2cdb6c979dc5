#!/usr/bin/env python3
"""Cluster policies in simulation (docs/cluster.md): fifo, wfs and morph on
the same traces with `morph cluster simulate --json`.

  python3 bench/cluster_sim.py [--morph build/morph] [--seeds 10]

1. VirtualFlow's shape: 20 jobs arriving at 12 per hour on 8 slots. The
   committed trace bench/traces/vf20-seed1.json (`morph cluster generate
   --jobs 20 --per-hour 12 --seed 1`), then the mean over seeds 1..N of
   freshly generated traces (the generator is seeded: same seed, same trace).
   wfs is compared with fifo (VirtualFlow's log: makespan -46%, mean JCT
   -57%, utilisation 97.9% against 71.9%) and morph with wfs.
2. The same at scale: 256 slots, 500 jobs (arrivals 32x faster, 384 per
   hour, so the load per slot is the same), with the policy's decision time
   per event (mean and max over the run, wall clock of each policy call).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
POLICIES = ["fifo", "wfs", "morph"]


def simulate(morph, trace, slots, policy, resize):
    out = subprocess.run([morph, "cluster", "simulate", trace, "--slots", str(slots), "--policy", policy,
                          "--resize-seconds", str(resize), "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def generate(morph, path, jobs, per_hour, seed):
    subprocess.run([morph, "cluster", "generate", "--jobs", str(jobs), "--per-hour", str(per_hour),
                    "--seed", str(seed), "--out", path], check=True, capture_output=True)


def row(name, r):
    return (f"| {name} | {r['makespan_seconds'] / 3600:.2f} | {r['mean_jct_seconds'] / 3600:.2f} | "
            f"{r['median_jct_seconds'] / 3600:.2f} | {r['mean_queue_seconds'] / 3600:.2f} | "
            f"{100 * r['utilisation']:.1f} | {r['resizes']} | {r['decision_mean_ms']:.3f} | {r['decision_max_ms']:.3f} |")


HEADER = ("| policy | makespan h | mean JCT h | median JCT h | mean queue h | utilisation % | resizes | "
          "decision ms mean | decision ms max |\n|---|---|---|---|---|---|---|---|---|")


def pct(a, b):
    return 100.0 * (a - b) / b


def compare(res):
    f, w, m = res["fifo"], res["wfs"], res["morph"]
    print(f"wfs vs fifo: makespan {pct(w['makespan_seconds'], f['makespan_seconds']):+.1f}%, "
          f"mean JCT {pct(w['mean_jct_seconds'], f['mean_jct_seconds']):+.1f}%, utilisation "
          f"{100 * w['utilisation']:.1f}% vs {100 * f['utilisation']:.1f}% "
          f"(VirtualFlow's log: -46%, -57%, 97.9% vs 71.9%)")
    print(f"morph vs wfs: makespan {pct(m['makespan_seconds'], w['makespan_seconds']):+.1f}%, "
          f"mean JCT {pct(m['mean_jct_seconds'], w['mean_jct_seconds']):+.1f}%, utilisation "
          f"{100 * m['utilisation']:.1f}% vs {100 * w['utilisation']:.1f}% (goal: JCT -15% or better at >= utilisation)")


def run_set(morph, traces, slots, resize, title):
    per = {p: [] for p in POLICIES}
    for t in traces:
        for p in POLICIES:
            per[p].append(simulate(morph, t, slots, p, resize))
    keys = ["makespan_seconds", "mean_jct_seconds", "median_jct_seconds", "mean_queue_seconds", "utilisation",
            "resizes", "decision_mean_ms", "decision_max_ms"]
    mean = {p: {k: (max if k == "decision_max_ms" else statistics.mean)([r[k] for r in per[p]]) for k in keys}
            for p in POLICIES}
    print(f"\n{title}\n\n{HEADER}")
    for p in POLICIES:
        print(row(p, mean[p]))
    compare(mean)
    if len(traces) > 1:
        wins = sum(1 for i in range(len(traces))
                   if per["morph"][i]["mean_jct_seconds"] < per["wfs"][i]["mean_jct_seconds"])
        wf = [pct(per["wfs"][i]["mean_jct_seconds"], per["fifo"][i]["mean_jct_seconds"]) for i in range(len(traces))]
        mw = [pct(per["morph"][i]["mean_jct_seconds"], per["wfs"][i]["mean_jct_seconds"]) for i in range(len(traces))]
        print(f"per trace: wfs vs fifo mean JCT {min(wf):+.1f}% .. {max(wf):+.1f}%; morph vs wfs "
              f"{min(mw):+.1f}% .. {max(mw):+.1f}%; morph below wfs on {wins} of {len(traces)}")
    return mean


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=1,
                    help="generated traces use seeds FIRST..FIRST+SEEDS-1 (other seeds: a check held out from tuning)")
    ap.add_argument("--resize-seconds", type=float, default=0.6)
    ap.add_argument("--skip-large", action="store_true")
    a = ap.parse_args()
    committed = os.path.join(HERE, "traces", "vf20-seed1.json")
    run_set(a.morph, [committed], 8, a.resize_seconds,
            "VirtualFlow's shape, committed trace bench/traces/vf20-seed1.json (20 jobs, 12/h, 8 slots)")
    with tempfile.TemporaryDirectory() as d:
        traces = []
        last = a.first_seed + a.seeds - 1
        for s in range(a.first_seed, last + 1):
            p = os.path.join(d, f"vf20-{s}.json")
            generate(a.morph, p, 20, 12, s)
            traces.append(p)
        run_set(a.morph, traces, 8, a.resize_seconds,
                f"VirtualFlow's shape, mean over seeds {a.first_seed}..{last} (decision ms max: the largest)")
        if not a.skip_large:
            big = os.path.join(d, "big.json")
            generate(a.morph, big, 500, 384, 1)
            run_set(a.morph, [big], 256, a.resize_seconds, "256 slots, 500 jobs at 384/h (seed 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
