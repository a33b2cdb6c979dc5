#!/usr/bin/env python3
"""Two builds of morph against each other on one job, by wall clock.

For a change to the step itself (what is reduced, how often): runs one of
vs_ddp.py's models (default the MLP) on W local workers (default 2) for S
steps with build A and build B in turn, R rounds (the order alternating),
and prints per build the median over rounds of the wall time per steady
step (the unix_time of the metrics lines after the first 50 steps: all
between steps counts) and of the reduction wait (`reduce_seconds`), and
B / A. Results are compared too: an exact job must give both builds the
same model_hash, or the script stops. With --stages P the job is a
pipeline of P stages x W / P replicas.

  /usr/bin/python3 bench/builds_ab.py --a OLD/morph --b build/morph [--model mlp]
      [--mode exact|exact32|float] [--workers 2] [--stages P] [--steps 700] [--rounds 4]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vs_ddp  # noqa: E402  (the models' job files)


def run(binary, a, tmp):
    cmd, out = vs_ddp.morph_cmd(binary, a.model, a.workers, a.mode, a.steps, tmp)
    if a.stages > 1:
        cmd += ["--stages", str(a.stages)]
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    steady = [l for l in lines if "step_seconds" in l][50:]
    if len(steady) < 10:
        sys.exit("builds_ab: too few steps for a steady window; raise --steps")
    wall = (steady[-1]["unix_time"] - steady[0]["unix_time"]) / (len(steady) - 1)
    return wall, statistics.median(l["reduce_seconds"] for l in steady), r.stdout.strip().splitlines()[-1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="the baseline morph binary")
    p.add_argument("--b", required=True, help="the morph binary compared with it")
    vs_ddp.add_job_args(p, steps=700, morph=False)
    p.add_argument("--mode", default="exact", choices=["exact", "exact32", "float"])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--stages", type=int, default=1, help="a pipeline of this many stages (default 1: data parallel)")
    a = p.parse_args()
    if a.stages < 1 or a.workers % a.stages:
        p.error(f"--stages {a.stages}: expected a divisor of --workers {a.workers}")
    for b in (a.a, a.b):
        if not os.access(b, os.X_OK):
            p.error(f"{b}: not an executable morph binary")
    tmp = tempfile.mkdtemp(prefix="builds_ab-")
    res = {"A": [], "B": []}
    hashes = {}
    try:
        for rnd in range(a.rounds):
            for name in (["A", "B"] if rnd % 2 == 0 else ["B", "A"]):
                wall, red, h = run(a.a if name == "A" else a.b, a, tmp)
                res[name].append((wall, red))
                hashes.setdefault(name, h)
                print(f"round {rnd}: {name}: {wall * 1e3:.2f} ms/step, reduce {red * 1e3:.2f} ms", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.mode != "float" and hashes["A"] != hashes["B"]:
        sys.exit(f"builds_ab: the builds trained different models: A {hashes['A']}, B {hashes['B']}")
    shape = f", {a.stages} stages x {a.workers // a.stages} replicas" if a.stages > 1 else ""
    print(f"{a.model}, {a.mode}, {a.workers} workers{shape}, {a.steps} steps; medians of {a.rounds} rounds")
    print(f"{'build':6} {'ms/step':>8} {'reduce ms':>9}")
    wall = {}
    for name in ("A", "B"):
        wall[name] = statistics.median(x[0] for x in res[name])
        print(f"{name:6} {wall[name] * 1e3:8.2f} {statistics.median(x[1] for x in res[name]) * 1e3:9.2f}")
    print(f"B / A wall time per step: {wall['B'] / wall['A']:.3f}")


if __name__ == "__main__":
    main()
