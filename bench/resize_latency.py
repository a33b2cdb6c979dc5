#!/usr/bin/env python3
"""Resize latency: membership change -> first step committed in the new
generation, for join, leave (SIGTERM) and failure (SIGKILL), on an MLP of
about 1M and about 20M parameters (synthetic data, global batch 32, 8 VNs).
For the failure, the detection share is the time from the SIGKILL to the
manager noticing it. The step time printed beside it is the steady-state
step time of the same run (median wall clock between two step commits):
a resize cannot take less than one step. Only the processes the script
starts are ended (bench/procs.py).

  python3 bench/resize_latency.py [--morph build/morph]
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
sys.path.insert(0, HERE)
import procs  # noqa: E402  (only the processes this script starts are ended)
JOB = """[job]
name = "resize-{tag}"
seed = 1
steps = 100000
[data]
dataset = "synthetic"
train_size = 2048
test_size = 64
[model]
name = "mlp"
hidden = {hidden}
[batch]
global = 32
virtual_nodes = 8
[optim]
lr = 0.01
momentum = 0.9
"""


def params(hidden):
    dims = [784] + hidden + [10]
    return sum(a * b + b for a, b in zip(dims, dims[1:]))


def generation_seen(metrics, g):
    try:
        with open(metrics) as f:
            return any(f'"generation":{g},' in line or f'"generation":{g}}}' in line for line in f)
    except FileNotFoundError:
        return False


def wait(pred, what, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def run(binary, hidden, tag, tmp):
    job = os.path.join(tmp, f"{tag}.toml")
    with open(job, "w") as f:
        f.write(JOB.format(tag=tag, hidden=json.dumps(hidden)))
    out = os.path.join(tmp, f"out-{tag}")
    log = open(os.path.join(tmp, f"{tag}.log"), "w+")
    mgr = procs.start([binary, "run", job, "--workers", "3", "--quiet", "--out", out], stdout=log,
                      stderr=subprocess.STDOUT)
    metrics = os.path.join(out, "metrics.jsonl")
    joiner = None
    try:
        def port():
            log.seek(0)
            m = re.search(r"manager on port (\d+)", log.read())
            return m.group(1) if m else None
        wait(lambda: port() is not None, "the manager")
        p = port()
        wait(lambda: os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 20, "training")
        workers = procs.children(mgr.pid)  # the 3 workers `morph run` spawned
        if len(workers) != 3:
            raise SystemExit(f"expected 3 workers under the manager, found {workers}")
        # A failure (3 -> 2), then a join (2 -> 3), then a leave (3 -> 2).
        killed_at = time.time()
        os.kill(int(workers[1]), signal.SIGKILL)
        wait(lambda: generation_seen(metrics, 1), "the failure")
        time.sleep(0.5)
        joiner = procs.start([binary, "worker", "--join", f"127.0.0.1:{p}", "--token-file", os.path.join(out, "token")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait(lambda: generation_seen(metrics, 2), "the join")
        time.sleep(0.5)
        os.kill(int(workers[2]), signal.SIGTERM)
        wait(lambda: generation_seen(metrics, 3), "the leave")
        time.sleep(0.5)
        steps = [json.loads(line) for line in open(metrics)]
        gaps = [b["unix_time"] - x["unix_time"] for x, b in zip(steps[-21:], steps[-20:])]
        step_time = sorted(gaps)[len(gaps) // 2]  # wall clock between commits, everything between steps included
        # Stop the job and read the resizes from the manager's status record.
        status = json.loads(subprocess.run([binary, "status", "--join", f"127.0.0.1:{p}", "--token-file",
                                            os.path.join(out, "token")], capture_output=True,
                                           text=True).stdout)
        assert status["generation"] >= 3, status
    finally:
        procs.end(mgr, joiner)
    log.seek(0)
    lines = re.findall(r"generation (\d+): (\w+), (\d+) -> (\d+) workers, first step committed after ([\d.]+) s",
                       log.read())
    detected = [r["detected_unix_time"] for r in status["resizes"] if r["cause"] == "failure"]
    return lines, step_time, (detected[0] - killed_at) if detected else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    a = ap.parse_args()
    binary = os.path.abspath(a.morph)
    print(f"{'model':>12} {'params':>10} {'cause':>8} {'from':>4} {'to':>3} {'latency ms':>11} {'step ms':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for tag, hidden in (("1M", [1024, 192]), ("20M", [4096, 4096])):
            lines, step_time, detection = run(binary, hidden, tag, tmp)
            for g, cause, frm, to, secs in lines:
                extra = f"  (detection {detection * 1e3:.1f} ms)" if cause == "failure" else ""
                print(f"{'mlp-' + tag:>12} {params(hidden):>10} {cause:>8} {frm:>4} {to:>3} {float(secs) * 1e3:11.1f} "
                      f"{step_time * 1e3:8.1f}{extra}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
