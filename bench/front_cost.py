"""What a command that needs no training engine costs: the `morph` front
(libtorch-free) against `morph-engine` (which loads libtorch and its ~290
shared objects first) answering the same command, interleaved rounds. Two
commands: `--help`, and `run` of a job file that is refused (exit 2: the
front checks the job file itself; the engine checks it in runJob). Per
start: wall and CPU seconds (user + system, this script's RUSAGE_CHILDREN).
Prints medians per side and front / engine ratios.

    python3 bench/front_cost.py [--rounds 10] [--build build]
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one(cmd, expect_rc):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != expect_rc:
        sys.exit(f"{' '.join(cmd)}: exit {r.returncode}, expected {expect_rc}:\n{r.stdout}{r.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), r.stdout + r.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    front, engine = os.path.join(a.build, "morph"), os.path.join(a.build, "morph-engine")
    with tempfile.TemporaryDirectory() as tmp:
        bad = os.path.join(tmp, "bad.toml")
        with open(bad, "w") as f:
            f.write('[job]\nname = "refused"\nsteps = 10\nepochs = 1\n')
        cases = [("--help", ["--help"], 0), ("run (refused job file)", ["run", bad], 2)]
        res = {(c, side): [] for c, _, _ in cases for side in ("front", "engine")}
        for rnd in range(a.rounds):
            for name, args, rc in cases:
                order = [("front", front), ("engine", engine)]
                if rnd % 2:
                    order.reverse()
                outs = {}
                for side, binary in order:
                    wall, cpu, out = one([binary] + args, rc)
                    res[(name, side)].append((wall, cpu))
                    outs[side] = out.replace(binary, "MORPH")  # the usage line names the binary
                if outs["front"] != outs["engine"]:
                    sys.exit(f"{name}: the front and the engine answer differently:\n{outs['front']}\n---\n{outs['engine']}")
    print(f"{a.rounds} interleaved rounds; medians per start (wall s / CPU s); the same output from both")
    for name, _, _ in cases:
        f = [statistics.median(x[i] for x in res[(name, 'front')]) for i in (0, 1)]
        e = [statistics.median(x[i] for x in res[(name, 'engine')]) for i in (0, 1)]
        print(f"  {name:24s} front {f[0]:.4f} / {f[1]:.4f}   engine {e[0]:.4f} / {e[1]:.4f}   "
              f"front/engine wall {f[0] / e[0]:.3f}, CPU {f[1] / max(e[1], 1e-9):.3f}")


if __name__ == "__main__":
    main()
