#!/usr/bin/env python3
"""Simulator accuracy and plan quality, on gpt-mini over the fortunes text
(examples/fortunes-gpt.toml, VNs of 8 sequences of 64 characters).

1. Calibrate once (`morph calibrate`, timed): the profile every row uses.
2. Accuracy: for each configuration, `morph simulate --json` predicts the
   step time, then `morph run` measures it: the wall-clock time between the
   commits of consecutive steps (metrics.jsonl `unix_time`), over the steady
   steps (the first WARMUP steps and the last, which evaluates, left out),
   median over the steps. Data parallel with 1, 2 and 3 workers; pipelines of
   P = 2 and 3 with M = 4, 8, 16 VNs, gpipe / 1f1b / varuna, with and without
   recomputation; and with an emulated slow link (MORPH_TEST_PIPE_DELAY_MS,
   a per-message delay on the sender that only the test build's
   morph_crashy emulates, exec/pipeline.h's LinkEmulation: those rows run
   and simulate with --harness). Prints predicted, measured and the error
   per row, then the median and worst error.
   --repeat N measures every row N times, pass after pass (minutes apart),
   and prints each measurement's error and the spread between them.
   Each row is predicted twice from the same profile: with its contention
   model (`host_contention`, docs/planner.md) and without it (the key
   removed: the older `compute_contention` for every process), against the
   same measurements. --save FILE keeps the measurements, --replay FILE
   predicts them again (another build or profile) without running anything.
   --trace also decomposes each pipeline step from `morph run --trace`:
   per stage, the measured compute per step against the simulated busy
   time, and the gap between two schedules (reductions, optimiser, the
   worker's and manager's per-step work).
3. Plan quality (--quality): for 2 and 3 workers, every (P, D, schedule,
   recompute) the planner would consider is measured, and the planner's
   choice (`morph plan --json`, top 1) is compared with the best measured.

Usage: python3 bench/sim_accuracy.py [--morph build/morph] [--steps 30]
       [--harness build/tests/morph_crashy] [--quick] [--only N,N..]
       [--repeat N] [--save FILE | --replay FILE] [--profile FILE]
       [--trace] [--quality]
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


def measure(morph, out, vns, steps, workers=0, stages=1, schedule=None, recompute=False, delay=None, trace=False):
    """The median step time, and with `trace` a pipeline's decomposition (or None)."""
    cmd = [binary(morph, delay), "run", JOB, "--steps", str(steps), "--out", out, "--quiet"] + sets(vns) + \
        layout(workers, stages, schedule, recompute)
    tfile = os.path.join(out + ".trace.json")
    if trace and stages > 1:
        cmd += ["--trace", tfile]
    subprocess.run(cmd, check=True, env=delay_env(delay), stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = [json.loads(l) for l in f]
    t = [l["unix_time"] for l in lines]
    gaps = [b - a for a, b in zip(t[WARMUP:-2], t[WARMUP + 1:-1])]
    decomposition = None
    if trace and stages > 1:
        decomposition = decompose(tfile, lines[WARMUP]["step"], lines[-2]["step"])
    return statistics.median(gaps), decomposition


def decompose(path, first, last):
    """From a --trace file, over steps [first, last): per stage (replica 0),
    the median compute seconds per step (forward, backward, recompute), and
    the median gap between one step's last action and the next's first."""
    with open(path) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    busy, span = {}, {}
    for e in ev:
        step = e["args"]["step"]
        if not first <= step <= last:
            continue
        lo, hi = span.get(step, (float("inf"), 0.0))
        span[step] = (min(lo, e["ts"]), max(hi, e["ts"] + e["dur"]))
        if e["pid"] == 0 and e["cat"] in ("forward", "backward", "recompute"):
            busy[(e["tid"], step)] = busy.get((e["tid"], step), 0.0) + e["dur"] / 1e6
    stages = sorted({k for k, _ in busy})
    per_stage = [statistics.median([v for (k, s), v in busy.items() if k == st and s < last]) for st in stages]
    gaps = [(span[s + 1][0] - span[s][1]) / 1e6 for s in range(first, last) if s in span and s + 1 in span]
    spans = [(span[s][1] - span[s][0]) / 1e6 for s in range(first, last) if s in span]
    return {"stage_busy": per_stage, "gap": statistics.median(gaps), "span": statistics.median(spans)}


def predict(morph, profile, vns, workers=0, stages=1, schedule=None, recompute=False, delay=None):
    cmd = [binary(morph, delay), "simulate", JOB, "--profile", profile, "--json"] + sets(vns) + \
        layout(workers, stages, schedule, recompute)
    env = delay_env(delay)
    r = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
    doc = json.loads(r.stdout)
    return doc["step_seconds"], [s["busy_seconds"] for s in doc["stages"]]


def without_contention_model(profile, path):
    """The same profile without its contention model (the older one)."""
    with open(profile) as f:
        doc = json.load(f)
    doc.pop("host_contention", None)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    return path


def label_of(r):
    return f"N={r['workers']} P={r.get('stages', 1)} M={r['vns']} {r.get('schedule', '-')}" + \
        (" +recompute" if r.get("recompute") else "") + (f" delay {r['delay']}ms" if r.get("delay") else "")


def all_rows():
    rows = [dict(workers=1, vns=8), dict(workers=2, vns=8), dict(workers=3, vns=8)]
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
    return rows


def pct(x):
    return f"{x * 100:+6.1f}%"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(os.path.dirname(__file__), "..", "build", "morph"))
    ap.add_argument("--harness", default=os.path.join(os.path.dirname(__file__), "..", "build", "tests", "morph_crashy"),
                    help="the test build's morph: the emulated-link rows (MORPH_TEST_PIPE_DELAY_MS)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="a few rows only")
    ap.add_argument("--only", default="", help="comma-separated row numbers (1-based, as printed)")
    ap.add_argument("--repeat", type=int, default=1, help="measure every row this many times, pass after pass")
    ap.add_argument("--save", default="", help="write the measurements (JSON) here")
    ap.add_argument("--replay", default="", help="predict the measurements of this file (--save) again; runs nothing")
    ap.add_argument("--profile", default="", help="use this profile instead of calibrating")
    ap.add_argument("--trace", action="store_true", help="decompose pipeline steps from morph run --trace")
    ap.add_argument("--quality", action="store_true", help="also measure plan quality")
    a = ap.parse_args()
    global HARNESS
    HARNESS = os.path.abspath(a.harness)
    tmp = tempfile.mkdtemp(prefix="morph_simacc_")
    saved = None
    if a.replay:
        with open(a.replay) as f:
            saved = json.load(f)
    if a.profile or saved:
        if saved and not a.profile:
            profile = os.path.join(tmp, "profile.json")
            with open(profile, "w") as f:
                json.dump(saved["profile"], f, indent=2)
        profile = a.profile or profile
        print(f"profile: {a.profile or a.replay}")
    else:
        profile = os.path.join(tmp, "profile.json")
        t0 = time.time()
        subprocess.run([a.morph, "calibrate", JOB, "--out", profile, "--quiet"] + sets(4)[:4], check=True,
                       stdout=subprocess.DEVNULL)
        print(f"calibration: {time.time() - t0:.1f} s (wall clock of morph calibrate)")
    with open(profile) as f:
        prof_doc = json.load(f)
    hc = prof_doc.get("host_contention")
    print(f"contention model: host_contention {hc if hc is not None else '(none: the older model)'}, "
          f"compute_contention {prof_doc.get('compute_contention', 0):.3f}, "
          f"step_overhead_s {prof_doc.get('step_overhead_s', 0) * 1e3:.2f} ms")
    old_profile = without_contention_model(profile, os.path.join(tmp, "profile_old.json"))

    rows = all_rows()
    if a.quick:
        rows = rows[:2] + rows[3:5]
    if a.only:
        keep = {int(x) for x in a.only.split(",")}
        rows = [r for i, r in enumerate(rows) if i + 1 in keep]
    if saved:
        rows = saved["rows"]
    if not os.access(HARNESS, os.X_OK) and not saved:
        print(f"SKIPPED the emulated-link rows: {HARNESS} not found (the test build's binary: build with"
              " MORPH_BUILD_TESTS=ON, or pass --harness)")
        rows = [r for r in rows if not r.get("delay")]
    # Measurements: passes over every row, so a row's runs are minutes apart.
    if saved:
        meas = saved["measured"]
        traces = saved.get("traces", [[None] * len(rows) for _ in meas])
        times = saved.get("pass_times", [])
    else:
        meas, traces, times = [], [], []
        for rep in range(a.repeat):
            t_start = time.strftime("%H:%M:%S", time.gmtime())
            m, tr = [], []
            for i, r in enumerate(rows):
                v, d = measure(a.morph, os.path.join(tmp, f"run{rep}_{i}"), steps=a.steps, trace=a.trace,
                               **{k: r[k] for k in r if k != "label"})
                m.append(v)
                tr.append(d)
                print(f"pass {rep + 1}: {label_of(r):44s} measured {v * 1e3:8.2f} ms", flush=True)
            meas.append(m)
            traces.append(tr)
            times.append([t_start, time.strftime("%H:%M:%S", time.gmtime())])
    if a.save and not saved:
        with open(a.save, "w") as f:
            json.dump({"rows": rows, "measured": meas, "traces": traces, "pass_times": times, "steps": a.steps,
                       "profile": prof_doc}, f, indent=1)
    for p, (t0, t1) in enumerate(times):
        print(f"pass {p + 1}: {t0}-{t1} UTC")

    new_errs, old_errs = [], []
    hdr = f"{'#':>2s} {'configuration':44s} {'pred ms':>8s} {'old ms':>8s} " + \
        " ".join(f"{'meas' + str(p + 1):>8s}" for p in range(len(meas))) + \
        f" {'spread':>7s} {'error':>7s} {'old err':>7s}"
    print(hdr)
    for i, r in enumerate(rows):
        kw = {k: r[k] for k in r if k != "label"}
        pred, busy = predict(a.morph, profile, **kw)
        old, _ = predict(a.morph, old_profile, **kw)
        ms = [m[i] for m in meas]
        e_new = [(pred - x) / x for x in ms]
        e_old = [(old - x) / x for x in ms]
        new_errs += e_new
        old_errs += e_old
        spread = (max(ms) - min(ms)) / min(ms)
        print(f"{i + 1:2d} {label_of(r):44s} {pred * 1e3:8.2f} {old * 1e3:8.2f} " +
              " ".join(f"{x * 1e3:8.2f}" for x in ms) +
              f" {spread * 100:6.1f}% " + "/".join(pct(e).strip() for e in e_new) + "  " +
              "/".join(pct(e).strip() for e in e_old), flush=True)
        for p, tr in enumerate(traces):
            d = tr[i] if i < len(tr) else None
            if d:
                print("     pass %d trace: stage compute per step %s ms (simulated %s), gap between schedules "
                      "%.2f ms, schedule %.2f ms" % (p + 1, "/".join(f"{b * 1e3:.1f}" for b in d["stage_busy"]),
                                                      "/".join(f"{b * 1e3:.1f}" for b in busy), d["gap"] * 1e3,
                                                      d["span"] * 1e3))
    med = lambda e: statistics.median([abs(x) for x in e]) * 100
    worst = lambda e: max(abs(x) for x in e) * 100
    print(f"|error| with the contention model: median {med(new_errs):.1f}%, worst {worst(new_errs):.1f}% over "
          f"{len(new_errs)} measurements ({len(rows)} rows x {len(meas)})")
    print(f"|error| without it (older model):  median {med(old_errs):.1f}%, worst {worst(old_errs):.1f}%")
    if len(meas) > 1:
        sp = [(max(m[i] for m in meas) - min(m[i] for m in meas)) / min(m[i] for m in meas) for i in range(len(rows))]
        print(f"run-to-run spread (max/min - 1 per row): median {statistics.median(sp) * 100:.1f}%, "
              f"worst {max(sp) * 100:.1f}%")

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
                                                    stages=P, schedule=s, recompute=rc)[0]
            top = min(measured, key=measured.get)
            chosen = (best["stages"], best["replicas"], best["schedule"], best["recompute"])
            print(f"N={N}: planner chose {chosen} (predicted {best['step_seconds'] * 1e3:.2f} ms, measured "
                  f"{measured.get(chosen, float('nan')) * 1e3:.2f} ms); best measured {top} "
                  f"{measured[top] * 1e3:.2f} ms; chosen/best = {measured.get(chosen, float('nan')) / measured[top]:.3f}"
                  f" over {len(measured)} configurations")


if __name__ == "__main__":
    sys.exit(main())
