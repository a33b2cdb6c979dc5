#!/usr/bin/env python3
"""Where a Morph step's time goes, against DDP, piece by piece.

vs_ddp.py gives the ratio; this says where it comes from. One of vs_ddp.py's
models (default the MLP) on W local workers (default 2), float reduction (or
exact with --mode exact; DDP is float either way), S steps; Morph and DDP
(bench/ddp_baseline.py) run in turn, R rounds. For
each side, per steady step (Morph: its metrics lines after the first 50
steps; DDP: the timed steps), medians of:

  compute       the worker's VNs / micro-batches, forward and backward, data
                included, up to the wait for the reduction. Morph: its
                seconds per VN (`vn_seconds`, rank 0's) x its VNs. DDP: the
                no_sync micro-batch x its micro-batches.
  reduction     Morph: `reduce_seconds` (the flags MAX all-reduce and the
                wait for the buckets). DDP: its last micro-batch less a
                no_sync one (its backward overlaps the all-reduce of its
                first bucket and then waits for the rest).
  after         Morph: the rest of `step_seconds` (reading the sums into
                the gradients, loss statistics, the optimiser). DDP: the
                gradient scaling and the optimiser.
  between       Morph: the wall time per step (unix_time of the lines) less
                step_seconds (the control plane, the metrics line). DDP:
                its whole step less the pieces above.
  wall          the wall time per step.

The last column is Morph / DDP of the medians over rounds.

  /usr/bin/python3 bench/float_breakdown.py [--morph build/morph] [--model mlp]
      [--workers 2] [--steps 600] [--rounds 3] [--mode float|exact]
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

PIECES = ["compute", "reduction", "after", "between", "wall"]


def morph(binary, model, workers, mode, steps, tmp):
    cmd, out = vs_ddp.morph_cmd(binary, model, workers, mode, steps, tmp)
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    steady = [l for l in lines if "step_seconds" in l][50:]
    if len(steady) < 10:
        sys.exit("float_breakdown: too few steps for a steady window; raise --steps")
    vns = vs_ddp.MODELS[model]["vns"] // workers  # rank 0's (the first V % W ranks get one more)
    vns += 1 if vs_ddp.MODELS[model]["vns"] % workers else 0
    wall = (steady[-1]["unix_time"] - steady[0]["unix_time"]) / (len(steady) - 1)
    med = lambda f: statistics.median(f(l) for l in steady)  # noqa: E731
    compute = med(lambda l: l["vn_seconds"][0] * vns)
    reduction = med(lambda l: l["reduce_seconds"])
    step = med(lambda l: l["step_seconds"])
    return {"compute": compute, "reduction": reduction, "after": step - compute - reduction,
            "between": wall - statistics.mean(l["step_seconds"] for l in steady), "wall": wall}


def ddp(model, workers, steps):
    m = vs_ddp.MODELS[model]
    cmd = ["/usr/bin/python3", os.path.join(vs_ddp.HERE, "ddp_baseline.py"), "--model", m["ddp"],
           "--workers", str(workers), "--global-batch", str(m["batch"]), "--micro-batches", str(m["vns"]),
           "--steps", str(steps), "--warmup", "50", "--json"]
    r = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    b = {k: v / 1e3 for k, v in json.loads(r.stdout.strip().splitlines()[-1])["breakdown_ms"].items()}
    mbs = m["vns"] // workers + (1 if m["vns"] % workers else 0)
    compute = b["micro_batch"] * mbs
    reduction = b["last_micro_batch"] - b["micro_batch"]
    return {"compute": compute, "reduction": reduction, "after": b["after"],
            "between": b["step"] - compute - reduction - b["after"], "wall": b["step"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    vs_ddp.add_job_args(p, steps=600)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mode", choices=["float", "exact"], default="float", help="Morph's reduction")
    a = p.parse_args()
    if a.steps < 70:
        p.error("--steps: at least 70 (50 warm-up steps, then a steady window)")
    tmp = tempfile.mkdtemp(prefix="float_breakdown-")
    res = {"morph": [], "ddp": []}
    try:
        for rnd in range(a.rounds):
            order = ["morph", "ddp"] if rnd % 2 == 0 else ["ddp", "morph"]
            for side in order:
                r = morph(a.morph, a.model, a.workers, a.mode, a.steps, tmp) if side == "morph" else ddp(
                    a.model, a.workers, a.steps)
                res[side].append(r)
                print(f"round {rnd}: {side}: " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in r.items()) + " ms",
                      flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{a.model}, {a.workers} workers, Morph {a.mode} (DDP float), {a.steps} steps; ms per step, medians of {a.rounds} rounds")
    print(f"{'piece':10} {'Morph':>8} {'DDP':>8} {'Morph/DDP':>10}")
    for k in PIECES:
        mo = statistics.median(r[k] for r in res["morph"])
        dd = statistics.median(r[k] for r in res["ddp"])
        ratio = f"{mo / dd:10.2f}" if abs(dd) > 1e-5 else f"{'-':>10}"
        print(f"{k:10} {mo * 1e3:8.2f} {dd * 1e3:8.2f} {ratio}")


if __name__ == "__main__":
    main()
