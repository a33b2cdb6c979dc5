#!/usr/bin/env python3
"""WSP time to accuracy (issue 28): the Fashion-MNIST CNN (examples/fmnist-cnn.toml)
to a test accuracy (default 88%) by wall clock, sync against WSP with
staleness D, on W virtual workers of which every second one is an emulated
device SLOW times slower, each worker in a network namespace of its own on a
bridge with every link shaped to LINK (bench/netns.py; tc netem, or tbf where
the kernel has no netem). Root and iproute2.

Systems, each run with the same resources file (docs/resources.md: slot 0 on
"local", slot i on namespace i's address, [network] between_hosts_gbps = LINK
and [hosts] one_machine = true (the namespaces' workers share this
machine's cores), which only the planner reads):

  sync          `morph run --resources`: even VN shares (a sync job's default)
  sync A+B      the same with a plan file of the speed-sized shares a WSP job
                gets on these devices (as bench/wsp_clock.py does)
  wsp D=d       `sync.mode = "wsp"`, `sync.staleness = d`, `sync.wave = WAVE`
                (speed-sized shares, docs/wsp.md)

Each run is `morph run JOB --set job.seed=S --set eval.every=E ...`, the
manager and worker 0 in the first namespace, `morph worker --join` in the
others. The bench reads metrics.jsonl's evaluation lines (`test_accuracy`,
`unix_time` of the step's commit, `eval_seconds`) while the job runs and, by
default, ends the job once the target is reached (--full: run every step).
In WSP mode the evaluations are of worker 0's local weights after its
minibatch (docs/wsp.md), in sync mode of the model.

Time is measured from the launch of `morph run` (start-up, data loading and
joining included), as wall clock ("wall") and as wall clock less the
evaluations done before that point ("train"; an evaluation is the bench's
probe, not training). Prints, per worker count:

  1. the predicted time per clock: `morph plan --json` (WSP and sync with the
     same shares) and `morph simulate --json` (sync, even shares) on this
     machine's profile (`morph calibrate`, run first); the planner adds LINK
     to WSP's pushes and pulls between hosts and to sync's gradient sums
     whose ranks span hosts, for the bytes each rank sends (docs/resources.md);
  2. per seed, accuracy against time: one row per evaluated step, each
     system's `accuracy @ train seconds`;
  3. time to the target: per system the wall and train seconds and steps
     of each seed, the medians, and how much sooner than sync (even shares)
     and sync with the same shares: 1 - t / t_sync, by wall clock and by
     train time (goal: WSP at its best D >= 30% sooner than sync). Wall is
     the fairer one: while worker 0 evaluates, a WSP job's other workers
     go on (up to D waves), a sync job's wait, so subtracting the
     evaluations favours WSP;
  4. after each WSP run that finished (--full, or the target not reached), where
     each VW's wall clock went, per clock (summary.json's wsp.vw_seconds):
     its minibatches (compute; compute_cpu: its main thread's CPU time in
     them, which a slower emulated device's sleep is not), the callback after
     each (metrics, evaluations), its pushes, the gate (its own shard's pull)
     and the other shards' pull replies;
  5. time per clock, measured (mean train seconds per step of worker 0's
     lines from 10% of the steps to the last line, evaluations subtracted,
     times WAVE for WSP) beside the prediction. Worker 0 may lead the
     slowest worker by up to D waves, so for WSP its rate is a lower bound
     on the clock's time; "bound" is the time if the lead grew by D waves
     over the window (a job ended at its target may end with worker 0 ahead).

  python3 bench/wsp_tta.py [--vws 2,4] [--seeds 1,2,3] [--staleness 0,1,4,32] [--wave 4] [--stale-update R]
        [--server-steps per_minibatch|per_clock] [--slow 2]
        [--link 100mbit] [--target 0.88] [--eval-every 50] [--steps N] [--systems sync,sync-shares,wsp]
        [--full] [--run-timeout 600] [--json FILE] [--keep DIR]
  python3 bench/wsp_tta.py --quick    (smoke: 2 VWs, seed 1, 40 steps, evaluation every 10, target 0.5)
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import netns

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
JOB = os.path.join(ROOT, "examples", "fmnist-cnn.toml")
# A loaded 2-core machine and a 100 Mbit/s link must not look like a dead worker.
HEARTBEAT = ["--heartbeat-timeout", "60"]


def write_resources(path, workers, slow, ips, link_gbps):
    """Slot i: type fast (even i) or slow (odd i); slot 0 on "local" (started
    by `morph run`), slot i on namespace i's address (it joins)."""
    with open(path, "w") as f:
        f.write(f"[types.fast]\nmemory_mib = 4096\n[types.slow]\nmemory_mib = 4096\nslowdown = {slow}\n")
        for i in range(workers):
            host = "local" if i == 0 else ips[i]
            f.write(f"[[devices]]\ntype = \"{'slow' if i % 2 else 'fast'}\"\nhost = \"{host}\"\ncount = 1\n")
        f.write(f"[network]\nbetween_hosts_gbps = {link_gbps:g}\nbetween_hosts_latency_us = 0\n")
        f.write("[hosts]\none_machine = true\n")  # network namespaces of this machine: its cores
    return path


