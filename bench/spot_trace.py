#!/usr/bin/env python3
"""Spot-instance trace replay (Varuna's Fig. 8, in small): a pipeline job of
gpt-mini on fortunes (2 stages, up to 4 workers, checkpoints every 50 steps)
under a scripted sequence of SIGKILLs and joins, one event every
`--every` seconds. Prints samples/s and workers per 10-second window, every
morph (shape, live or from the checkpoint, steps redone, seconds), and the
final model hash against the single-process run of the same job.

  python3 bench/spot_trace.py [--morph build/morph] [--steps 3000] [--every 20] [--keep DIR]

Windows are of wall clock (each step's commit time, unix_time in
metrics.jsonl), so a morph's pause and redone steps lower its window.
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import procs  # noqa: E402  (victims are the workers this script's job started, never found by name)
JOB = """[job]
name = "spot"
seed = 3
steps = {steps}
[data]
dataset = "fortunes-char"
seq_len = 64
[model]
name = "gpt-mini"
layers = 2
dim = 64
heads = 4
[batch]
global = 32
virtual_nodes = 8
[optim]
name = "adamw"
lr = 0.001
[checkpoint]
every = 50
[eval]
every = 100000
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--every", type=float, default=20.0, help="seconds between events")
    ap.add_argument("--seed", type=int, default=7, help="which worker each kill picks")
    ap.add_argument("--keep", help="copy the run folder and the manager's log here")
    a = ap.parse_args()
    binary = os.path.abspath(a.morph)
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.toml")
        with open(job, "w") as f:
            f.write(JOB.format(steps=a.steps))
        ref = subprocess.run([binary, "run", job, "--quiet", "--out", os.path.join(tmp, "ref")], capture_output=True,
                             text=True).stdout.strip().splitlines()[-1]
        out = os.path.join(tmp, "spot")
        log = open(os.path.join(tmp, "spot.log"), "w+")
        t0 = time.time()
        mgr = procs.start([binary, "run", job, "--workers", "4", "--stages", "2", "--quiet", "--out", out],
                          stdout=log, stderr=subprocess.STDOUT)
        token = os.path.join(out, "token")
        port = None
        while port is None and mgr.poll() is None:
            log.seek(0)
            m = re.search(r"manager on port (\d+)", log.read())
            port = m.group(1) if m else None
            time.sleep(0.05)
        events = []
        joiners = []
        next_event = time.time() + a.every
        kill_next = True
        while mgr.poll() is None:
            time.sleep(0.1)
            if time.time() < next_event:
                continue
            next_event += a.every
            # The job's live workers: those `morph run` spawned and the joiners started here.
            pids = procs.children(mgr.pid) + [p.pid for p in joiners if p.poll() is None]
            if kill_next and len(pids) > 1:
                victim = rng.choice(pids)
                os.kill(victim, signal.SIGKILL)
                events.append((time.time() - t0, "kill", len(pids) - 1))
            else:
                joiners.append(procs.start([binary, "worker", "--join", f"127.0.0.1:{port}", "--token-file", token],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                events.append((time.time() - t0, "join", len(pids) + 1))
            kill_next = not kill_next
        log.seek(0)
        text = log.read()
        got = text.strip().splitlines()[-1] if text.strip() else ""
        lines = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
        summary = json.load(open(os.path.join(out, "summary.json"))) if os.path.exists(
            os.path.join(out, "summary.json")) else {}
        procs.end(*joiners)
        # Samples/s per 10-second window of wall clock (commit times of the
        # steps), so the pauses of morphs and redone steps count.
        print(f"{'t (s)':>6} {'workers':>7} {'samples/s':>9} {'per worker':>10}")
        window = 10.0
        start = lines[0]["unix_time"] - lines[0]["step_seconds"] if lines else 0.0
        bucket, n, workers = 0, 0, 0
        for x in lines:
            b = int((x["unix_time"] - start) // window)
            while b > bucket:
                if n or workers:
                    print(f"{(bucket + 1) * window:6.0f} {workers:7d} {n * 32 / window:9.0f} "
                          f"{n * 32 / window / max(1, workers):10.0f}")
                bucket, n = bucket + 1, 0
            n += 1
            workers = x["workers"]
        print("events (wall s, kind, workers after):", ", ".join(f"{t:.0f} {k} {n}" for t, k, n in events))
        for r in summary.get("resizes", []):
            print(f"morph at step {r['step']}: {r['cause']} {r.get('from_shape')} -> {r.get('to_shape')} "
                  f"live={r.get('live')} redone={r.get('steps_redone')} {r['seconds'] * 1e3:.0f} ms "
                  f"{r.get('bytes_moved', 0) / 2**20:.2f} MiB")
        if a.keep:
            import shutil
            shutil.copytree(out, a.keep, dirs_exist_ok=True)
            shutil.copy(os.path.join(tmp, "spot.log"), a.keep)
        redone = sum(r.get("steps_redone", 0) for r in summary.get("resizes", []))
        print(f"morphs {len(summary.get('resizes', []))}, steps redone {redone}, wall {time.time() - t0:.0f} s")
        print(f"reference {ref}\nspot      {got}\n{'SAME' if got == ref else 'DIFFERENT'}")
        return 0 if got == ref else 1


if __name__ == "__main__":
    sys.exit(main())
