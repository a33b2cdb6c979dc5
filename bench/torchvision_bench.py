#!/usr/bin/env python3
"""torchvision's resnet18 (python3-torchvision, num_classes=10, scripted
and unmodified) trained by Morph against the same scripted module trained
by a plain PyTorch loop, and on 2 pipeline stages with the planner's cut
against an even split.

Data: 256 random 3x32x32 images with random labels (.npy; both sides load
the same files). Job: global batch 32 in 4 VNs of 8, SGD with momentum
0.9, one process, one intra-op thread (Morph's job.threads = 1,
torch.set_num_threads(1)).

1. steps: Morph (exact reduction, its default; and float) against the
   baseline: a plain loop over the same module file (torch.jit.load, the
   graph executor's optimisations off, as Morph runs it), the same
   micro-batching (4 micro-batches of 8, loss summed / 32, gradients
   accumulated by backward), torch.optim.SGD, glibc's malloc thresholds and huge-page mode as
   `morph` sets them (bench/ddp_baseline.py's tune_allocator). Step time by
   wall clock over the same window: between the ends of steps S and S + E
   (Morph: `unix_time` of metrics.jsonl; the loop: time.time() after each
   optimiser step), start-up and the final evaluation outside. Peak RSS:
   Morph's `peak_rss_bytes` (its worker), the loop's ru_maxrss (its
   process; the loop's RSS after `import torch`, before the model loads, is
   printed beside it). Rounds alternate the order; per-round ratios
   Morph / loop, min/median/max. Goals (issue 27): speed >= 0.95x,
   RSS <= 1.15x.
2. stages: `morph calibrate` once, then the best 2-stage, 1-replica plan of
   `morph plan --workers 2 --json` (the planner's cut) against `--stages 2`
   (the even split by layer count), both with 2 workers, the same window,
   interleaved rounds; per-round ratio of step times planner / even.

3. lm: section 1 for the GPT-style LM of tests/cli/lm_models.py (tied
   head, a weight shared by two blocks; 16-token windows of the fortunes
   text, the loss the mean over every position), one exact-mode and one
   float-mode Morph against the same loop.

The cut points and the analysis time of each model are the C++
`build/bench/graph_bench` (this script prints its command line with the
files it wrote).

  /usr/bin/python3 bench/torchvision_bench.py [--morph build/morph] [--rounds 3] [--short 5] [--extra 20]
      [--only steps,lm,stages] [--keep DIR]   (--only files: only write the files, for graph_bench)
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

GLOBAL, VNS, LR = 32, 4, 0.01

JOB = """[job]
name = "tvbench"
seed = 1
steps = {steps}
threads = 1
[data]
dataset = "npy"
train_x = "{p}x.npy"
train_y = "{p}y.npy"
test_x = "{p}tx.npy"
test_y = "{p}ty.npy"
[model]
name = "torchscript"
path = "{model}"
[batch]
global = {g}
virtual_nodes = {v}
[optim]
name = "sgd"
lr = {lr}
momentum = 0.9
[reduce]
mode = "{mode}"
[eval]
every = 0
"""


def write_files(work):
    import torch
    import torchvision

    for i, name in enumerate(["resnet18", "mobilenet_v2", "squeezenet1_1"]):
        torch.manual_seed(10 + i)
        m = getattr(torchvision.models, name)(num_classes=10)
        torch.jit.save(torch.jit.script(m), os.path.join(work, f"{name}.pt"))
    g = torch.Generator().manual_seed(7)
    np.save(os.path.join(work, "x.npy"), torch.rand(256, 3, 32, 32, generator=g).numpy())
    np.save(os.path.join(work, "y.npy"), torch.randint(0, 10, (256,), generator=g).numpy())
    np.save(os.path.join(work, "tx.npy"), torch.rand(32, 3, 32, 32, generator=g).numpy())
    np.save(os.path.join(work, "ty.npy"), torch.randint(0, 10, (32,), generator=g).numpy())
    # The GPT-style LM of tests/cli/lm_models.py (tied head, a weight shared
    # by two blocks) and its token data: lm.pt, lm_x.npy (32 windows of 16
    # bytes of the fortunes text), lm_y.npy, lm_tx.npy, lm_ty.npy.
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "cli"))
    import lm_models

    lm_models.write(work)


def job_file(work, name, steps, mode="exact", net="resnet18"):
    p = os.path.join(work, f"{name}.toml")
    with open(p, "w") as f:
        f.write(JOB.format(steps=steps, model=f"{net}.pt", g=GLOBAL, v=VNS, lr=LR, mode=mode,
                           p="lm_" if net == "lm" else ""))
    return p


def window_seconds(times, first, extra):
    """Seconds per step between the ends of steps `first` and `first + extra` (1-based)."""
    return (times[first + extra] - times[first]) / extra


def morph_run(morph, job, out, first, extra, *args):
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([morph, "run", job, "--quiet", "--out", out, *args], check=True, stdout=subprocess.DEVNULL)
    t = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            t[m["step"]] = m["unix_time"]
    if 0 in t:  # steps counted from 0: the end of the k-th step is step k - 1's line
        t = {k + 1: v for k, v in t.items()}
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return t, s


def loop_main(a):
    """The baseline: one process, a plain loop with gradient accumulation."""
    import ddp_baseline

    ddp_baseline.same_malloc_as_morph("morph")  # huge pages, as morph's engine (re-executes once)
    ddp_baseline.tune_allocator("morph")  # before torch allocates anything
    import torch
    import torch.nn.functional as F

    rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    torch.set_num_threads(1)
    torch._C._set_graph_executor_optimize(False)
    pre = "lm_" if a.net == "lm" else ""
    model = torch.jit.load(os.path.join(a.work, f"{a.net}.pt"))
    model.train()
    x = torch.from_numpy(np.load(os.path.join(a.work, f"{pre}x.npy")))
    y = torch.from_numpy(np.load(os.path.join(a.work, f"{pre}y.npy")))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    n, b = x.shape[0], GLOBAL // VNS
    perm, pos = torch.randperm(n, generator=g), 0
    times = {0: time.time()}
    for step in range(1, a.steps + 1):
        opt.zero_grad()
        for _ in range(VNS):
            if pos + b > n:
                perm, pos = torch.randperm(n, generator=g), 0
            idx = perm[pos : pos + b]
            pos += b
            # (b, classes), or (b, T, vocab) for the LM: the mean over every position of the global batch
            out = model(x[idx])
            positions = GLOBAL * (y[idx].numel() // b)
            loss = F.cross_entropy(out.reshape(-1, out.size(-1)), y[idx].reshape(-1), reduction="sum") / positions
            loss.backward()
        opt.step()
        times[step] = time.time()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    json.dump({"times": times, "peak_rss_bytes": rss, "rss_after_import": rss_import}, open(a.result, "w"))


def loop_run(work, net, steps, first, extra):
    result = os.path.join(work, "loop.json")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--loop", "--work", work, "--steps", str(steps),
                    "--net", net, "--result", result], check=True)
    r = json.load(open(result))
    times = {int(k): v for k, v in r["times"].items()}
    return times, r


def spread(xs):
    return f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}"


def steps_section(a, work, net):
    steps = a.short + a.extra
    modes = a.modes.split(",")
    jobs = {m: job_file(work, f"steps-{net}-{m}", steps, m, net) for m in modes}
    ms = {k: [] for k in ["loop"] + modes}
    speed = {m: [] for m in modes}
    rss_ratio = {m: [] for m in modes}
    rss = {k: [] for k in ["loop"] + modes}
    loop_import = []
    for r in range(a.rounds):
        order = ["loop"] + modes
        if r % 2:
            order.reverse()
        got = {}
        for k in order:
            if k == "loop":
                t, res = loop_run(work, net, steps, a.short, a.extra)
                loop_import.append(res["rss_after_import"])
            else:
                t, res = morph_run(a.morph, jobs[k], os.path.join(work, "out"), a.short, a.extra)
            got[k] = (window_seconds(t, a.short, a.extra), res["peak_rss_bytes"])
            ms[k].append(1e3 * got[k][0])
            rss[k].append(got[k][1])
        for m in modes:
            speed[m].append(got["loop"][0] / got[m][0])
            rss_ratio[m].append(got[m][1] / got["loop"][1])
        print(f"round {r + 1}: " + ", ".join(f"{k} {1e3 * got[k][0]:.1f} ms/step {got[k][1] / 2**20:.0f} MiB"
                                            for k in order), flush=True)
    what = "the LM (tests/cli/lm_models.py), 16 tokens" if net == "lm" else "resnet18, 3x32x32"
    print(f"\n{what}, global batch {GLOBAL} in {VNS} VNs, steps {a.short}..{steps} timed, "
          f"{a.rounds} rounds, 1 thread, one process")
    print("| system | ms/step (median) | peak RSS MiB (median) | speed vs loop (min / median / max) | "
          "RSS vs loop (min / median / max) |")
    print("|---|---|---|---|---|")
    print(f"| plain PyTorch loop | {statistics.median(ms['loop']):.1f} | {statistics.median(rss['loop']) / 2**20:.0f} "
          f"(after import torch: {statistics.median(loop_import) / 2**20:.0f}) | 1 | 1 |")
    for m in modes:
        print(f"| Morph, {m} | {statistics.median(ms[m]):.1f} | {statistics.median(rss[m]) / 2**20:.0f} | "
              f"{spread(speed[m])} | {spread(rss_ratio[m])} |")
    print("goals: speed >= 0.95x, RSS <= 1.15x")


def stages_section(a, work):
    steps = a.short + a.extra
    job = job_file(work, "stages", steps)
    profile = os.path.join(work, "profile.json")
    t0 = time.time()
    subprocess.run([a.morph, "calibrate", job, "--quiet", "--out", profile], check=True, stdout=subprocess.DEVNULL)
    print(f"calibrate: {time.time() - t0:.1f} s")
    out = subprocess.run([a.morph, "plan", job, "--profile", profile, "--workers", "2", "--json", "--top", "1000"],
                         check=True, capture_output=True, text=True).stdout
    plans = json.loads(out)
    cands = [p for p in plans["plans"] if p["stages"] == 2 and p.get("replicas", 1) == 1]
    if not cands:
        sys.exit(f"no 2-stage plan among morph plan's: {out[:2000]}")
    best = min(cands, key=lambda p: p["step_seconds"])
    # A plan file names each stage's first and last layer (docs/planner.md);
    # the profile lists the layers in order.
    names = [layer["name"] for layer in json.load(open(profile))["layers"]]
    c = best["cuts"]
    plan_path = os.path.join(work, "plan2.json")
    json.dump({"stages": [[names[c[k]], names[c[k + 1] - 1]] for k in range(len(c) - 1)],
               "schedule": best["schedule"], "recompute": best["recompute"]}, open(plan_path, "w"))
    print(f"planner's 2-stage plan: cuts {c}, {best['schedule']}, recompute {best['recompute']}, "
          f"predicted {1e3 * best['step_seconds']:.1f} ms/step")
    runs = {"planner": ["--plan", plan_path, "--workers", "2"],
            "even": ["--stages", "2", "--workers", "2", "--schedule", best["schedule"]]
            + (["--recompute"] if best["recompute"] else [])}
    ms = {k: [] for k in runs}
    ratios = []
    cuts = {}
    for r in range(a.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        got = {}
        for k in order:
            t, s = morph_run(a.morph, job, os.path.join(work, "out"), a.short, a.extra, *runs[k])
            got[k] = window_seconds(t, a.short, a.extra)
            ms[k].append(1e3 * got[k])
            cuts[k] = s.get("cuts")
        ratios.append(got["planner"] / got["even"])
        print(f"round {r + 1}: planner {1e3 * got['planner']:.1f} ms/step, even {1e3 * got['even']:.1f}", flush=True)
    print(f"\nresnet18 on 2 stages (2 workers), {best['schedule']}: cuts planner {cuts['planner']}, even {cuts['even']}")
    print("| cut | ms/step (median) | step time vs even (min / median / max) |")
    print("|---|---|---|")
    print(f"| even split | {statistics.median(ms['even']):.1f} | 1 |")
    print(f"| planner | {statistics.median(ms['planner']):.1f} | {spread(ratios)} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--short", type=int, default=5, help="steps before the window")
    ap.add_argument("--extra", type=int, default=20, help="steps in the window")
    ap.add_argument("--modes", default="exact,float", help="Morph's reduction modes in the steps section")
    ap.add_argument("--only", default="steps,lm,stages", help="steps (resnet18), lm (the LM's steps), stages")
    ap.add_argument("--net", default="resnet18", help=argparse.SUPPRESS)
    ap.add_argument("--keep", help="work in DIR and keep it")
    ap.add_argument("--loop", action="store_true", help=argparse.SUPPRESS)  # the baseline's process
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--write", help=argparse.SUPPRESS)  # the files' process
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.loop:
        return loop_main(a)
    if a.write:
        return write_files(a.write)
    a.morph = os.path.abspath(a.morph)
    work = a.keep or tempfile.mkdtemp(prefix="morph-tvbench-")
    os.makedirs(work, exist_ok=True)
    # In a child process: this one must not import torch. A child forked
    # from it would start with its RSS, and ru_maxrss (Morph's
    # peak_rss_bytes, the loop's) survives exec: every figure would be at
    # least this process's size (304 MiB with torch imported).
    subprocess.run([sys.executable, os.path.abspath(__file__), "--write", work], check=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.2f}")
    only = a.only.split(",")
    if "steps" in only:
        steps_section(a, work, "resnet18")
    if "lm" in only:
        steps_section(a, work, "lm")
    if "stages" in only:
        stages_section(a, work)
    print(f"\ncut points and analysis time: build/bench/graph_bench {work}/resnet18.pt {work}/mobilenet_v2.pt "
          f"{work}/squeezenet1_1.pt")
    if not a.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    sys.exit(main())