def sets(system, a, seed):
    """The job keys of one run (`--set`)."""
    s = ["--set", f"job.seed={seed}", "--set", f"eval.every={a.eval_every}"]
    if a.steps:
        s += ["--set", f"job.steps={a.steps}"]
    if system.startswith("wsp"):
        s += ["--set", "sync.mode=wsp", "--set", f"sync.staleness={int(system[3:])}", "--set", f"sync.wave={a.wave}"]
        if a.stale_update:
            s += ["--set", f"sync.stale_update={a.stale_update}"]
        if a.server_steps:
            s += ["--set", f"sync.server_steps={a.server_steps}"]
    return s


def predict(a, morph, profile, res, workers, systems):
    """{system: predicted seconds per clock}, the WSP shares, and per WSP
    system its predicted seconds per step's minibatches."""
    per_clock, per_step, shares = {}, {}, None
    for system in systems:
        if system == "sync":  # even shares: what `morph run --resources` gives a sync job
            p = json.loads(subprocess.run([morph, "simulate", a.job, "--profile", profile, "--resources", res,
                                           "--workers", str(workers), "--json"] + sets("sync", a, 1),
                                          check=True, capture_output=True, text=True).stdout)
            per_clock[system] = per_step[system] = p["step_seconds"]
            continue
        d = int(system[3:]) if system.startswith("wsp") else 0
        p = json.loads(subprocess.run([morph, "plan", a.job, "--profile", profile, "--resources", res, "--json"]
                                      + sets(f"wsp{d}", a, 1), check=True, capture_output=True,
                                      text=True).stdout)["wsp"]
        shares = p["vn_shares"]
        if system == "sync-shares":
            per_clock[system] = per_step[system] = p["sync_step_seconds"]
        else:
            per_clock[system], per_step[system] = p["clock_seconds"], p["step_seconds"]
    return per_clock, per_step, shares


