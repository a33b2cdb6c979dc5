#!/usr/bin/env python3
"""WSP with a forced staleness (docs/wsp.md, "Pulls, the gate, and D"): a
deterministic experiment of what D >= 1 does to convergence, free of
timing. It writes a replay log (docs/wsp.md, "The log and replay") in
which every pull of virtual worker 0 receives version max(0, c - D) of
every shard at its clock c (with --stale K: VWs 0 .. K-1; with --all:
every VW's pulls), the others' version c, and runs

  morph run JOB --workers W --set job.steps=S --set eval.every=E
            --set sync.mode=wsp --set sync.staleness=D --set sync.wave=Nm
            --replay LOG [--set sync.stale_update=R]

for each D (and each rule R of --stale-update: how the servers apply a
stale push, docs/wsp.md "Stale pushes"), printing the test accuracies and
the model hash (the same hash every time: the log fixes every pull). Even
VN shares (no resources file: N/W each, the first N mod W VWs one more),
which the log's shares record repeats.

  python3 bench/wsp_forced_staleness.py --staleness 0,1,4 --steps 200
  python3 bench/wsp_forced_staleness.py --staleness 1,4 --stale-update none,scale,bypass
  python3 bench/wsp_forced_staleness.py --workers 4 --all --staleness 1
  python3 bench/wsp_forced_staleness.py --morph /path/to/old/morph ...
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def forced_log(steps, wave, d, shares, stale_vws):
    clocks = (steps + wave - 1) // wave
    lines = [json.dumps({"vn_shares": shares})]
    for v in range(len(shares)):
        for c in range(1, clocks + 1):
            stale = v < stale_vws
            ver = c if c == clocks else (max(0, c - d) if stale else c)
            lines.append(json.dumps({"vw": v, "pull": c - 1, "clock": c, "versions": [ver] * len(shares),
                                     "gap": c - ver}))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--morph", default=os.path.join(ROOT, "build", "morph"))
    ap.add_argument("--job", default=os.path.join(ROOT, "examples", "fmnist-cnn.toml"))
    ap.add_argument("--vns", type=int, default=16, help="the job's batch.virtual_nodes")
    ap.add_argument("--workers", type=int, default=2, help="virtual workers W (even shares of the VNs)")
    ap.add_argument("--staleness", default="0,1,4")
    ap.add_argument("--wave", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--stale", type=int, default=1, help="VWs 0 .. K-1 pull D clocks old (default 1: VW 0)")
    ap.add_argument("--all", action="store_true", help="every VW's pulls D clocks old (--stale W)")
    ap.add_argument("--stale-update", default="",
                    help="comma-separated sync.stale_update rules, each run per D (default: the job's)")
    args = ap.parse_args()
    w = args.workers
    shares = [args.vns // w + (1 if v < args.vns % w else 0) for v in range(w)]
    stale_vws = w if args.all else args.stale
    who = "every VW" if stale_vws >= w else ("VW 0" if stale_vws == 1 else "VWs 0..%d" % (stale_vws - 1))
    rules = [x for x in args.stale_update.split(",") if x] or [""]
    with tempfile.TemporaryDirectory() as tmp:
        for d in [int(x) for x in args.staleness.split(",")]:
            log = os.path.join(tmp, "log-%d.jsonl" % d)
            with open(log, "w") as f:
                f.write(forced_log(args.steps, args.wave, d, shares, stale_vws))
            for rule in rules:
                out = os.path.join(tmp, "out-%d-%s" % (d, rule))
                cmd = [args.morph, "run", args.job, "--quiet", "--workers", str(w), "--out", out,
                       "--set", "job.steps=%d" % args.steps, "--set", "eval.every=%d" % args.eval_every,
                       "--set", "sync.mode=wsp", "--set", "sync.staleness=%d" % d, "--set", "sync.wave=%d" % args.wave,
                       "--replay", log]
                if rule:
                    cmd += ["--set", "sync.stale_update=" + rule]
                t0 = time.time()
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit("D = %d: exit %d\n%s" % (d, r.returncode, r.stderr[-2000:]))
                acc = []
                for line in open(os.path.join(out, "metrics.jsonl")):
                    j = json.loads(line)
                    if "test_accuracy" in j:
                        acc.append("%d:%.3f" % (j.get("step", -1), j["test_accuracy"]))
                h = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "?"
                print("D = %d (%d VWs, %s%s): test accuracy %s; %s; %.0f s" % (
                    d, w, who, ", " + rule if rule else "", " ".join(acc), h,
                    time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
