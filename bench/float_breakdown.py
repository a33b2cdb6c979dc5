#!/usr/bin/env python3
"""Where a Morph step's time goes, against DDP, piece by piece.

vs_ddp.py gives the ratio; this says where it comes from. One of vs_ddp.py's
models (default the MLP) on W local workers (default 2), float reduction (or
exact with --mode exact; DDP is float either way), S steps; Morph and DDP
(bench/ddp_baseline.py) run in turn, R rounds.

Both sides are timed the same way, on their rank 0, over the same window of
steady steps (Morph: its metrics lines after the first 50 steps; DDP: its
timed steps after 50 warm-up steps). A step runs from where the framework
begins it (Morph: StepCore::runStep; DDP: the top of its train_step, before
the index selection and zero_grad) to the end of its optimiser step; the
wall clock between two step ends (Morph: `unix_time` of the lines; DDP:
perf_counter after the optimiser) covers one step and what lies between
it and the previous one. Per step, means over the window (so the pieces
add up to the wall time):

  compute    the worker's VNs / micro-batches, forward and backward, data
             included, up to the wait for the reduction. Morph: its seconds
             per VN (`vn_seconds`, rank 0's) x its VNs. DDP: the mean of its
             no_sync micro-batches x its micro-batches.
  reduction  Morph: `reduce_seconds` (the wait for the buckets). DDP: its
             last micro-batch less a no_sync one (its backward overlaps the
             all-reduce of its first bucket and then waits for the rest).
  after      the rest of the step: step time less compute and reduction
             (reading the sums into the gradients, the optimiser; DDP: also
             its index selection and zero_grad at the step's top).
  between    wall less the step time: from one step's end to the next one's
             start (Morph: the control plane's store round trip, the
             metrics line; DDP: its Python loop).
  wall       the wall clock per step.

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


def pieces(wall, step, compute, reduction):
    """Per-step seconds of the window: wall clock per step, and the means of the in-step parts."""
    return {"compute": compute, "reduction": reduction, "after": step - compute - reduction,
            "between": wall - step, "wall": wall}


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
    # The window: from the end of the first steady step to the end of the last, so the steps in it are steady[1:].
    inside = steady[1:]
    mean = lambda f: statistics.fmean(f(l) for l in inside)  # noqa: E731
    return pieces((steady[-1]["unix_time"] - steady[0]["unix_time"]) / len(inside), mean(lambda l: l["step_seconds"]),
                  mean(lambda l: l["vn_seconds"][0] * vns), mean(lambda l: l["reduce_seconds"]))


def ddp(model, workers, steps):
    m = vs_ddp.MODELS[model]
    cmd = ["/usr/bin/python3", os.path.join(vs_ddp.HERE, "ddp_baseline.py"), "--model", m["ddp"],
           "--workers", str(workers), "--global-batch", str(m["batch"]), "--micro-batches", str(m["vns"]),
           "--steps", str(steps), "--warmup", "50", "--json"]
    r = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    steady = json.loads(r.stdout.strip().splitlines()[-1])["timeline"]
    if len(steady) < 10 or len(steady[0]["micro_batches"]) < 2:
        sys.exit("float_breakdown: DDP needs a steady window and at least 2 micro-batches per worker")
    inside = steady[1:]

    def plain(t):  # a no_sync micro-batch, mean of the step's
        return statistics.fmean(t["micro_batches"][:-1])
    mean = lambda f: statistics.fmean(f(t) for t in inside)  # noqa: E731
    return pieces((steady[-1]["end"] - steady[0]["end"]) / len(inside), mean(lambda t: t["end"] - t["start"]),
                  mean(lambda t: plain(t) * len(t["micro_batches"])),
                  mean(lambda t: t["micro_batches"][-1] - plain(t)))


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
    print(f"{a.model}, {a.workers} workers, Morph {a.mode} (DDP float), {a.steps} steps; ms per step (means over the"
          f" window), medians of {a.rounds} rounds")
    print(f"{'piece':10} {'Morph':>8} {'DDP':>8} {'Morph/DDP':>10}")
    for k in PIECES:
        mo = statistics.median(r[k] for r in res["morph"])
        dd = statistics.median(r[k] for r in res["ddp"])
        ratio = f"{mo / dd:10.2f}" if abs(dd) > 1e-5 else f"{'-':>10}"
        print(f"{k:10} {mo * 1e3:8.2f} {dd * 1e3:8.2f} {ratio}")


if __name__ == "__main__":
    main()