def read_lines(path):
    """The complete metrics lines written so far."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    out.append(json.loads(line))
    except FileNotFoundError:
        pass
    return out


def run_one(a, net, morph, job_args, workers, out, log, t_limit):
    """Runs one job across the namespaces until it ends, reaches the target
    (unless --full) or runs past t_limit seconds. Returns (launch unix time,
    metrics lines, how it ended)."""
    t0 = time.time()
    started = netns.start_morph(net, [morph, "run", a.job, "--out", out, "--quiet", "--status", "off"] + HEARTBEAT
                                + job_args, workers, out, log)
    how = "finished"
    try:
        metrics = os.path.join(out, "metrics.jsonl")
        while True:
            if started[0].poll() is not None:
                for p in started[1:]:
                    try:
                        p.wait(30)
                    except subprocess.TimeoutExpired:
                        pass
                if started[0].returncode != 0:
                    how = f"exit {started[0].returncode}"
                break
            if not a.full and any(x.get("test_accuracy", -1) >= a.target for x in read_lines(metrics)):
                how = "stopped at target"
                break
            if time.time() - t0 > t_limit:
                how = f"stopped after {t_limit:.0f} s"
                break
            time.sleep(0.2)
    finally:
        netns.end(started)
    return t0, read_lines(os.path.join(out, "metrics.jsonl")), how


def curve(t0, lines):
    """[(step, accuracy, train s, wall s)] of the evaluation lines."""
    out, evals = [], 0.0
    for x in lines:
        if "test_accuracy" in x:
            wall = x["unix_time"] - t0
            out.append((x["step"], x["test_accuracy"], wall - evals, wall))
            evals += x.get("eval_seconds", 0.0)
    return out


def to_target(points, target):
    for step, acc, train, wall in points:
        if acc >= target:
            return step, train, wall
    return None


def measured_step(lines, steps, lead_steps=0):
    """(mean seconds per step of the lines from 10% of the steps on, the
    evaluations in that window subtracted; the same if the slowest worker
    ran `lead_steps` fewer steps in the window than these lines show, None
    if the window is not longer than that), or (None, None) with fewer than
    2 lines."""
    first = max(2, steps // 10)
    w = [x for x in lines if x["step"] >= first]
    if len(w) < 2:
        return None, None
    evals = sum(x.get("eval_seconds", 0.0) for x in w[:-1])
    t, n = w[-1]["unix_time"] - w[0]["unix_time"] - evals, w[-1]["step"] - w[0]["step"]
    return t / n, (t / (n - lead_steps) if n > lead_steps else None)


def vw_seconds(out):
    """summary.json's wsp.vw_seconds of a WSP run that finished (docs/wsp.md,
    "Where a clock's time goes"), else None."""
    try:
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f).get("wsp", {}).get("vw_seconds") or None
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def print_vw_seconds(rows, clocks):
    """Each VW's wall clock per clock, by part (a finished WSP run)."""
    parts = ("compute", "compute_cpu", "minibatch", "push", "gate", "pull", "checkpoint")
    print(f"    ms per clock ({clocks} clocks), by VW: " + ", ".join(parts) + ", sum (compute_cpu is part of compute)")
    for x in rows:
        total = sum(x[p] for p in parts if p != "compute_cpu")
        print(f"    | VW {x['vw']} | " + " | ".join(f"{1e3 * x[p] / clocks:.1f}" for p in parts)
              + f" | {1e3 * total / clocks:.1f} |", flush=True)


def job_steps(a):
    if a.steps:
        return a.steps
    import tomllib  # Python 3.11+
    with open(a.job, "rb") as f:
        return tomllib.load(f)["job"]["steps"]


