#!/usr/bin/env python3
"""Simulator accuracy and plan quality, on gpt-mini over the fortunes text
(examples/fortunes-gpt.toml, VNs of 8 sequences of 64 characters).

1. Calibrate once (`morph calibrate`, timed): the profile every row uses.
2. Accuracy: for each configuration, `morph simulate --json` predicts the
   step time, then `morph run` measures it: the wall-clock time between the
   commits of consecutive steps (metrics.jsonl `unix_time`), over the steady
   steps (the first WARMUP steps and the last, which evaluates, left out),
   median over the steps. Data parallel with 1 and 2 workers; pipelines of
   P = 2 and 3 with M = 4, 8, 16 VNs, gpipe / 1f1b / varuna, with and without
   recomputation; and with an emulated slow link (MORPH_TEST_PIPE_DELAY_MS,
   a per-message delay on the sender that only the test build's
   morph_crashy emulates, exec/pipeline.h's LinkEmulation: those rows run
   and simulate with --harness). Prints predicted, measured and the error
   per row, then the median and worst error.
3. Plan quality (--quality): for 2 and 3 workers, every (P, D, schedule,
   recompute) the planner would consider is measured, and the planner's
   choice (`morph plan --json`, top 1) is compared with the best measured.

Usage: python3 bench/sim_accuracy.py [--morph build/morph] [--steps 30]
       [--harness build/tests/morph_crashy] [--quick] [--quality]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

JOB = os.path.join(os.path.dirname(__file__), "..", "examples", "fortunes-gpt.toml")
WARMUP = 5


def sets(vns):
    # VNs of 8 sequences (the profile's VN size) whatever M is.
    return ["--set", f"batch.global={8 * vns}", "--set", f"batch.virtual_nodes={vns}",
            "--set", "eval.every=0", "--set", "job.name=simacc"]


def layout(workers=0, stages=1, schedule=None, recompute=False):
    """The flags that place a configuration, shared by run and simulate."""
    args = []
    if workers:
        args += ["--workers", str(workers)]
    if stages > 1:
        args += ["--stages", str(stages)]
    if schedule:
        args += ["--schedule", schedule]
    if recompute:
        args += ["--recompute"]
    return args


DELAY_ENV = "MORPH_TEST_PIPE_DELAY_MS"  # read by the test build's morph_crashy only
HARNESS = None  # its path (--harness)


def delay_env(delay):
    env = {k: v for k, v in os.environ.items() if k != DELAY_ENV}
    if delay:
        env[DELAY_ENV] = str(delay)
    return env


def binary(morph, delay):
    """The shipped binary, or for an emulated link delay the test build's."""
    return HARNESS if delay else morph


