#!/usr/bin/env python3
"""Throughput cost of continuous checkpoints (every 50 steps, background
writer) against the same job without them, alternating in rounds; the best
round of each counts. Fashion-MNIST, one worker process.

  python3 bench/checkpoint_overhead.py [--morph build/morph] [--rounds 2]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(binary, job, steps, every, out):
    args = [binary, "run", job, "--quiet", "--steps", str(steps), "--out", out, "--set", "eval.batch=500"]
    if every:
        args += ["--set", f"checkpoint.every={every}"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)["samples_per_second"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    root = os.path.join(HERE, "..", "examples")
    print(f"{'job':>12} {'steps':>6} {'no ckpt':>9} {'ckpt/50':>9} {'ratio':>7} {'checkpoints':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, steps in (("fmnist-mlp", 600), ("fmnist-cnn", 200)):
            job = os.path.join(root, name + ".toml")
            base = ck = 0.0
            for r in range(a.rounds):
                base = max(base, run(a.morph, job, steps, 0, os.path.join(tmp, f"{name}-base")))
                ck = max(ck, run(a.morph, job, steps, 50, os.path.join(tmp, f"{name}-ck{r}")))
            n = len(os.listdir(os.path.join(tmp, f"{name}-ck0", "checkpoints")))
            print(f"{name:>12} {steps:>6} {base:9.0f} {ck:9.0f} {ck / base:7.3f} {n:>12}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
