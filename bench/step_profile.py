#!/usr/bin/env python3
"""CPU per steady step of a one-worker run, by function: Morph or DDP.

vs_ddp.py's one-worker figures are marginal times between a short and a
long run of the whole command, so start-up's spread lands in them; this
looks inside a steady span instead. It runs one of vs_ddp.py's models on one
worker: `morph run --workers 1` in MODE (float, exact or exact32), or DDP
(`--mode ddp`: bench/ddp_baseline.py as its lone rank 0, --json), waits
DELAY seconds (start-up, the first steps), then samples the busiest process
of the run (Morph's worker, DDP's rank) with `perf record -k
CLOCK_MONOTONIC -F 999 -g` for SPAN seconds, all its threads. The steps
counted are those that end between the first and the last sample (Morph:
the metrics lines' unix_time; DDP: its timeline's step ends, both on the
monotonic clock). It prints the span's wall ms per step, the sampled CPU ms
per step (samples at 999 Hz / steps) and the busiest functions' CPU ms per
step: compare the GEMM kernel's (the same OpenBLAS kernel on both sides, the
same products) to see whether one side's step holds work the other's does
not. Needs `perf` (linux-perf) and root or perf_event_paranoid <= 0; ends
only the processes it started.

  /usr/bin/python3 bench/step_profile.py [--morph build/morph] [--model mlp] [--mode float|exact|exact32|ddp]
      [--steps 3000] [--delay 8 (DDP: 18)] [--span 6] [--top 20]
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402  (ending only what this script started)
import vs_ddp  # noqa: E402  (the models' job files, DDP's command)
from thread_cpu import tree  # noqa: E402  (a process and its descendants)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_ticks(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0
    return int(f[11]) + int(f[12])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    vs_ddp.add_job_args(p, steps=3000)
    p.set_defaults(workers=1)
    p.add_argument("--mode", default="float", choices=["float", "exact", "exact32", "ddp"])
    p.add_argument("--delay", type=float, default=None, help="seconds before sampling (default 8, DDP 18)")
    p.add_argument("--span", type=float, default=6.0, help="seconds of sampling")
    p.add_argument("--top", type=int, default=20, help="functions to print")
    a = p.parse_args()
    if a.workers != 1:
        p.error("--workers: one worker only (the busiest process is the whole step)")
    if shutil.which("perf") is None:
        sys.exit("step_profile: needs perf (apt-get install linux-perf)")
    ddp = a.mode == "ddp"
    delay = a.delay if a.delay is not None else (18.0 if ddp else 8.0)
    tmp = tempfile.mkdtemp(prefix="step_profile-")
    data = os.path.join(tmp, "perf.data")
    try:
        if ddp:
            # A lone rank prints its own result (no launcher process, no pipe to fill).
            cmd = vs_ddp.ddp_cmd(a.model, 1, a.steps) + ["--rank", "0", "--port", str(free_port())]
            run = procs.start(cmd, stdout=subprocess.PIPE, text=True)
        else:
            cmd, out = vs_ddp.morph_cmd(os.path.abspath(a.morph), a.model, 1, a.mode, a.steps, tmp)
            run = procs.start(cmd, stdout=subprocess.DEVNULL)
        try:
            time.sleep(delay)
            ticks = {q: cpu_ticks(q) for q in tree(run.pid)}
            target = max(ticks, key=ticks.get)
            wall_minus_mono = time.time() - time.monotonic()
            subprocess.run(["perf", "record", "-k", "CLOCK_MONOTONIC", "-F", "999", "-g", "-p", str(target),
                            "-o", data, "--", "sleep", str(a.span)], check=True, stderr=subprocess.DEVNULL)
            if run.poll() is not None:
                sys.exit("step_profile: the run ended inside the span; raise --steps")
            if ddp:
                stdout, _ = run.communicate(timeout=600)
                res = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
                ends = [s["end"] for s in res["timeline"]]  # perf_counter: the monotonic clock
            else:
                time.sleep(1.0)  # the span's last metrics line
                with open(os.path.join(out, "metrics.jsonl")) as f:
                    ends = [json.loads(line)["unix_time"] - wall_minus_mono for line in f]
        finally:
            procs.end(run)
        times = subprocess.run(["perf", "script", "-i", data, "-F", "time"], check=True, capture_output=True,
                               text=True).stdout.split()
        times = [float(t.rstrip(":")) for t in times]
        t0, t1 = min(times), max(times)
        n = sum(1 for e in ends if t0 <= e < t1)
        if n < 10:
            sys.exit(f"step_profile: {n} steps in the span; raise --span")
        report = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "sym", "-F", "sample,sym",
                                 "--stdio", "-g", "none"], check=True, capture_output=True, text=True).stdout
        rows = []
        for line in report.splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[0].isdigit():
                rows.append((int(parts[0]), parts[1].strip()))
        total = sum(r[0] for r in rows)
        hz = 999.0
        what = "DDP (rank 0)" if ddp else f"Morph {a.mode} (worker)"
        print(f"{a.model}, {what}, 1 worker: {n} steps in {t1 - t0:.2f} s sampled, {(t1 - t0) / n * 1e3:.2f} ms a "
              f"step by wall clock, {total / hz / n * 1e3:.2f} CPU ms a step sampled ({total} samples, all threads)")
        for s, name in sorted(rows, reverse=True)[:a.top]:
            print(f"  {s / hz / n * 1e3:7.3f} ms/step  {s / total * 100:5.1f}%  {name[:110]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
