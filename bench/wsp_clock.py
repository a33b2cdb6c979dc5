#!/usr/bin/env python3
"""WSP's time per step, predicted against measured (issue 28, docs/planner.md
"WSP beside sync"): examples/fmnist-mlp.toml on two local workers, one of
them an emulated device SLOW times slower (a resources file), in sync mode
and in WSP mode with staleness D and each wave Nm. The prediction is `morph
plan --json` on this machine's profile (`morph calibrate`, run first); the
measure is `morph run` of the same job, the median wall clock between step
commits (metrics.jsonl `unix_time`; in WSP mode worker 0's minibatches)
after a warm-up, over interleaved rounds. Prints measured / predicted per
configuration and round.

Configurations: sync as `morph run --resources` runs it (even VN shares,
predicted by `morph simulate`); sync with a plan file of the shares a WSP
job gets on these devices ("sync shares A+B", the plan's `vn_shares`); and
WSP for each wave, whose VWs get speed-sized shares (docs/wsp.md, "VN
shares by device speed"; predicted by `morph plan`'s "wsp", whose
`sync_step_seconds` is the sync prediction with the same shares).

  python3 bench/wsp_clock.py [--morph build/morph] [--waves 1,4] [--staleness 2] [--slow 2] [--steps 300]
        [--rounds 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from resources_file import write_two_types

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "..", "examples", "fmnist-mlp.toml")


def sets(mode, staleness, wave, steps):
    s = ["--set", f"job.steps={steps}", "--set", "eval.every=0"]
    if mode == "wsp":
        s += ["--set", "sync.mode=wsp", "--set", f"sync.staleness={staleness}", "--set", f"sync.wave={wave}"]
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    ap.add_argument("--waves", default="1,4")
    ap.add_argument("--staleness", type=int, default=2)
    ap.add_argument("--slow", type=float, default=2.0)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    morph = os.path.abspath(a.morph)
    configs = [("sync", 0, 1), ("sync-shares", 0, 1)] + [("wsp", a.staleness, int(w)) for w in a.waves.split(",")]
    with tempfile.TemporaryDirectory() as d:
        res = os.path.join(d, "devices.toml")
        write_two_types(res, a.slow, memory_mib=(4096, 4096), names=("fast", "slow"))
        profile = os.path.join(d, "profile.json")
        subprocess.run([morph, "calibrate", JOB, "--out", profile, "--quiet"], check=True, capture_output=True)
        predicted = {}
        shares = None
        for mode, D, wave in configs:
            if mode == "sync":  # even shares: what morph run --resources gives a sync job
                p = json.loads(subprocess.run([morph, "simulate", JOB, "--profile", profile, "--resources", res,
                                               "--workers", "2", "--json"] + sets("sync", 0, 1, a.steps), check=True,
                                              capture_output=True, text=True).stdout)
                predicted[(mode, D, wave)] = p["step_seconds"]
                continue
            p = json.loads(subprocess.run([morph, "plan", JOB, "--profile", profile, "--resources", res, "--json"]
                                          + sets("wsp", a.staleness, wave, a.steps), check=True,
                                          capture_output=True, text=True).stdout)["wsp"]
            shares = p["vn_shares"]
            predicted[(mode, D, wave)] = p["sync_step_seconds"] if mode == "sync-shares" else p["step_seconds"]
        layers = json.load(open(profile))["fingerprint"]["layers"]
        plan = os.path.join(d, "shares.json")
        with open(plan, "w") as f:
            json.dump({"stages": [[layers[0], layers[-1]]], "vn_shares": shares}, f)
        share_text = "+".join(str(x) for x in shares)
        print(f"fmnist-mlp, 2 workers (1 fast, 1 emulated {a.slow:g}x slower), {a.steps} steps; ms per step "
              f"(WSP: per minibatch of worker 0), median between commits after step 50; WSP VN shares "
              f"{share_text}\n")
        print("| config | round | predicted ms | measured ms | measured / predicted |\n|---|---|---|---|---|")
        for r in range(a.rounds):
            for mode, D, wave in configs:
                out = os.path.join(d, f"{mode}-{D}-{wave}-{r}")
                extra = ["--plan", plan] if mode == "sync-shares" else []
                subprocess.run([morph, "run", JOB, "--resources", res, "--out", out, "--quiet", "--status", "off"]
                               + extra + sets("sync" if mode == "sync-shares" else mode, D, wave, a.steps),
                               check=True, capture_output=True)
                t = [json.loads(l)["unix_time"] for l in open(os.path.join(out, "metrics.jsonl"))]
                gaps = [y - x for x, y in zip(t[50:], t[51:])]
                m = statistics.median(gaps) if len(gaps) > 1 else float("nan")
                # WSP commits a wave's minibatches together: the mean over the window is the rate.
                if mode == "wsp" and len(t) > 51:
                    m = (t[-1] - t[50]) / (len(t) - 51)
                pr = predicted[(mode, D, wave)]
                name = {"sync": "sync (even shares)", "sync-shares": f"sync shares {share_text}"}.get(
                    mode, f"wsp D={D} wave={wave} (shares {share_text})")
                print(f"| {name} | {r} | {1e3 * pr:.2f} | {1e3 * m:.2f} | {m / pr:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
