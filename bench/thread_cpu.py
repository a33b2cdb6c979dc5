#!/usr/bin/env python3
"""CPU time per steady step of every thread of a Morph run, from /proc.

Where vs_ddp.py gives a system's CPU per step as a whole (marginal over E
extra steps, all processes together), this splits it by thread: one of
vs_ddp.py's models (default the MLP) on W local workers (default 2) in
MODE (float, exact or exact32) for S steps (default 3000); after DELAY
seconds (start-up, the first steps) it reads utime, stime and the context
switch counts of every thread of `morph run`'s process tree, again WINDOW
seconds later, and counts the steps whose metrics line falls in between.
It prints per thread: CPU ms per step (user and system), voluntary and
involuntary context switches per step, then stops the run (the processes
it started, by their ids). Threads are named by process and thread id
(all are `morph-engine`); in a data-parallel worker the busiest is the
main thread (the VNs' compute, the buffer, the optimiser), and `perf
record -g -p PID` tells the others apart (Gloo's event loop, the c10d
work thread of the collectives, the prefetcher, the control plane's).

  /usr/bin/python3 bench/thread_cpu.py [--morph build/morph] [--model mlp] [--workers 2]
      [--mode float|exact|exact32] [--steps 3000] [--delay 12] [--window 8]
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402  (ending only what this script started)
import vs_ddp  # noqa: E402  (the models' job files)

HZ = os.sysconf("SC_CLK_TCK")


def tree(pid):
    """pid and every descendant process's."""
    out = [pid]
    for f in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            kids = open(f).read().split()
        except FileNotFoundError:
            continue
        for c in kids:
            out += tree(int(c))
    return out


def snapshot(root):
    """{(pid, tid): (utime, stime, voluntary, involuntary switches)} of root's tree."""
    d = {}
    for pid in tree(root):
        for t in glob.glob(f"/proc/{pid}/task/*"):
            try:
                f = open(t + "/stat").read().rsplit(")", 1)[1].split()
                st = dict(l.split(":\t", 1) for l in open(t + "/status").read().splitlines() if ":\t" in l)
                d[(pid, int(t.rsplit("/", 1)[1]))] = (int(f[11]), int(f[12]), int(st["voluntary_ctxt_switches"]),
                                                      int(st["nonvoluntary_ctxt_switches"]))
            except (FileNotFoundError, ProcessLookupError, IndexError, KeyError):
                pass  # a thread that ended between the listing and the read
    return d


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    vs_ddp.add_job_args(p, steps=3000)
    p.add_argument("--mode", default="float", choices=["float", "exact", "exact32"])
    p.add_argument("--delay", type=float, default=12.0, help="seconds before the window")
    p.add_argument("--window", type=float, default=8.0, help="seconds of the window")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="thread_cpu-")
    try:
        cmd, out = vs_ddp.morph_cmd(os.path.abspath(a.morph), a.model, a.workers, a.mode, a.steps, tmp)
        run = procs.start(cmd, stdout=subprocess.DEVNULL)
        try:
            time.sleep(a.delay)
            u0, s0 = time.time(), snapshot(run.pid)
            time.sleep(a.window)
            u1, s1 = time.time(), snapshot(run.pid)
            if run.poll() is not None:
                sys.exit("thread_cpu: the run ended inside the window; raise --steps")
            deadline = time.time() + 10
            while True:  # the line of the window's last step may come a little later
                lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
                if (lines and lines[-1]["unix_time"] >= u1) or time.time() > deadline:
                    break
                time.sleep(0.2)
        finally:
            procs.end(run)
        inside = [l for l in lines if u0 <= l["unix_time"] < u1]
        if len(inside) < 10:
            sys.exit(f"thread_cpu: {len(inside)} steps in the window; raise --window")
        n = len(inside)
        gens = sorted({l.get("generation") for l in inside})
        rows = []
        for k, v in s1.items():
            b = s0.get(k, (0, 0, 0, 0))
            rows.append(((v[0] - b[0]) / HZ / n * 1e3, (v[1] - b[1]) / HZ / n * 1e3, (v[2] - b[2]) / n,
                         (v[3] - b[3]) / n, k))
        rows.sort(key=lambda r: -(r[0] + r[1]))
        total = sum(r[0] + r[1] for r in rows)
        print(f"{a.model}, {a.mode}, {a.workers} workers: {n} steps in {u1 - u0:.2f} s, "
              f"{(u1 - u0) / n * 1e3:.2f} ms a step by wall clock, CPU {total:.2f} ms a step (all threads); "
              f"generations {gens}")
        print(f"{'pid':>8} {'tid':>8} {'CPU ms/step':>11} {'user':>7} {'system':>7} {'vol cs':>7} {'invol cs':>8}")
        for user, system, vol, invol, (pid, tid) in rows:
            if user + system == 0 and vol == 0:
                continue
            print(f"{pid:8d} {tid:8d} {user + system:11.3f} {user:7.3f} {system:7.3f} {vol:7.1f} {invol:8.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
