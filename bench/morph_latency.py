#!/usr/bin/env python3
"""Pipeline morph latency against stop-and-resume, on gpt-mini (fortunes,
about 0.1M parameters) and a 20M-parameter variant (6 blocks of width 512),
2 stages x 2 replicas, 4 local workers, checkpoints every 10 steps (all
kept, so the baseline can start from the one that was newest at the event).

In one run per model:
  1. SIGKILL one worker: the job morphs to 2 x 1 (live, the survivors keep
     their layers);
  2. a worker joins: back to 2 x 2, the joiner's layers sent by holders.

Morph latency = detection (kill -> manager notices; 0 for a join) + the
manager's record (notice -> the first step of the new generation
committed), split into the manager's planning, the slowest member's
rendezvous and state movement.

Stop-and-resume (Varuna's way of changing shape), the same work: for each
event, the job stopped and started again with `morph run --resume` on the
shape the morph went to (2 x 1 after the failure, 2 x 2 after the join),
from the newest checkpoint at or before the event's step S (the step the
new generation started at), timed from the start of that command until it
commits step S; plus the same detection. So both sides end at the same
step, with the same state: the script checks that the resumed run's loss
at step S equals the live run's (Morph's results do not depend on the
shape). The steps redone are S minus the checkpoint's step.

Every process the script starts is its own (a session of its own for each
`morph run`, the joiner's Popen); nothing else is killed.

  python3 bench/morph_latency.py [--morph build/morph] [--only small|20M]
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import procs  # noqa: E402

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
keep = 1000
"""


def lines_of(path):
    out = []
    try:
        with open(path) as f:
            for x in f:
                try:
                    out.append(json.loads(x))
                except json.JSONDecodeError:
                    break  # a line being written
    except FileNotFoundError:
        pass
    return out


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


def checkpoint_steps(folder):
    return sorted(int(d.split("-")[1]) for d in os.listdir(folder) if re.fullmatch(r"step-\d{12}", d))


