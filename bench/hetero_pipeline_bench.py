#!/usr/bin/env python3
"""A heterogeneous pipeline (docs/resources.md): gpt-mini with 4 blocks (7
layers) on 4 emulated devices of 2 types, two normal and two twice as slow
(slowdown 2, less memory), one replica of 4 stages, 1F1B, 8 VNs.

Three cuts, each predicted (`morph simulate --resources --plan`) and
measured (`morph run --resources --plan`, median wall-clock time between
step commits over the steady steps):

  planner   `morph plan --resources`: device order and cut chosen together
            (bestDevicePipeline), the best 4-stage plan
  even      an equal-layer-count split, devices in slot order (normal first)
  homog     the planner's cut for 4 identical devices (`morph plan
            --workers 4`), devices in slot order

and the ratios even/planner and homog/planner. Every run's model_hash must
equal the single-process one (checked).

Usage: python3 bench/hetero_pipeline_bench.py [--morph build/morph] [--steps 25]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

JOB = os.path.join(os.path.dirname(__file__), "..", "examples", "fortunes-gpt.toml")
SETS = ["--set", "model.layers=4", "--set", "batch.global=64", "--set", "batch.virtual_nodes=8",
        "--set", "eval.every=0"]
NAMES = ["embed", "block1", "block2", "block3", "block4", "norm", "head"]
WARMUP = 5


def plan_file(path, cuts, workers):
    stages = [[NAMES[cuts[k]], NAMES[cuts[k + 1] - 1]] for k in range(len(cuts) - 1)]
    with open(path, "w") as f:
        json.dump({"stages": stages, "replicas": 1, "schedule": "1f1b", "recompute": False, "workers": workers}, f)


def best4(out):
    return next(p for p in json.loads(out)["plans"] if p["stages"] == 4 and p["replicas"] == 1
                and p["schedule"] == "1f1b" and not p["recompute"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(os.path.dirname(__file__), "..", "build", "morph"))
    ap.add_argument("--steps", type=int, default=25)
    a = ap.parse_args()
    m = a.morph
    tmp = tempfile.mkdtemp(prefix="morph_hetpipe_")
    res = os.path.join(tmp, "res.toml")
    with open(res, "w") as f:
        f.write("[types.normal]\nmemory_mib = 8192\n[types.slow]\nmemory_mib = 4096\nslowdown = 2\n"
                "[[devices]]\ntype = \"normal\"\ncount = 2\n[[devices]]\ntype = \"slow\"\ncount = 2\n")
    prof = os.path.join(tmp, "profile.json")
    subprocess.run([m, "calibrate", JOB, "--out", prof, "--quiet"] + SETS, check=True, stdout=subprocess.DEVNULL)
    ref = subprocess.run([m, "run", JOB, "--steps", str(a.steps), "--quiet", "--out", os.path.join(tmp, "ref")] + SETS,
                         check=True, capture_output=True, text=True)
    ref_hash = re.findall(r"model_hash: (\w+)", ref.stdout)[-1]
    het = best4(subprocess.run([m, "plan", JOB, "--profile", prof, "--resources", res, "--json", "--top", "1000"]
                               + SETS, check=True, capture_output=True, text=True).stdout)
    hom = best4(subprocess.run([m, "plan", JOB, "--profile", prof, "--workers", "4", "--json", "--top", "1000"]
                               + SETS, check=True, capture_output=True, text=True).stdout)
    plans = {"planner": (het["cuts"], het["workers"]), "even": ([0, 1, 3, 5, 7], [0, 1, 2, 3]),
             "homog": (hom["cuts"], [0, 1, 2, 3])}
    rows = {}
    print(f"{'cut':8s} {'layers per stage':18s} {'devices':10s} {'predicted ms':>12s} {'measured ms':>12s}")
    for name, (cuts, workers) in plans.items():
        pf = os.path.join(tmp, name + ".json")
        plan_file(pf, cuts, workers)
        sim = json.loads(subprocess.run([m, "simulate", JOB, "--profile", prof, "--plan", pf, "--resources", res,
                                         "--workers", "4", "--json"] + SETS,
                                        check=True, capture_output=True, text=True).stdout)
        out = os.path.join(tmp, "run_" + name)
        r = subprocess.run([m, "run", JOB, "--steps", str(a.steps), "--quiet", "--out", out, "--resources", res,
                            "--plan", pf] + SETS, check=True, capture_output=True, text=True)
        h = re.findall(r"model_hash: (\w+)", r.stdout)[-1]
        assert h == ref_hash, f"{name}: hash {h} differs from the single-process {ref_hash}"
        with open(os.path.join(out, "metrics.jsonl")) as f:
            t = [json.loads(l)["unix_time"] for l in f]
        meas = statistics.median([b - x for x, b in zip(t[WARMUP:-2], t[WARMUP + 1:-1])])
        rows[name] = (sim["step_seconds"], meas)
        sizes = "/".join(str(cuts[k + 1] - cuts[k]) for k in range(4))
        kinds = "".join("N" if w < 2 else "S" for w in workers)
        print(f"{name:8s} {sizes:18s} {kinds:10s} {sim['step_seconds'] * 1e3:12.1f} {meas * 1e3:12.1f}", flush=True)
    for other in ("even", "homog"):
        print(f"{other}/planner: predicted {rows[other][0] / rows['planner'][0]:.3f}, "
              f"measured {rows[other][1] / rows['planner'][1]:.3f}")
    print(f"every model_hash equals the single-process {ref_hash}")


if __name__ == "__main__":
    sys.exit(main())
