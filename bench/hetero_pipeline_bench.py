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

and the ratios even/planner and homog/planner.

Then HetPipe's allocation policies on the same 4 devices (one host):
`morph plan --resources --json` gives each policy's best plan (NP: one
group of all four; ED and HD: two groups of a normal and a slow device,
each group in its own order, VN shares by group speed) and the planner's
choice; each is predicted and measured as above, with ratios to the
planner's.

Every run's model_hash must equal the single-process one (checked).

Usage: python3 bench/hetero_pipeline_bench.py [--morph build/morph] [--steps 25]
                                              [--only cuts|allocations]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from resources_file import write_two_types

JOB = os.path.join(os.path.dirname(__file__), "..", "examples", "fortunes-gpt.toml")
SETS = ["--set", "model.layers=4", "--set", "batch.global=64", "--set", "batch.virtual_nodes=8",
        "--set", "eval.every=0"]
NAMES = ["embed", "block1", "block2", "block3", "block4", "norm", "head"]
WARMUP = 5


def plan_file(path, cuts, workers, replicas=1, schedule="1f1b", recompute=False, shares=None):
    stages = [[NAMES[cuts[k]], NAMES[cuts[k + 1] - 1]] for k in range(len(cuts) - 1)]
    plan = {"stages": stages, "replicas": replicas, "recompute": recompute, "workers": workers}
    if len(stages) > 1:
        plan["schedule"] = schedule
    if shares:
        plan["vn_shares"] = shares
    with open(path, "w") as f:
        json.dump(plan, f)


def predict_and_measure(m, tmp, prof, res, pf, name, steps, ref_hash, workers=4):
    """(predicted, measured) step seconds of plan file pf on the devices."""
    sim = json.loads(subprocess.run([m, "simulate", JOB, "--profile", prof, "--plan", pf, "--resources", res,
                                     "--workers", str(workers), "--json"] + SETS,
                                    check=True, capture_output=True, text=True).stdout)
    out = os.path.join(tmp, "run_" + name)
    r = subprocess.run([m, "run", JOB, "--steps", str(steps), "--quiet", "--out", out, "--resources", res,
                        "--plan", pf] + SETS, check=True, capture_output=True, text=True)
    h = re.findall(r"model_hash: (\w+)", r.stdout)[-1]
    assert h == ref_hash, f"{name}: hash {h} differs from the single-process {ref_hash}"
    with open(os.path.join(out, "metrics.jsonl")) as f:
        t = [json.loads(l)["unix_time"] for l in f]
    return sim["step_seconds"], statistics.median([b - x for x, b in zip(t[WARMUP:-2], t[WARMUP + 1:-1])])


def allocations(m, tmp, prof, res, steps, ref_hash):
    doc = json.loads(subprocess.run([m, "plan", JOB, "--profile", prof, "--resources", res, "--json"] + SETS,
                                    check=True, capture_output=True, text=True).stdout)
    print(f"\n{'policy':8s} {'P':>2s} {'D':>2s} {'schedule':8s} {'shares':8s} {'groups':14s} "
          f"{'predicted ms':>12s} {'measured ms':>12s} {'pred/planner':>12s} {'meas/planner':>12s}")
    rows = []
    for row in doc["allocations"]:
        if "plan" not in row:
            print(f"{row['policy']:8s} not applicable: {row['not_applicable']}")
            continue
        p = row["plan"]
        pf = os.path.join(tmp, "alloc_" + row["policy"] + ".json")
        plan_file(pf, p["cuts"], p["workers"], p["replicas"], p["schedule"], p["recompute"], p["vn_shares"])
        rows.append((row["policy"], p) + predict_and_measure(m, tmp, prof, res, pf, "alloc_" + row["policy"], steps,
                                                            ref_hash, p["stages"] * p["replicas"]))
    mine = rows[-1]
    for name, p, pred, meas in rows:
        P = p["stages"]
        groups = " ".join("".join("N" if w < 2 else "S" for w in p["workers"][d * P:(d + 1) * P])
                          for d in range(p["replicas"]))
        shares = "+".join(str(v) for v in p["vn_shares"])
        print(f"{name:8s} {P:2d} {p['replicas']:2d} {p['schedule']:8s} {shares:8s} {groups:14s} {pred * 1e3:12.1f} "
              f"{meas * 1e3:12.1f} {pred / mine[2]:12.3f} {meas / mine[3]:12.3f}", flush=True)


def best4(out):
    return next(p for p in json.loads(out)["plans"] if p["stages"] == 4 and p["replicas"] == 1
                and p["schedule"] == "1f1b" and not p["recompute"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(os.path.dirname(__file__), "..", "build", "morph"))
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--only", choices=["cuts", "allocations"])
    a = ap.parse_args()
    m = a.morph
    tmp = tempfile.mkdtemp(prefix="morph_hetpipe_")
    res = os.path.join(tmp, "res.toml")
    write_two_types(res, 2, counts=(2, 2), memory_mib=(8192, 4096))
    prof = os.path.join(tmp, "profile.json")
    subprocess.run([m, "calibrate", JOB, "--out", prof, "--quiet"] + SETS, check=True, stdout=subprocess.DEVNULL)
    ref = subprocess.run([m, "run", JOB, "--steps", str(a.steps), "--quiet", "--out", os.path.join(tmp, "ref")] + SETS,
                         check=True, capture_output=True, text=True)
    ref_hash = re.findall(r"model_hash: (\w+)", ref.stdout)[-1]
    if a.only != "allocations":
        cuts(m, tmp, prof, res, a.steps, ref_hash)
    if a.only != "cuts":
        allocations(m, tmp, prof, res, a.steps, ref_hash)
    print(f"every model_hash equals the single-process {ref_hash}")


def cuts(m, tmp, prof, res, steps, ref_hash):
    het = best4(subprocess.run([m, "plan", JOB, "--profile", prof, "--resources", res, "--json", "--top", "1000"]
                               + SETS, check=True, capture_output=True, text=True).stdout)
    hom = best4(subprocess.run([m, "plan", JOB, "--profile", prof, "--workers", "4", "--json", "--top", "1000"]
                               + SETS, check=True, capture_output=True, text=True).stdout)
    plans = {"planner": (het["cuts"], het["workers"]), "even": ([0, 1, 3, 5, 7], [0, 1, 2, 3]),
             "homog": (hom["cuts"], [0, 1, 2, 3])}
    rows = {}
    print(f"{'cut':8s} {'layers per stage':18s} {'devices':10s} {'predicted ms':>12s} {'measured ms':>12s}")
    for name, (cut, workers) in plans.items():
        pf = os.path.join(tmp, name + ".json")
        plan_file(pf, cut, workers)
        rows[name] = predict_and_measure(m, tmp, prof, res, pf, name, steps, ref_hash)
        sizes = "/".join(str(cut[k + 1] - cut[k]) for k in range(4))
        kinds = "".join("N" if w < 2 else "S" for w in workers)
        print(f"{name:8s} {sizes:18s} {kinds:10s} {rows[name][0] * 1e3:12.1f} {rows[name][1] * 1e3:12.1f}",
              flush=True)
    for other in ("even", "homog"):
        print(f"{other}/planner: predicted {rows[other][0] / rows['planner'][0]:.3f}, "
              f"measured {rows[other][1] / rows['planner'][1]:.3f}")


if __name__ == "__main__":
    sys.exit(main())