def fmt_s(x):
    return "-" if x is None else f"{x:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--morph", default=os.path.join(ROOT, "build", "morph"))
    ap.add_argument("--job", default=JOB)
    ap.add_argument("--vws", default="2,4", help="comma-separated virtual worker counts (every second one slow)")
    ap.add_argument("--seeds", default="1,2,3", help="comma-separated job.seed values")
    ap.add_argument("--staleness", default="0,1,4,32", help="comma-separated WSP staleness bounds D")
    ap.add_argument("--wave", type=int, default=4, help="sync.wave of every WSP run")
    ap.add_argument("--stale-update", default="", help="sync.stale_update of every WSP run (default: the job's)")
    ap.add_argument("--server-steps", default="",
                    help="sync.server_steps of every WSP run: per_minibatch or per_clock (default: the job's)")
    ap.add_argument("--slow", type=float, default=2.0, help="slowdown of every second worker")
    ap.add_argument("--link", default="100mbit", help="tc rate of every veth end (RATE, or RATE:DELAY with netem)")
    ap.add_argument("--target", type=float, default=0.88, help="test accuracy to reach")
    ap.add_argument("--eval-every", type=int, default=50, help="eval.every: steps between evaluations")
    ap.add_argument("--steps", type=int, default=0, help="job.steps (default: the job file's)")
    ap.add_argument("--systems", default="sync,sync-shares,wsp", help="comma-separated: sync, sync-shares, wsp")
    ap.add_argument("--full", action="store_true", help="run every step instead of ending a job at the target")
    ap.add_argument("--run-timeout", type=float, default=600, help="seconds before a run is ended unfinished")
    ap.add_argument("--json", default="", help="write every run's curve and figures to this file")
    ap.add_argument("--keep", default="", help="keep every run's folder and manager log under this directory")
    ap.add_argument("--quick", action="store_true",
                    help="smoke configuration: --vws 2 --seeds 1 --steps 40 --eval-every 10 --target 0.5")
    a = ap.parse_args()
    if a.quick:
        a.vws, a.seeds, a.steps, a.eval_every, a.target = "2", "1", 40, 10, 0.5
    if os.geteuid() != 0:
        ap.error("needs root (network namespaces, tc)")
    a.job = os.path.abspath(a.job)
    morph = os.path.abspath(a.morph)
    vws = [int(x) for x in a.vws.split(",") if x]
    seeds = [int(x) for x in a.seeds.split(",") if x]
    if min(vws) < 2:
        ap.error("--vws: WSP needs at least 2 virtual workers")
    kinds = [x for x in a.systems.split(",") if x]
    systems = [s for s in ("sync", "sync-shares") if s in kinds]
    if "wsp" in kinds:
        systems += [f"wsp{int(d)}" for d in a.staleness.split(",") if d]
    steps = job_steps(a)
    link_gbps = netns.rate_bits(a.link.partition(":")[0]) / 1e9
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"start {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, commit {commit}, load average "
          f"{' '.join('%.2f' % x for x in os.getloadavg())}", flush=True)
    print(f"job {os.path.relpath(a.job)}, {steps} steps, eval every {a.eval_every}, target {a.target:g}; "
          f"every second VW {a.slow:g}x slower; link {a.link}; WSP wave {a.wave}"
          + (f", sync.server_steps {a.server_steps}" if a.server_steps else "") + f"; seeds {a.seeds}"
          + ("" if a.full else "; each job ended at its target"), flush=True)

    def stop(signum, _frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, stop)
    net = None
    report = {"argv": sys.argv[1:], "commit": commit, "runs": []}
    tmp = tempfile.mkdtemp(prefix="wsp_tta.") if not a.keep else os.path.abspath(a.keep)
    os.makedirs(tmp, exist_ok=True)
    try:
        profile = os.path.join(tmp, "profile.json")
        subprocess.run([morph, "calibrate", a.job, "--out", profile, "--quiet"], check=True, capture_output=True)
        layers = json.load(open(profile))["fingerprint"]["layers"]
        net = netns.Net(max(vws), prefix="wtta", ifprefix="wt", subnet=202)
        net.up()
        net.shape(a.link)
        print(f"every veth end: tc qdisc {net.qdisc}", flush=True)
        for workers in vws:
            res = write_resources(os.path.join(tmp, f"devices-{workers}.toml"), workers, a.slow, net.ips, link_gbps)
            pred_clock, pred_step, shares = predict(a, morph, profile, res, workers, systems)
            plan = os.path.join(tmp, f"shares-{workers}.json")
            share_text = "+".join(str(x) for x in shares) if shares else "?"
            if "sync-shares" in systems:
                with open(plan, "w") as f:
                    json.dump({"stages": [[layers[0], layers[-1]]], "vn_shares": shares}, f)

            def name(s):
                return {"sync": "sync (even)", "sync-shares": f"sync {share_text}"}.get(s, f"wsp D={s[3:]}")
            print(f"\n## {workers} virtual workers (WSP VN shares {share_text})\n", flush=True)
            results = {s: [] for s in systems}
            for i, seed in enumerate(seeds):
                order = systems[i % len(systems):] + systems[:i % len(systems)]  # rotated per seed
                for s in order:
                    out = os.path.join(tmp, f"w{workers}-s{seed}-{s}")
                    extra = ["--resources", res] + (["--plan", plan] if s == "sync-shares" else [])
                    t0, lines, how = run_one(a, net, morph, extra + sets(s, a, seed), workers, out, out + ".log",
                                             a.run_timeout)
                    pts = curve(t0, lines)
                    hit = to_target(pts, a.target)
                    k = a.wave if s.startswith("wsp") else 1
                    per, bound = measured_step(lines, steps, int(s[3:]) * a.wave if s.startswith("wsp") else 0)
                    r = dict(workers=workers, seed=seed, system=s, how=how, curve=pts, hit=hit,
                             step_seconds=per, clock_seconds=None if per is None else per * k,
                             clock_bound=None if bound is None else bound * k, vw_seconds=vw_seconds(out))
                    results[s].append(r)
                    report["runs"].append(r)
                    print(f"  ran {name(s)} seed {seed}: {how}, {len(lines)} lines, target "
                          + (f"at step {hit[0]}, {hit[1]:.1f} s train, {hit[2]:.1f} s wall" if hit else "not reached")
                          + f" (load {os.getloadavg()[0]:.2f})", flush=True)
                    if how.startswith("exit"):
                        print(f"    manager log: {out}.log", flush=True)
                    if r["vw_seconds"]:
                        print_vw_seconds(r["vw_seconds"], -(-steps // a.wave))
            for seed_i, seed in enumerate(seeds):
                print(f"\naccuracy @ train seconds, {workers} VWs, seed {seed}\n")
                print("| step | " + " | ".join(name(s) for s in systems) + " |")
                print("|---" * (len(systems) + 1) + "|")
                rows = sorted({p[0] for s in systems for p in results[s][seed_i]["curve"]})
                for step in rows:
                    cells = []
                    for s in systems:
                        p = [q for q in results[s][seed_i]["curve"] if q[0] == step]
                        cells.append(f"{p[0][1]:.3f} @ {p[0][2]:.1f}" if p else "")
                    print(f"| {step} | " + " | ".join(cells) + " |")
            print(f"\ntime to {a.target:g}, {workers} VWs: wall s (train s) at step, per seed; medians; sooner than "
                  "sync = 1 - t / t_sync of the medians, by wall clock (by train time in brackets)\n")
            print("| system | " + " | ".join(f"seed {x}" for x in seeds)
                  + " | median wall s | median train s | vs sync (even) | vs sync same shares |")
            print("|---" * (len(seeds) + 5) + "|")
            med = {}
            for s in systems:
                hits = [r["hit"] for r in results[s]]
                med[s] = ((statistics.median([h[2] for h in hits]), statistics.median([h[1] for h in hits]))
                          if all(hits) else None)
            for s in systems:
                cells = [f"{h[2]:.1f} ({h[1]:.1f}) at {h[0]}" if h else "not reached" for h in
                         (r["hit"] for r in results[s])]
                vs = []
                for base in ("sync", "sync-shares"):
                    vs.append("-" if med.get(base) is None or med[s] is None or base == s
                              else f"{100 * (1 - med[s][0] / med[base][0]):+.0f}% "
                                   f"({100 * (1 - med[s][1] / med[base][1]):+.0f}%)")
                m = med[s] or (None, None)
                print(f"| {name(s)} | " + " | ".join(cells) + f" | {fmt_s(m[0])} | {fmt_s(m[1])} | {vs[0]} | {vs[1]} |")
            print(f"\ntime per clock, {workers} VWs: predicted (morph plan / simulate) beside measured "
                  f"(mean over seeds; WSP: a clock is {a.wave} of worker 0's minibatches, and worker 0 may lead the "
                  f"slowest by up to D waves, so its rate is a lower bound on the clock's time: 'bound' is the "
                  f"time if it led by D waves more at the window's end than at its start)\n")
            print("| system | predicted ms/clock | measured ms/clock | bound | measured / predicted | "
                  "predicted ms/step | measured ms/step |")
            print("|---|---|---|---|---|---|---|")
            for s in systems:
                rs = [r for r in results[s] if r["clock_seconds"] is not None]
                ms = statistics.mean(r["clock_seconds"] for r in rs) if rs else None
                hi = statistics.mean(r["clock_bound"] for r in rs) if rs and all(r["clock_bound"] for r in rs) \
                    else None
                pc = pred_clock[s]
                k = a.wave if s.startswith("wsp") else 1
                print(f"| {name(s)} | {1e3 * pc:.1f} | " + ("-" if ms is None else f"{1e3 * ms:.1f}")
                      + " | " + ("-" if hi is None or not s.startswith("wsp") else f"{1e3 * hi:.1f}")
                      + f" | {'-' if ms is None else f'{ms / pc:.2f}'} | {1e3 * pred_step[s]:.1f} | "
                      + ("-" if ms is None else f"{1e3 * ms / k:.1f}") + " |", flush=True)
            report.setdefault("predicted", {})[str(workers)] = {"clock_seconds": pred_clock, "shares": shares}
    finally:
        if net:
            net.down()
        if a.json:
            with open(a.json, "w") as f:
                json.dump(report, f, indent=1)
        if not a.keep:
            subprocess.run(["rm", "-rf", tmp], check=False)
        print(f"\nend {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average "
              f"{' '.join('%.2f' % x for x in os.getloadavg())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