def live(binary, job, tmp, tag):
    """The live run: a kill, then a join. Returns the two resize records
    (with "detection" added), the run's metrics lines and its folder."""
    out = os.path.join(tmp, f"out-{tag}")
    log = open(os.path.join(tmp, f"{tag}.log"), "w+")
    mgr = procs.start([binary, "run", job, "--workers", "4", "--stages", "2", "--quiet", "--out", out],
                      stdout=log, stderr=subprocess.STDOUT)
    joiner = None
    metrics = os.path.join(out, "metrics.jsonl")
    token = os.path.join(out, "token")
    try:
        def port():
            log.seek(0)
            m = re.search(r"manager on port (\d+)", log.read())
            return m.group(1) if m else None
        wait(lambda: port() is not None or mgr.poll() is not None, "the manager")
        p = port()
        if p is None:
            raise SystemExit(f"morph run ended ({mgr.returncode}); see {log.name}")
        wait(lambda: len(lines_of(metrics)) >= 25, "training")
        workers = procs.children(mgr.pid)  # the 4 workers `morph run` spawned
        if len(workers) != 4:
            raise SystemExit(f"expected 4 workers under the manager, found {workers}")
        killed_at = time.time()
        os.kill(workers[-1], signal.SIGKILL)
        wait(lambda: len(status(binary, p, token)["resizes"]) >= 1, "the failure's morph")
        time.sleep(1.0)
        joiner = procs.start([binary, "worker", "--join", f"127.0.0.1:{p}", "--token-file", token],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait(lambda: len(status(binary, p, token)["resizes"]) >= 2, "the join's morph")
        time.sleep(1.0)
        resizes = status(binary, p, token)["resizes"]
    finally:
        procs.end(mgr, joiner)
    resizes[0]["detection"] = resizes[0]["detected_unix_time"] - killed_at
    resizes[1]["detection"] = 0.0
    return resizes[:2], lines_of(metrics), out


def stop_and_resume(binary, job, tmp, tag, ckpt_dir, step, shape):
    """Seconds from starting `morph run --resume` on `shape` (P, D) from the
    newest checkpoint at or before `step` until it commits `step`; that
    checkpoint's step; the resumed run's metrics line of `step`."""
    base = max(s for s in checkpoint_steps(ckpt_dir) if s <= step)
    src = os.path.join(tmp, f"resume-from-{tag}-{step}")
    name = f"step-{base:012d}"
    shutil.copytree(os.path.join(ckpt_dir, name), os.path.join(src, name))
    out = os.path.join(tmp, f"resumed-{tag}-{step}")
    metrics = os.path.join(out, "metrics.jsonl")
    stages, replicas = shape
    log = open(os.path.join(tmp, f"{tag}-resume-{step}.log"), "w+")
    t0 = time.time()
    mgr = procs.start([binary, "run", job, "--workers", str(stages * replicas), "--stages", str(stages), "--quiet",
                       "--out", out, "--resume", src], stdout=log, stderr=subprocess.STDOUT)
    try:
        def reached():
            if mgr.poll() is not None:
                raise SystemExit(f"the resumed run ended ({mgr.returncode}); see {log.name}")
            return any(x["step"] >= step for x in lines_of(metrics))
        wait(reached, f"the resumed job's step {step}")
    finally:
        procs.end(mgr)
    line = next(x for x in lines_of(metrics) if x["step"] == step)
    shutil.rmtree(src, ignore_errors=True)
    return line["unix_time"] - t0, base, line


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    ap.add_argument("--only", choices=["small", "20M"])
    a = ap.parse_args()
    binary = os.path.abspath(a.morph)
    models = [("small", 2, 64), ("20M", 6, 512)]
    if a.only:
        models = [m for m in models if m[0] == a.only]
    print(f"start: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average "
          f"{' '.join('%.2f' % x for x in os.getloadavg())}")
    print(f"{'model':>6} {'event':>8} {'shape':>9} {'MiB moved':>9} {'detect':>7} {'plan':>6} {'rendezv':>7} "
          f"{'move':>6} {'total ms':>9} | {'step S':>6} {'ckpt':>5} {'redo':>4} {'resume ms':>10} {'ratio':>6} "
          f"{'same loss':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for tag, layers, dim in models:
            job = os.path.join(tmp, f"{tag}.toml")
            with open(job, "w") as f:
                f.write(JOB.format(tag=tag, layers=layers, dim=dim))
            rows, lines, out = live(binary, job, tmp, tag)
            gaps = [b["unix_time"] - x["unix_time"] for x, b in zip(lines[15:25], lines[16:25])]
            for event, r in zip(("failure", "join"), rows):
                s = r["step"]
                total = r["detection"] + r["seconds"]
                restart, base, line = stop_and_resume(binary, job, tmp, tag, os.path.join(out, "checkpoints"), s,
                                                      r["to_shape"])
                baseline = r["detection"] + restart
                mine = [x for x in lines if x["step"] == s]
                same = "yes" if mine and mine[-1]["loss"] == line["loss"] else "NO"
                shape = "x".join(map(str, r["from_shape"])) + ">" + "x".join(map(str, r["to_shape"]))
                print(f"{tag:>6} {event:>8} {shape:>9} {r['bytes_moved'] / 2**20:9.2f} {r['detection'] * 1e3:7.1f} "
                      f"{r['planning_seconds'] * 1e3:6.2f} {r['rendezvous_seconds'] * 1e3:7.1f} "
                      f"{r['move_seconds'] * 1e3:6.1f} {total * 1e3:9.1f} | {s:6d} {base:5d} {s - base:4d} "
                      f"{baseline * 1e3:10.0f} {baseline / total:5.1f}x {same:>9}", flush=True)
            print(f"{tag:>6} steady step {sorted(gaps)[len(gaps) // 2] * 1e3:.1f} ms (2 x 2, wall clock between "
                  "commits)", flush=True)
    print("total: kill (or joiner ready) -> the new generation's first step S committed. resume: the same detection "
          "+ a fresh `morph run --resume` on the new shape from the newest checkpoint <= S until it commits S "
          "(redo = S - ckpt steps done again). same loss: the resumed run's loss at step S equals the live run's.")


if __name__ == "__main__":
    sys.exit(main())
