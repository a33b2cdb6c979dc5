#!/usr/bin/env python3
"""Morph vs PyTorch DDP over Gloo, measured in the same run.

Same model (MLP 784-512-512-10 or the CNN), global batch 256 cut into 8
micro-batches (VNs) of 32, SGD momentum, Fashion-MNIST, one intra-op thread
per process, 1 and 2 processes. Morph runs in exact and float reduction
modes; DDP accumulates over its micro-batches with no_sync. Rounds alternate
the systems; the best round of each counts. Prints samples/s and ratios,
all-reduce payload per step and the share of step time spent waiting for
the reduction.

  /usr/bin/python3 bench/vs_ddp.py [--morph build/morph] [--steps 60] [--rounds 2]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

JOB = """[job]
name = "bench-{model}"
seed = 1
steps = {steps}
[data]
dataset = "fashion-mnist"
[model]
name = "{model}"
{model_keys}
[batch]
global = 256
virtual_nodes = 8
[optim]
name = "sgd"
lr = 0.05
momentum = 0.9
[reduce]
mode = "{mode}"
[eval]
batch = 500
"""


def morph(binary, model, workers, mode, steps, tmp):
    keys = "hidden = [512, 512]" if model == "mlp" else ""
    path = os.path.join(tmp, f"{model}-{mode}.toml")
    with open(path, "w") as f:
        f.write(JOB.format(model=model, steps=steps, mode=mode, model_keys=keys))
    out = os.path.join(tmp, f"out-{model}-{mode}-{workers}")
    subprocess.run([binary, "run", path, "--workers", str(workers), "--quiet", "--out", out],
                   check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    share = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if m["step"] >= 5 and "test_accuracy" not in m:
                share.append(m["reduce_seconds"] / m["step_seconds"])
    return s["samples_per_second"], s.get("reduce_payload_bytes_per_step", 0), sum(share) / max(len(share), 1)


def ddp(model, workers, steps):
    r = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "ddp_baseline.py"), "--model", model,
                        "--workers", str(workers), "--steps", str(steps), "--micro-batches", "8", "--json"],
                       check=True, capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])["samples_per_second"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--models", default="mlp,cnn")
    a = p.parse_args()
    print(f"{'model':5} {'W':>2} {'ddp':>8} {'exact':>8} {'float':>8} {'ex/ddp':>7} {'fl/ddp':>7} "
          f"{'ex bytes':>9} {'fl bytes':>9} {'ex wait':>8} {'fl wait':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            steps = a.steps if model == "mlp" else max(20, a.steps // 3)
            for workers in (1, 2):
                best = {"ddp": 0, "exact": (0, 0, 0), "float": (0, 0, 0)}
                for _ in range(a.rounds):
                    best["ddp"] = max(best["ddp"], ddp(model, workers, steps))
                    for mode in ("exact", "float"):
                        r = morph(a.morph, model, workers, mode, steps, tmp)
                        if r[0] > best[mode][0]:
                            best[mode] = r
                d, e, f = best["ddp"], best["exact"], best["float"]
                print(f"{model:5} {workers:>2} {d:8.0f} {e[0]:8.0f} {f[0]:8.0f} {e[0] / d:7.3f} {f[0] / d:7.3f} "
                      f"{e[1]:9.0f} {f[1]:9.0f} {e[2]:8.1%} {f[2]:8.1%}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
