#!/usr/bin/env python3
"""Cost of the status page on training, by wall clock: the same job with
`--status off` and with the page on while a poller fetches /api/series,
/api/status and /metrics every 0.2 s (five browsers' worth of polling; a
browser polls once a second). examples/fmnist-mlp.toml
(evaluation only after the last step), in one process (the
page's record() runs in the training thread) and with 2 workers (it runs in
the manager, between the workers' steps).

Both sides are timed the same way: the wall clock between the commits of
step --warm and of the last step (`unix_time` of metrics.jsonl), so
everything between steps counts (the status page's record() and its
serving threads included), and start-up and the final evaluation do not.
The two settings alternate in R rounds (the order flips each round); each
round gives one ratio on/off of seconds per step. Printed: the medians of
ms per step and the ratio's min/median/max over rounds (> 1: the page
costs time).

  python3 bench/status_overhead.py [--morph build/morph] [--rounds 5] [--steps 600] [--warm 50]
"""
import argparse
import json
import os
import re
import statistics
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


def run(binary, job, steps, warm, workers, status, out):
    """Seconds per step between the commits of step `warm` and the last step; requests answered."""
    args = [binary, "run", job, "--steps", str(steps), "--set", "eval.every=0", "--out", out,
            "--status", "127.0.0.1:0" if status else "off"]
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
    with open(os.path.join(out, "metrics.jsonl")) as f:
        when = {x["step"]: x["unix_time"] for x in map(json.loads, f)}
    last = steps - 1
    return (when[last] - when[warm]) / (last - warm), counts[0]


def spread(xs):
    return f"{min(xs):.3f}/{statistics.median(xs):.3f}/{max(xs):.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--warm", type=int, default=50, help="the window starts at this step's commit")
    a = ap.parse_args()
    if a.steps < a.warm + 20:
        ap.error("--steps: at least --warm + 20")
    job = os.path.join(HERE, "..", "examples", "fmnist-mlp.toml")
    print(f"start: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average "
          f"{' '.join('%.2f' % x for x in os.getloadavg())}")
    print(f"wall ms per step over steps {a.warm}..{a.steps - 1} (commit to commit), medians of {a.rounds} rounds; "
          "ratio on/off per round min/median/max")
    print(f"{'workers':>8} {'off ms':>8} {'on ms':>8} {'on/off':>19} {'requests':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (0, 2):
            off, on, ratio, requests = [], [], [], []
            for r in range(a.rounds):
                got = {}
                for status in ((False, True) if r % 2 == 0 else (True, False)):
                    got[status] = run(a.morph, job, a.steps, a.warm, workers, status,
                                      os.path.join(tmp, f"{workers}-{r}-{status}"))
                off.append(got[False][0])
                on.append(got[True][0])
                ratio.append(got[True][0] / got[False][0])
                requests.append(got[True][1])
            print(f"{workers or 'in-proc':>8} {statistics.median(off) * 1e3:8.2f} {statistics.median(on) * 1e3:8.2f} "
                  f"{spread(ratio):>19} {min(requests):>9}", flush=True)
    print(f"end: load average {' '.join('%.2f' % x for x in os.getloadavg())}")


if __name__ == "__main__":
    sys.exit(main())
