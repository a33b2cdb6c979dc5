#!/usr/bin/env python3
"""Accuracy parity of exact mode's 32-bit format (reduce.bits = 32, issue 31).

Trains the same job in three reductions, exact 64-bit (the default), exact
32-bit and float, over several seeds, one process each (the result of an
exact job does not depend on the worker count, and float mode's only
slightly: this measures the formats, not the mapping), and prints the final
test accuracy and loss (summary.json) per seed, their mean per format, and
the difference 32 - 64 per seed. The jobs are bench/vs_ddp.py's models
(Fashion-MNIST, global batch 256 in 8 VNs, SGD momentum 0.9), shortened to
--steps (the machine of the figures in docs/performance.md is shared:
choose steps that finish in minutes).

  /usr/bin/python3 bench/exact32_parity.py [--morph build/morph] [--models mlp,cnn] [--seeds 1,2,3]
        [--steps 300]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from vs_ddp import MODELS  # noqa: E402

JOB = """[job]
name = "parity-{name}"
seed = {seed}
steps = {steps}
[data]
{data}
[model]
{model}
[batch]
global = {batch}
virtual_nodes = {vns}
[optim]
{optim}
[reduce]
mode = "{mode}"
bits = {bits}
[eval]
every = 0
batch = {eval_batch}
"""

FORMATS = {"exact64": ("exact", 64), "exact32": ("exact", 32), "float": ("float", 64)}


def run(a, tmp, model, fmt, seed):
    m = MODELS[model]
    mode, bits = FORMATS[fmt]
    path = os.path.join(tmp, f"{model}-{fmt}-{seed}.toml")
    with open(path, "w") as f:
        f.write(JOB.format(name=model, seed=seed, steps=a.steps, data=m["data"], model=m["model"], batch=m["batch"],
                           vns=m["vns"], optim=m["optim"], mode=mode, bits=bits, eval_batch=m["eval_batch"]))
    out = os.path.join(tmp, f"out-{model}-{fmt}-{seed}")
    subprocess.run([a.morph, "run", path, "--quiet", "--out", out], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    if s.get("reduce_mode") != mode or s.get("reduce_bits") != bits:
        raise RuntimeError(f"{out}: ran {s.get('reduce_mode')} {s.get('reduce_bits')}-bit, not {mode} {bits}-bit")
    return s["test_accuracy"], s["test_loss"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    p.add_argument("--models", default="mlp")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()
    a.morph = os.path.abspath(a.morph)
    seeds = [int(s) for s in a.seeds.split(",")]
    print(f"start {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {a.steps} steps, seeds {seeds}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            acc = {f: [] for f in FORMATS}
            for seed in seeds:
                row = []
                for fmt in FORMATS:
                    ta, tl = run(a, tmp, model, fmt, seed)
                    acc[fmt].append(ta)
                    row.append(f"{fmt} {ta:.4f} (loss {tl:.4f})")
                print(f"{model} seed {seed}: " + ", ".join(row) +
                      f"; 32-64 {acc['exact32'][-1] - acc['exact64'][-1]:+.4f}", flush=True)
            print(f"{model} mean test accuracy over {len(seeds)} seeds: " +
                  ", ".join(f"{f} {statistics.mean(v):.4f}" for f, v in acc.items()) +
                  f"; 32-64 {statistics.mean(acc['exact32']) - statistics.mean(acc['exact64']):+.4f}, "
                  f"32-float {statistics.mean(acc['exact32']) - statistics.mean(acc['float']):+.4f}", flush=True)
    print(f"end {time.strftime('%Y-%m-%d %H:%M:%S %Z')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
