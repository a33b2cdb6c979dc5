#!/usr/bin/env python3
"""Bucket sizes (MORPH_BUCKET_BYTES) against each other, Morph alone.

Runs one job of vs_ddp.py's models (default the MLP) on W local workers
(default 2) for S steps in float and exact mode, once per bucket size in
each repetition, the sizes interleaved, and prints per size and mode the
median over repetitions of the wall time per steady step (the unix_time of
the metrics lines after the first 50 steps: everything between steps
counts), of the reduction wait (reduce_seconds) and of the time between
steps (the wall time less the mean step_seconds). An empty size is the
default (25 MB: one bucket for these models). The ratio column is against
the first size. Results never depend on the bucket size (tests/cli/
reduction_test.cpp), so only time is compared.

  /usr/bin/python3 bench/bucket_sizes.py [--morph build/morph] [--model mlp]
      [--workers 2] [--steps 800] [--reps 3] [--buckets ,1100000,600000]
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


def run(binary, model, mode, steps, workers, bucket, tmp):
    env = dict(os.environ)
    env.pop("MORPH_BUCKET_BYTES", None)
    if bucket:
        env["MORPH_BUCKET_BYTES"] = bucket
    cmd, out = vs_ddp.morph_cmd(binary, model, workers, mode, steps, tmp)
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    steady = [l for l in lines if "step_seconds" in l][50:]
    if len(steady) < 10:
        sys.exit("bucket_sizes: too few steps for a steady window; raise --steps")
    wall = (steady[-1]["unix_time"] - steady[0]["unix_time"]) / (len(steady) - 1)
    return (wall, statistics.median(l["reduce_seconds"] for l in steady),
            statistics.mean(l["step_seconds"] for l in steady))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    vs_ddp.add_job_args(p, steps=800)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--buckets", default=",1100000,600000", help="comma-separated MORPH_BUCKET_BYTES ('' = default)")
    a = p.parse_args()
    sizes = a.buckets.split(",")
    tmp = tempfile.mkdtemp(prefix="bucket_sizes-")
    res = {}
    try:
        for rep in range(a.reps):
            for mode in ("float", "exact"):
                for b in sizes:
                    w, r, st = run(a.morph, a.model, mode, a.steps, a.workers, b, tmp)
                    res.setdefault((mode, b), []).append((w, r, st))
                    print(f"round {rep}: {mode} {b or 'default'}: {w * 1e3:.2f} ms/step, reduce {r * 1e3:.2f} ms",
                          flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{a.model}, {a.workers} workers, {a.steps} steps, medians of {a.reps} rounds")
    print(f"{'mode':6} {'bucket bytes':>12} {'ms/step':>8} {'reduce ms':>9} {'between ms':>10} {'ratio':>6}")
    for mode in ("float", "exact"):
        base = statistics.median(x[0] for x in res[(mode, sizes[0])])
        for b in sizes:
            w = statistics.median(x[0] for x in res[(mode, b)])
            r = statistics.median(x[1] for x in res[(mode, b)])
            between = statistics.median(x[0] - x[2] for x in res[(mode, b)])
            print(f"{mode:6} {b or 'default':>12} {w * 1e3:8.2f} {r * 1e3:9.2f} {between * 1e3:10.2f} {w / base:6.3f}")


if __name__ == "__main__":
    main()
