#!/usr/bin/env python3
"""Cost of the status page on a training step: the same job with
`--status off` and with the page on while a poller fetches /api/series,
/api/status and /metrics every 0.2 s (five browsers' worth of polling; a
browser polls once a second), alternating in rounds; the best round of each
counts (summary.json's steady-state samples_per_second). Fashion-MNIST MLP,
in this process (the page's record() runs in the training thread) and with
2 workers (it runs in the manager).

  python3 bench/status_overhead.py [--morph build/morph] [--rounds 3]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def poll(url, stop, counts):
    since = 0
    while not stop.is_set():
        try:
            s = json.load(urllib.request.urlopen(url + f"api/series?since={since}", timeout=2))
            since = s["count"]
            urllib.request.urlopen(url + "api/status", timeout=2).read()
            urllib.request.urlopen(url + "metrics", timeout=2).read()
            counts[0] += 3
        except OSError:
            pass
        stop.wait(0.2)


def run(binary, job, steps, workers, status, out):
    args = [binary, "run", job, "--steps", str(steps), "--out", out, "--status", "127.0.0.1:0" if status else "off"]
    if workers:
        args += ["--workers", str(workers)]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    stop, counts, t = threading.Event(), [0], None
    for line in p.stdout:
        m = re.search(r"status page on (http://\S+)", line)
        if m and status:
            t = threading.Thread(target=poll, args=(m.group(1), stop, counts))
            t.start()
    p.wait()
    stop.set()
    if t:
        t.join()
    if p.returncode:
        raise SystemExit(f"morph exited {p.returncode}")
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)["samples_per_second"], counts[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=600)
    a = ap.parse_args()
    job = os.path.join(HERE, "..", "examples", "fmnist-mlp.toml")
    print(f"{'workers':>8} {'steps':>6} {'off':>9} {'on+poll':>9} {'ratio':>7} {'requests':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (0, 2):
            off = on = 0.0
            requests = 0
            for r in range(a.rounds):
                off = max(off, run(a.morph, job, a.steps, workers, False, os.path.join(tmp, f"off{r}"))[0])
                sps, n = run(a.morph, job, a.steps, workers, True, os.path.join(tmp, f"on{r}"))
                on, requests = max(on, sps), max(requests, n)
            print(f"{workers or 'in-proc':>8} {a.steps:>6} {off:9.0f} {on:9.0f} {on / off:7.3f} {requests:>9}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
