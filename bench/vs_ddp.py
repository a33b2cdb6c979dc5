#!/usr/bin/env python3
"""Morph vs PyTorch DDP over Gloo, by wall clock, measured in the same run.

Same model (MLP 784-512-512-10 or the CNN), global batch 256 cut into 8
micro-batches (VNs) of 32, SGD momentum, Fashion-MNIST, one intra-op thread
per process, 1 and 2 processes. Morph runs in exact and float reduction
modes; DDP (bench/ddp_baseline.py) accumulates over its micro-batches with
no_sync.

Both sides are timed the same way, from outside: the wall clock of the
whole command (`morph run`, `ddp_baseline.py`) for S steps and for S + E
steps; the difference divided by E is the marginal time of one steady step.
Start-up (process launch, data loading, Gloo rendezvous), the final
evaluation and teardown cancel; everything either system does between
steps counts (for Morph: the control plane's store round trips, the
metrics line, the flags MAX all-reduce). Morph's evaluation runs only after
the last step (eval.every = 0), so it cancels too.

A round runs every system (DDP, exact, float) once short and once long, in
an order that rotates from round to round; each round gives one ratio
Morph/DDP in samples per second, and the table shows the median samples/s
of each system and the min/median/max of the per-round ratios. The exact
columns also give the median time per step spent waiting for the
reductions (`reduce_seconds` of the long run's metrics, after the first 5
steps) and the all-reduce payload one worker hands to Gloo per step.

  /usr/bin/python3 bench/vs_ddp.py [--morph build/morph] [--rounds 5] [--models mlp,cnn] [--workers 1,2]
        [--exact-buckets BYTES,...]   (extra exact rows with MORPH_BUCKET_BYTES=BYTES)
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
every = 0
batch = 1000
"""

# (short steps S, extra steps E) per model: E steps take a few seconds.
WINDOW = {"mlp": (20, 200), "cnn": (10, 40)}


def timed(cmd, env=None):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def morph_cmd(binary, model, workers, mode, steps, tmp):
    keys = "hidden = [512, 512]" if model == "mlp" else ""
    path = os.path.join(tmp, f"{model}-{mode}-{steps}.toml")
    with open(path, "w") as f:
        f.write(JOB.format(model=model, steps=steps, mode=mode, model_keys=keys))
    out = os.path.join(tmp, f"out-{model}-{mode}-{workers}-{steps}")
    return [binary, "run", path, "--workers", str(workers), "--quiet", "--out", out], out


def morph_reduce_stats(out):
    """(median reduce seconds per step after step 5, payload bytes per step) of a finished run."""
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    red = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if m["step"] >= 5 and "reduce_seconds" in m:
                red.append(m["reduce_seconds"])
    return (statistics.median(red) if red else 0.0), s.get("reduce_payload_bytes_per_step", 0)


def ddp_cmd(model, workers, steps):
    return ["/usr/bin/python3", os.path.join(HERE, "ddp_baseline.py"), "--model", model, "--workers",
            str(workers), "--steps", str(steps), "--warmup", "1", "--micro-batches", "8"]


def marginal(system, a, model, workers, tmp, long_first):
    """Seconds per steady step of one system (and Morph's reduce stats)."""
    s, e = WINDOW[model]
    times, stats = {}, (0.0, 0)
    for steps in ((s + e, s) if long_first else (s, s + e)):
        if system == "ddp":
            times[steps] = timed(ddp_cmd(model, workers, steps))
        else:
            mode, _, bucket = system.partition("@")
            env = dict(os.environ)
            env.pop("MORPH_BUCKET_BYTES", None)
            if bucket:
                env["MORPH_BUCKET_BYTES"] = bucket
            cmd, out = morph_cmd(a.morph, model, workers, mode, steps, tmp)
            times[steps] = timed(cmd, env)
            if steps == s + e:
                stats = morph_reduce_stats(out)
    return (times[s + e] - times[s]) / e, stats


def spread(xs):
    return f"{min(xs):.3f}/{statistics.median(xs):.3f}/{max(xs):.3f}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--exact-buckets", default="",
                   help="comma-separated MORPH_BUCKET_BYTES values: extra exact systems (rows 'exact@BYTES')")
    a = p.parse_args()
    systems = ["ddp", "exact", "float"]
    extra = [f"exact@{b}" for b in a.exact_buckets.split(",") if b]
    print("samples/s by wall clock (marginal time of E extra steps), medians over rounds; "
          "ratio = Morph/DDP per round, min/median/max")
    print(f"{'model':5} {'W':>2} {'ddp':>7} {'exact':>7} {'float':>7} {'exact/ddp':>17} {'float/ddp':>17} "
          f"{'ex red ms':>9} {'fl red ms':>9} {'ex B/step':>10} {'fl B/step':>10}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            for workers in (int(w) for w in a.workers.split(",")):
                sps = {k: [] for k in systems + extra}
                red = {"exact": [], "float": []}
                payload = {"exact": 0, "float": 0}
                for r in range(a.rounds):
                    every = systems + extra
                    order = every[r % len(every):] + every[:r % len(every)]
                    for system in order:
                        sec, (rs, pb) = marginal(system, a, model, workers, tmp, long_first=r % 2 == 1)
                        sps[system].append(256 / sec)
                        if system in red:
                            red[system].append(rs)
                            payload[system] = pb
                ex = [e / d for e, d in zip(sps["exact"], sps["ddp"])]
                fl = [f / d for f, d in zip(sps["float"], sps["ddp"])]
                med = {k: statistics.median(v) for k, v in sps.items()}
                print(f"{model:5} {workers:>2} {med['ddp']:7.0f} {med['exact']:7.0f} {med['float']:7.0f} "
                      f"{spread(ex):>17} {spread(fl):>17} {statistics.median(red['exact']) * 1e3:9.2f} "
                      f"{statistics.median(red['float']) * 1e3:9.2f} {payload['exact']:10.0f} {payload['float']:10.0f}",
                      flush=True)
                for x in extra:
                    ratio = [e / d for e, d in zip(sps[x], sps["ddp"])]
                    print(f"{'':5} {'':>2} {x + ':':>15} {statistics.median(sps[x]):7.0f} samples/s, "
                          f"{x}/ddp {spread(ratio)}, {x}/exact "
                          f"{spread([e / b for e, b in zip(sps[x], sps['exact'])])}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
