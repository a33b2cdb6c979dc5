"""What starting local workers costs: `morph run JOB --workers W --steps S`
with its workers forked from the worker zygote (the default) against exec'd
ones (MORPH_ZYGOTE=0), interleaved rounds. Per run: wall seconds, and CPU
seconds (user + system) of the manager and every process it waited for
(workers, zygote), from this script's RUSAGE_CHILDREN. Prints medians per
side and forked / exec'd ratios, and checks both sides give one hash.

    python3 bench/spawn_cost.py [--workers 4] [--steps 1] [--rounds 5]
"""
import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one(morph, job, workers, steps, zygote, out):
    env = dict(os.environ, MORPH_ZYGOTE="1" if zygote else "0")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([morph, "run", job, "--workers", str(workers), "--steps", str(steps), "--out", out,
                        "--status", "off", "--quiet"], env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"morph run failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    forked = re.search(r"started \d+ local workers \((\d+) forked", r.stdout)
    if forked is None or (int(forked.group(1)) == workers) != zygote:
        sys.exit(f"expected {'forked' if zygote else 'exec'}'d workers:\n{r.stdout}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, re.search(r"model_hash: ([0-9a-f]{16})", r.stdout).group(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--morph", default=os.path.join(ROOT, "build", "morph"))
    ap.add_argument("--job", default=os.path.join(ROOT, "examples", "fmnist-mlp.toml"))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    res = {True: [], False: []}
    hashes = set()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for zygote in (r % 2 == 0, r % 2 != 0):
                wall, cpu, h = one(a.morph, a.job, a.workers, a.steps, zygote, os.path.join(tmp, f"r{r}{zygote}"))
                res[zygote].append((wall, cpu))
                hashes.add(h)
    if len(hashes) != 1:
        sys.exit(f"forked and exec'd workers gave different hashes: {sorted(hashes)}")
    print(f"morph run {os.path.relpath(a.job, ROOT)} --workers {a.workers} --steps {a.steps}, {a.rounds} rounds, "
          f"load {os.getloadavg()[0]:.2f}; medians (min-max)")
    med = {}
    for zygote, name in ((False, "exec'd (MORPH_ZYGOTE=0)"), (True, "forked (zygote)")):
        walls = [w for w, _ in res[zygote]]
        cpus = [c for _, c in res[zygote]]
        med[zygote] = (statistics.median(walls), statistics.median(cpus))
        print(f"  {name:24s} wall {med[zygote][0]:.2f} s ({min(walls):.2f}-{max(walls):.2f}), "
              f"CPU {med[zygote][1]:.2f} s ({min(cpus):.2f}-{max(cpus):.2f})")
    print(f"  forked / exec'd: wall {med[True][0] / med[False][0]:.3f}, CPU {med[True][1] / med[False][1]:.3f}; "
          f"CPU saved per worker {(med[False][1] - med[True][1]) / a.workers:.2f} s; hash {hashes.pop()}")


if __name__ == "__main__":
    main()
