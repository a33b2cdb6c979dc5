#!/usr/bin/env python3
"""Planning time of `morph plan` on large pools (issue 30, "speed on large
pools"), for one or more morph binaries side by side (e.g. main's and a
branch's), in the same run:

- resources files of 8, 128 and 1024 devices, 8 per host (hosts 10.0.x.y,
  56 Gb/s between them): one type (16 GiB), and three types a, b, c
  (slowdown 1, 1.5, 2; 16, 12, 8 GiB) cycling by host;
- `--workers N` (N processes on this host) for the same N.

Each configuration is planned --repeat times per binary, alternating the
binaries; the figure is the smallest `planning: X ms` (the search alone, as
morph plan prints it) and the wall clock of the whole command (process start,
libtorch loading and the allocation table included). The chosen plan (P, D,
schedule, step ms) is printed beside it, so that two binaries can be checked
to choose the same plan.

    python3 bench/plan_speed.py --profile gpt48.json --morph build/morph [--morph other/morph] \
        [--repeat 5] -- JOB.toml --set model.layers=48 ...
"""
import argparse
import os
import re
import subprocess
import tempfile
import time


def pool_file(path, devices, types):
    """`types`: 1 (one type) or 3 (a, b, c by host)."""
    specs = [("a", 16384, 1.0), ("b", 12288, 1.5), ("c", 8192, 2.0)][:types]
    with open(path, "w") as f:
        for name, mib, slow in specs:
            f.write(f"[types.{name}]\nmemory_mib = {mib}\nslowdown = {slow}\n")
        for h in range((devices + 7) // 8):
            f.write(f'[[devices]]\ntype = "{specs[h % types][0]}"\nhost = "10.0.{h // 256}.{h % 256 + 1}"\n'
                    f"count = {min(8, devices - 8 * h)}\n")
        f.write("[network]\nbetween_hosts_gbps = 56\nbetween_hosts_latency_us = 5\n")
    return path


def plan_once(morph, job, profile, extra):
    t0 = time.monotonic()
    r = subprocess.run([morph, "plan", *job, "--profile", profile, "--top", "5", *extra],
                       capture_output=True, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{morph} plan failed ({r.returncode}): {r.stderr[-2000:]}")
    m = re.search(r"planning: ([\d.]+) ms, (\d+) candidates, (\d+) simulated", r.stdout)
    row = next(l for l in r.stdout.splitlines() if re.match(r"\s+1\s+\d+\s+\d+", l))
    f = row.split()
    best = f"P={f[1]} D={f[2]} {f[4]}{' +rc' if f[5] == 'yes' else ''} {f[6]} ms"
    return float(m.group(1)), wall * 1e3, int(m.group(3)), best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--morph", action="append", required=True, help="a morph binary (repeat to compare)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sizes", default="8,128,1024")
    ap.add_argument("job", nargs="+", help="JOB.toml and its --set options")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="plan_speed_")
    configs = []
    for n in map(int, a.sizes.split(",")):
        configs.append((f"--workers {n}", ["--workers", str(n)]))
    for types in (1, 3):
        for n in map(int, a.sizes.split(",")):
            path = pool_file(os.path.join(tmp, f"pool{n}x{types}.toml"), n, types)
            configs.append((f"{n} devices, {types} type{'s' if types > 1 else ''}", ["--resources", path]))
    print(f"{'configuration':24} {'binary':28} {'planning ms':>12} {'wall ms':>9} {'simulated':>10}  best plan")
    for label, extra in configs:
        best = {m: (1e30, 1e30, 0, "") for m in a.morph}
        for _ in range(a.repeat):
            for m in a.morph:
                ms, wall, sims, plan = plan_once(m, a.job, a.profile, extra)
                b = best[m]
                best[m] = (min(b[0], ms), min(b[1], wall), sims, plan)
        for m in a.morph:
            ms, wall, sims, plan = best[m]
            print(f"{label:24} {m[-28:]:28} {ms:12.1f} {wall:9.0f} {sims:10d}  {plan}", flush=True)


if __name__ == "__main__":
    main()
