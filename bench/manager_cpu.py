#!/usr/bin/env python3
"""CPU time of the manager (`morph run --workers N`) per 100 training steps.

Samples utime + stime of the `morph run` process itself (/proc/PID/stat
fields 14 and 15: its own threads, not its children) and the steps committed
(lines of metrics.jsonl) every 0.1 s, and reports the manager's CPU seconds
per 100 steps over the steady part of the run (from step 10 to the last
sample before it exits), plus the same while generation 0 forms.

  python3 bench/manager_cpu.py [--morph build/morph] [--before OLD/morph]
                               [--workers 2] [--steps 600] [--rounds 3] [--hidden 64]

--before runs an earlier build the same way, interleaved round by round
(these machines are shared and noisy: compare within one run).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

JOB = """[job]
name = "manager-cpu"
seed = 1
steps = {steps}
[data]
dataset = "synthetic"
train_size = {train}
test_size = 200
[model]
name = "mlp"
hidden = [{hidden}]
[batch]
global = 64
virtual_nodes = 8
[optim]
lr = 0.05
[elastic]
straggler_replan = false
"""

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): utime, stime are fields 14, 15.
    return (int(fields[11]) + int(fields[12])) / TICK


def steps_done(path):
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def run_once(morph, workers, steps, work, hidden):
    job = os.path.join(work, "job.toml")
    with open(job, "w") as f:
        f.write(JOB.format(steps=steps, hidden=hidden, train=max(2000, 64 * 4)))
    out = os.path.join(work, "out")
    p = subprocess.Popen([morph, "run", job, "--workers", str(workers), "--out", out, "--quiet",
                          "--status", "off"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = os.path.join(out, "metrics.jsonl")
    samples = []  # (seconds, cpu, steps)
    t0 = time.time()
    while p.poll() is None:
        try:
            samples.append((time.time() - t0, cpu_seconds(p.pid), steps_done(metrics)))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
        time.sleep(0.1)
    text = p.stdout.read()
    if p.returncode != 0:
        sys.exit(f"{morph} failed ({p.returncode}):\n{text}")
    first = next(s for s in samples if s[2] >= 10)
    last = samples[-1]
    start = next((s for s in samples if s[2] >= 1), last)
    per100 = (last[1] - first[1]) / max(1, last[2] - first[2]) * 100
    return {"per100": per100, "start_cpu": start[1], "start_s": start[0],
            "steady_steps": last[2] - first[2], "steady_s": last[0] - first[0]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default="build/morph")
    ap.add_argument("--before", default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64,
                    help="MLP width: 64 gives ~80 steps/s here, 2048 ~10 steps/s (a step's length decides how "
                         "often a polling manager looks per step)")
    a = ap.parse_args()
    builds = [("before", a.before)] if a.before else []
    builds.append(("this build", a.morph))
    res = {name: [] for name, _ in builds}
    for r in range(a.rounds):
        for name, morph in builds:
            with tempfile.TemporaryDirectory() as work:
                res[name].append(run_once(morph, a.workers, a.steps, work, a.hidden))
    print(f"manager CPU seconds per 100 steps ({a.workers} workers, MLP hidden {a.hidden}, {a.steps} steps, "
          f"{a.rounds} rounds; "
          f"min / median / max), and until the first step")
    for name, _ in builds:
        v = sorted(x["per100"] for x in res[name])
        s = sorted(x["start_cpu"] for x in res[name])
        sec = sorted(x["steady_steps"] / x["steady_s"] for x in res[name])
        print(f"  {name:10s}: {v[0]:.3f} / {v[len(v)//2]:.3f} / {v[-1]:.3f} s per 100 steps; "
              f"start-up {s[len(s)//2]:.3f} s CPU; {sec[len(sec)//2]:.0f} steps/s")


if __name__ == "__main__":
    main()
