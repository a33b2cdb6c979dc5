#!/usr/bin/env python3
"""Pipeline morph latency against stop-and-resume, on gpt-mini (fortunes,
about 0.1M parameters) and a 20M-parameter variant (6 blocks of width 512),
2 stages x 2 replicas, 4 local workers, checkpoints every 10 steps.

In one run per model:
  1. SIGKILL one worker: the job morphs to 2 x 1 (live, the survivors keep
     their layers);
  2. a worker joins: back to 2 x 2, the joiner's layers sent by holders;
  3. the whole job is killed and restarted with --resume on 3 workers
     (Varuna's way of changing shape): process start, data, rendezvous and
     checkpoint load until the first step is committed, plus the steps since
     the checkpoint that must be done again.

Morph latency = detection (kill -> manager notices) + the manager's record
(notice -> first step committed in the new generation), split into the
manager's planning, the slowest member's rendezvous and state movement.

  python3 bench/morph_latency.py [--morph build/morph] [--only small|20M]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = """[job]
name = "morph-{tag}"
seed = 1
steps = 100000
[data]
dataset = "fortunes-char"
seq_len = 64
[model]
name = "gpt-mini"
layers = {layers}
dim = {dim}
heads = 4
[batch]
global = 32
virtual_nodes = 8
[optim]
name = "adamw"
lr = 0.001
[checkpoint]
every = 10
"""


def lines_of(path):
    try:
        with open(path) as f:
            return [json.loads(x) for x in f if x.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def wait(pred, what, timeout=600):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.01)
    raise SystemExit(f"timed out waiting for {what}")


def status(binary, port, token):
    out = subprocess.run([binary, "status", "--join", f"127.0.0.1:{port}", "--token-file", token],
                         capture_output=True, text=True).stdout
    return json.loads(out)


def run(binary, tag, layers, dim, tmp):
    job = os.path.join(tmp, f"{tag}.toml")
    with open(job, "w") as f:
        f.write(JOB.format(tag=tag, layers=layers, dim=dim))
    out = os.path.join(tmp, f"out-{tag}")
    log = open(os.path.join(tmp, f"{tag}.log"), "w+")
    mgr = subprocess.Popen([binary, "run", job, "--workers", "4", "--stages", "2", "--quiet", "--out", out],
                           stdout=log, stderr=subprocess.STDOUT)
    metrics = os.path.join(out, "metrics.jsonl")
    token = os.path.join(out, "token")
    rows = {}
    try:
        def port():
            log.seek(0)
            m = re.search(r"manager on port (\d+)", log.read())
            return m.group(1) if m else None
        wait(lambda: port() is not None, "the manager")
        p = port()
        wait(lambda: len(lines_of(metrics)) >= 25, "training")
        step_time = sorted(s["step_seconds"] for s in lines_of(metrics)[-10:])[5]
        workers = subprocess.run(["pgrep", "-f", f"^{binary} worker --join 127.0.0.1:{p}"], capture_output=True,
                                 text=True).stdout.split()
        killed_at = time.time()
        os.kill(int(workers[-1]), signal.SIGKILL)
        wait(lambda: len(status(binary, p, token)["resizes"]) >= 1, "the failure's morph")
        time.sleep(1.0)
        subprocess.Popen([binary, "worker", "--join", f"127.0.0.1:{p}", "--token-file", token],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait(lambda: len(status(binary, p, token)["resizes"]) >= 2, "the join's morph")
        time.sleep(1.0)
        resizes = status(binary, p, token)["resizes"]
        rows["failure"] = resizes[0]
        rows["failure"]["detection"] = resizes[0]["detected_unix_time"] - killed_at
        rows["join"] = resizes[1]
        rows["join"]["detection"] = 0.0
        done = len(lines_of(metrics))
    finally:
        mgr.send_signal(signal.SIGKILL)
        mgr.wait()
        subprocess.run(["pkill", "-9", "-f", f"{binary} worker --join 127.0.0.1:{p}"], capture_output=True)
    # Stop and resume: the newest checkpoint, a fresh job on 3 workers.
    ckpts = sorted(int(d.split("-")[1]) for d in os.listdir(os.path.join(out, "checkpoints")) if d.startswith("step-"))
    redo = done - ckpts[-1]
    out2 = os.path.join(tmp, f"resume-{tag}")
    log2 = open(os.path.join(tmp, f"{tag}-resume.log"), "w+")
    t0 = time.time()
    mgr = subprocess.Popen([binary, "run", job, "--workers", "3", "--stages", "3", "--quiet", "--out", out2,
                            "--resume", os.path.join(out, "checkpoints")], stdout=log2, stderr=subprocess.STDOUT)
    try:
        wait(lambda: len(lines_of(os.path.join(out2, "metrics.jsonl"))) >= 1, "the resumed job's first step")
        restart = time.time() - t0
    finally:
        mgr.send_signal(signal.SIGKILL)
        mgr.wait()
        subprocess.run(["pkill", "-9", "-f", f"{binary} worker --join"], capture_output=True)
    return rows, step_time, restart, redo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    ap.add_argument("--only", choices=["small", "20M"])
    a = ap.parse_args()
    binary = os.path.abspath(a.morph)
    models = [("small", 2, 64), ("20M", 6, 512)]
    if a.only:
        models = [m for m in models if m[0] == a.only]
    print(f"{'model':>6} {'event':>8} {'shape':>9} {'MiB moved':>9} {'detect':>7} {'plan':>6} {'rendezv':>7} "
          f"{'move':>6} {'total ms':>9} | {'restart ms':>10} {'redo':>5} {'redo ms':>8} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for tag, layers, dim in models:
            rows, step_time, restart, redo = run(binary, tag, layers, dim, tmp)
            stop_resume = restart + redo * step_time
            for event in ("failure", "join"):
                r = rows[event]
                total = r["detection"] + r["seconds"]
                shape = "x".join(map(str, r["from_shape"])) + ">" + "x".join(map(str, r["to_shape"]))
                print(f"{tag:>6} {event:>8} {shape:>9} {r['bytes_moved'] / 2**20:9.2f} {r['detection'] * 1e3:7.1f} "
                      f"{r['planning_seconds'] * 1e3:6.2f} {r['rendezvous_seconds'] * 1e3:7.1f} "
                      f"{r['move_seconds'] * 1e3:6.1f} {total * 1e3:9.1f} | {restart * 1e3:10.0f} {redo:5d} "
                      f"{redo * step_time * 1e3:8.0f} {stop_resume / total:6.1f}x", flush=True)
            print(f"{tag:>6} steady step {step_time * 1e3:.1f} ms (2 x 2)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
