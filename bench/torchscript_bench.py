#!/usr/bin/env python3
"""Throughput of a TorchScript CNN against the same network built in.

The built-in `cnn` model (src/models/zoo.cpp, channels [32, 64], fc 128:
conv3x3 -> batch norm -> ReLU -> 2x2 max pool, twice, then a 128-wide
ReLU dense layer and the 10-class head) is written as a TorchScript module
with the identical architecture (top-level children conv1, bn1, act1,
conv2, bn2, act2, flatten, fc, head) and both train the same job:
Fashion-MNIST, global batch 256 in 8 VNs of 32, SGD momentum, exact
reduction, one process, one intra-op thread.

Timed by wall clock over the same steady window of each run: a run of
S + E steps, and the time between the commits of step S and step S + E
(`unix_time` of metrics.jsonl: everything a step costs, between-step work
included; start-up, data and model loading, the first S steps and the
final evaluation are outside the window). A round runs both models in an
order that alternates between rounds; each round gives the ratio
TorchScript / built-in in samples per second. Prints the median
samples/s of each and the min/median/max of the per-round ratios (goal:
within 5%, i.e. a ratio >= 0.95).

  /usr/bin/python3 bench/torchscript_bench.py [--morph build/morph] [--rounds 5] [--short 5] [--extra 30]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

JOB = """[job]
name = "bench-{name}"
seed = 1
steps = {steps}
[data]
dataset = "fashion-mnist"
[model]
{model}
[batch]
global = 256
virtual_nodes = 8
[optim]
name = "sgd"
lr = 0.05
momentum = 0.9
[reduce]
mode = "exact"
[eval]
every = 0
"""


class ReluPool(nn.Module):
    def forward(self, x):
        return F.max_pool2d(F.relu(x), 2)


class DenseRelu(nn.Module):
    def __init__(self, i: int, o: int):
        super().__init__()
        self.fc = nn.Linear(i, o)

    def forward(self, x):
        return F.relu(self.fc(x))


def builtin_cnn_as_torchscript(path):
    m = nn.Sequential()
    m.add_module("conv1", nn.Conv2d(1, 32, 3, padding=1, bias=False))
    m.add_module("bn1", nn.BatchNorm2d(32))
    m.add_module("act1", ReluPool())
    m.add_module("conv2", nn.Conv2d(32, 64, 3, padding=1, bias=False))
    m.add_module("bn2", nn.BatchNorm2d(64))
    m.add_module("act2", ReluPool())
    m.add_module("flatten", nn.Flatten())
    m.add_module("fc", DenseRelu(64 * 7 * 7, 128))
    m.add_module("head", nn.Linear(128, 10))
    torch.jit.save(torch.jit.script(m), path)


def window_samples_per_second(morph, job, out, first, extra):
    """Samples/s between the commits of steps `first` and `first + extra`."""
    subprocess.run([morph, "run", job, "--quiet", "--out", out], check=True, stdout=subprocess.DEVNULL)
    t = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            t[m["step"]] = m["unix_time"]
    return 256 * extra / (t[first + extra - 1] - t[first - 1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--short", type=int, default=5, help="steps before the window")
    ap.add_argument("--extra", type=int, default=30, help="steps in the window")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="morph-tsbench-")
    model_pt = os.path.join(work, "cnn.pt")
    builtin_cnn_as_torchscript(model_pt)
    models = {
        "builtin": 'name = "cnn"\nchannels = [32, 64]\nfc = 128',
        "torchscript": f'name = "torchscript"\npath = "{model_pt}"',
    }
    jobs = {}
    for name, model in models.items():
        p = os.path.join(work, f"{name}.toml")
        with open(p, "w") as f:
            f.write(JOB.format(name=name, steps=a.short + a.extra, model=model))
        jobs[name] = p
    sps = {name: [] for name in models}
    ratios = []
    for r in range(a.rounds):
        order = list(models) if r % 2 == 0 else list(reversed(models))
        got = {}
        for name in order:
            got[name] = window_samples_per_second(a.morph, jobs[name], os.path.join(work, "out"), a.short, a.extra)
            sps[name].append(got[name])
        ratios.append(got["torchscript"] / got["builtin"])
        print(f"round {r + 1}: built-in {got['builtin']:.0f} samples/s, torchscript {got['torchscript']:.0f}, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    print()
    print("| model | samples/s (median) |")
    print("|---|---|")
    for name in models:
        print(f"| {name} | {statistics.median(sps[name]):.0f} |")
    print(f"\nTorchScript / built-in samples/s over {a.rounds} rounds: min {min(ratios):.3f}, "
          f"median {statistics.median(ratios):.3f}, max {max(ratios):.3f} (goal >= 0.95)")
    subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    sys.exit(main())
