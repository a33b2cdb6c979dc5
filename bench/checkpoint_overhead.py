#!/usr/bin/env python3
"""Cost of continuous checkpoints (every 50 steps, background writer) by wall
clock, against the same job without checkpoints, measured in the same run.

Everything a checkpoint costs the training loop counts: the snapshot copy
of the model and optimiser state handed to the writer and the wait for the
previous write, which run between steps (outside step(), so a throughput
read from step times, as this script's first version did, leaves them out),
and the writer thread competing for the cores.

Both sides are timed the same way, from outside: the wall clock of the
whole `morph run` for S steps and for S + E steps; (T(S+E) - T(S)) / E is
the marginal time of one steady step. Start-up, data loading, the final
evaluation (eval.every = 0: only after the last step) and the final
checkpoint flush cancel; S and E are multiples of 50, so the E extra steps
hold E / 50 checkpoints. A round runs both sides, short and long, in an
order that rotates from round to round; each round gives one ratio
(time per step with checkpoints / without), shown as min/median/max.
Goal: median <= 1.03.

The CPU seconds (user + system) of the `morph run` process tree are taken
the same way, (C(S+E) - C(S)) / E: less sensitive than wall clock to other
load on a shared machine, but blind to waiting (an fsync the next
checkpoint waits for), so the wall-clock ratio is the figure that counts.

  python3 bench/checkpoint_overhead.py [--morph build/morph] [--rounds 3] [--models mlp,cnn]
        [--every 50] [--workers N] [--short S] [--extra E]
  (N worker processes, default in-process; S and E override the window of every model)
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# (example, short steps S, extra steps E): E steps take a few seconds.
WINDOW = {"mlp": ("fmnist-mlp", 50, 300), "cnn": ("fmnist-cnn", 50, 100)}


def timed_run(a, model, steps, every, out):
    example, _, _ = WINDOW[model]
    shutil.rmtree(out, ignore_errors=True)
    cmd = [a.morph, "run", os.path.join(HERE, "..", "examples", example + ".toml"), "--quiet", "--steps", str(steps),
           "--out", out, "--set", "eval.every=0", "--set", "eval.batch=500", "--set", f"checkpoint.every={every}"]
    if a.workers:
        cmd += ["--workers", str(a.workers)]
    c0 = os.times()
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    c1 = os.times()
    return wall, (c1.children_user + c1.children_system) - (c0.children_user + c0.children_system)


def window(a, model):
    _, s, e = WINDOW[model]
    return a.short or s, a.extra or e


def marginal(a, model, every, tmp, long_first):
    """(wall seconds, CPU seconds) per steady step."""
    s, e = window(a, model)
    t = {}
    for steps in ((s + e, s) if long_first else (s, s + e)):
        out = os.path.join(tmp, f"{model}-{every}-{steps}")
        t[steps] = timed_run(a, model, steps, every, out)
        if every and steps == s + e:
            with open(os.path.join(out, "metrics.jsonl")) as f:
                errors = [json.loads(line).get("checkpoint_error") for line in f]
            if any(errors):
                sys.exit(f"checkpoint failed: {[x for x in errors if x][0]}")
    return tuple((t[s + e][k] - t[s][k]) / e for k in (0, 1))


def spread(xs):
    return f"{min(xs):.3f}/{statistics.median(xs):.3f}/{max(xs):.3f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--short", type=int, default=0)
    ap.add_argument("--extra", type=int, default=0)
    a = ap.parse_args()
    for m in a.models.split(","):
        s, e = window(a, m)
        if s % a.every or e % a.every:
            sys.exit(f"--every {a.every} must divide S = {s} and E = {e}")
    print("seconds per step by wall clock (marginal time of E extra steps), medians over rounds; "
          f"ratio = with checkpoints every {a.every} / without, per round, min/median/max")
    print(f"{'model':>5} {'S':>4} {'E':>4} {'ckpts in E':>10} {'no ckpt ms':>10} {'ckpt ms':>8} {'ratio min/med/max':>19}"
          f" {'cpu ms no/ckpt':>15} {'cpu ratio min/med/max':>22}")
    with tempfile.TemporaryDirectory() as tmp:
        for m in a.models.split(","):
            s, e = window(a, m)
            base, ck, ratios, cpu_base, cpu_ck, cpu_ratios = [], [], [], [], [], []
            for r in range(a.rounds):
                # Rotate which side goes first and whether the long run leads.
                sides = (0, a.every) if r % 2 == 0 else (a.every, 0)
                got = {every: marginal(a, m, every, tmp, long_first=(r // 2) % 2 == 1) for every in sides}
                base.append(got[0][0])
                ck.append(got[a.every][0])
                ratios.append(ck[-1] / base[-1])
                cpu_base.append(got[0][1])
                cpu_ck.append(got[a.every][1])
                cpu_ratios.append(cpu_ck[-1] / cpu_base[-1])
                print(f"  round {r + 1}: wall {base[-1] * 1e3:.2f} vs {ck[-1] * 1e3:.2f} ms -> {ratios[-1]:.3f}; "
                      f"cpu {cpu_base[-1] * 1e3:.2f} vs {cpu_ck[-1] * 1e3:.2f} ms -> {cpu_ratios[-1]:.3f}",
                      file=sys.stderr, flush=True)
            cpu = f"{statistics.median(cpu_base) * 1e3:.1f}/{statistics.median(cpu_ck) * 1e3:.1f}"
            print(f"{m:>5} {s:>4} {e:>4} {e // a.every:>10} {statistics.median(base) * 1e3:10.2f} "
                  f"{statistics.median(ck) * 1e3:8.2f} {spread(ratios):>19} {cpu:>15} {spread(cpu_ratios):>22}",
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())
