#!/usr/bin/env python3
"""Accuracy parity of exact mode's 32-bit format (reduce.bits = 32, issue 31).

Trains the same job in three reductions, exact 64-bit (the default), exact
32-bit and float, over several seeds, one process each (the result of an
exact job does not depend on the worker count, and float mode's only
slightly: this measures the formats, not the mapping), and prints the final
test accuracy and loss (summary.json) per seed, their mean per format, and
the difference 32 - 64 per seed. The jobs are bench/vs_ddp.py's models
(Fashion-MNIST, global batch 256 in 8 VNs, SGD momentum 0.9; gpt-mini),
shortened to --steps (the machine of the figures in docs/performance.md is
shared: choose steps that finish in minutes), and `lm`: the GPT-style
torch.nn LM of tests/cli/lm_models.py (nn.TransformerEncoderLayer blocks,
a tied head and a weight shared by two blocks), scripted with
torch.manual_seed(seed) (so the seed draws its initial weights, as it
does for the built-in models) and trained as a TorchScript file on
16-token windows of the fortunes text (4096 for training, the next 512
for the test), global batch 32 in 4 VNs, gpt-mini's AdamW (warm-up,
cosine schedule, clip_norm 1.0).

  /usr/bin/python3 bench/exact32_parity.py [--morph build/morph] [--models mlp,cnn,gptmini,lm] [--seeds 1,2,3]
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

LM_WINDOWS, LM_TEST = 4096, 512


def lm_model(tmp, seed):
    """The `lm` entry of MODELS for one seed: its module and token files in tmp."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "cli"))
    import numpy as np
    import torch
    import lm_models
    path = os.path.join(tmp, f"lm-{seed}.pt")
    torch.manual_seed(seed)
    torch.jit.save(torch.jit.script(lm_models.LM()), path)
    data = {}
    if not os.path.exists(os.path.join(tmp, "lm_x.npy")):
        text = lm_models.fortunes_bytes()
        data["lm_x"], data["lm_y"] = lm_models.windows(text, 0, LM_WINDOWS)
        data["lm_tx"], data["lm_ty"] = lm_models.windows(text, LM_WINDOWS, LM_TEST)
    for name, arr in data.items():
        np.save(os.path.join(tmp, f"{name}.npy"), arr)
    files = {k: os.path.join(tmp, f"lm_{k}.npy") for k in ("x", "y", "tx", "ty")}
    return dict(data=f'dataset = "npy"\ntrain_x = "{files["x"]}"\ntrain_y = "{files["y"]}"\n'
                     f'test_x = "{files["tx"]}"\ntest_y = "{files["ty"]}"',
                model=f'name = "torchscript"\npath = "{path}"', batch=32, vns=4,
                optim=MODELS["gptmini"]["optim"], eval_batch=256)


FORMATS = {"exact64": ("exact", 64), "exact32": ("exact", 32), "float": ("float", 64)}


def run(a, tmp, model, fmt, seed):
    m = lm_model(tmp, seed) if model == "lm" else MODELS[model]
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