def measure(morph, out, vns, steps, workers=0, stages=1, schedule=None, recompute=False, delay=None):
    cmd = [binary(morph, delay), "run", JOB, "--steps", str(steps), "--out", out, "--quiet"] + sets(vns) + \
        layout(workers, stages, schedule, recompute)
    subprocess.run(cmd, check=True, env=delay_env(delay), stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = [json.loads(l) for l in f]
    t = [l["unix_time"] for l in lines]
    gaps = [b - a for a, b in zip(t[WARMUP:-2], t[WARMUP + 1:-1])]
    return statistics.median(gaps)


def predict(morph, profile, vns, workers=0, stages=1, schedule=None, recompute=False, delay=None):
    cmd = [binary(morph, delay), "simulate", JOB, "--profile", profile, "--json"] + sets(vns) + \
        layout(workers, stages, schedule, recompute)
    env = delay_env(delay)
    r = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
    return json.loads(r.stdout)["step_seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(os.path.dirname(__file__), "..", "build", "morph"))
    ap.add_argument("--harness", default=os.path.join(os.path.dirname(__file__), "..", "build", "tests", "morph_crashy"),
                    help="the test build's morph: the emulated-link rows (MORPH_TEST_PIPE_DELAY_MS)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="a few rows only")
    ap.add_argument("--quality", action="store_true", help="also measure plan quality")
    a = ap.parse_args()
    global HARNESS
    HARNESS = os.path.abspath(a.harness)
    tmp = tempfile.mkdtemp(prefix="morph_simacc_")
    profile = os.path.join(tmp, "profile.json")
    t0 = time.time()
    subprocess.run([a.morph, "calibrate", JOB, "--out", profile, "--quiet"] + sets(4)[:4], check=True,
                   stdout=subprocess.DEVNULL)
    print(f"calibration: {time.time() - t0:.1f} s (wall clock of morph calibrate)")

    rows = [dict(workers=1, vns=8), dict(workers=2, vns=8)]
    for P in (2, 3):
        for M in (4, 8, 16):
            rows.append(dict(workers=P, stages=P, vns=M, schedule="1f1b"))
        for s in ("gpipe", "varuna"):
            rows.append(dict(workers=P, stages=P, vns=8, schedule=s))
        for s in ("1f1b", "varuna"):
            rows.append(dict(workers=P, stages=P, vns=8, schedule=s, recompute=True))
    rows.append(dict(workers=2, stages=2, vns=8, schedule="1f1b", delay=2))
    rows.append(dict(workers=2, stages=2, vns=8, schedule="gpipe", delay=2))
    rows.append(dict(workers=2, stages=2, vns=8, schedule="varuna", recompute=True, delay=2))
    if a.quick:
        rows = rows[:2] + rows[2:4]
    if not os.access(HARNESS, os.X_OK):
        print(f"SKIPPED the emulated-link rows: {HARNESS} not found (the test build's binary: build with"
              " MORPH_BUILD_TESTS=ON, or pass --harness)")
        rows = [r for r in rows if not r.get("delay")]
    errs = []
    print(f"{'configuration':44s} {'predicted ms':>12s} {'measured ms':>12s} {'error':>7s}")
    for r in rows:
        label = f"N={r['workers']} P={r.get('stages', 1)} M={r['vns']} {r.get('schedule', '-')}" + \
                (" +recompute" if r.get("recompute") else "") + (f" delay {r['delay']}ms" if r.get("delay") else "")
        pred = predict(a.morph, profile, **r)
        meas = measure(a.morph, os.path.join(tmp, "run"), steps=a.steps, **r)
        err = (pred - meas) / meas
        errs.append(abs(err))
        print(f"{label:44s} {pred * 1e3:12.2f} {meas * 1e3:12.2f} {err * 100:+6.1f}%", flush=True)
    print(f"|error| median {statistics.median(errs) * 100:.1f}%, worst {max(errs) * 100:.1f}% over {len(errs)} rows")

    if a.quality:
        for N in (2, 3):
            r = subprocess.run([a.morph, "plan", JOB, "--profile", profile, "--workers", str(N), "--json",
                                "--top", "1"] + sets(8), check=True, capture_output=True, text=True)
            best = json.loads(r.stdout)["plans"][0]
            measured = {}
            for P in range(1, N + 1):
                for D in range(1, N // P + 1):
                    scheds = [None] if P == 1 else ["gpipe", "1f1b", "varuna"]
                    for s in scheds:
                        for rc in ([False] if P == 1 else [False, True]):
                            key = (P, D, s or "-", rc)
                            measured[key] = measure(a.morph, os.path.join(tmp, "q"), 8, a.steps, workers=P * D,
                                                    stages=P, schedule=s, recompute=rc)
            top = min(measured, key=measured.get)
            chosen = (best["stages"], best["replicas"], best["schedule"], best["recompute"])
            print(f"N={N}: planner chose {chosen} (predicted {best['step_seconds'] * 1e3:.2f} ms, measured "
                  f"{measured.get(chosen, float('nan')) * 1e3:.2f} ms); best measured {top} "
                  f"{measured[top] * 1e3:.2f} ms; chosen/best = {measured.get(chosen, float('nan')) / measured[top]:.3f}"
                  f" over {len(measured)} configurations")


if __name__ == "__main__":
    sys.exit(main())
