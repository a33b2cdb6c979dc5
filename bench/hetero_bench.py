#!/usr/bin/env python3
"""Heterogeneous data parallelism with emulated devices (docs/resources.md).

One normal worker plus one whose device is F times slower (slowdown F = 2
and 3: it idles (F - 1) x its compute after each VN), gpt-mini on the
fortunes text (examples/fortunes-gpt.toml, 18 VNs of 8 sequences). By wall
clock between step commits (metrics.jsonl `unix_time`, median over the
steady steps), in samples/s:

  alone    the normal worker by itself (--workers 1)
  even     both workers, an even VN split (plan file vn_shares 9 + 9)
  planned  both workers, `--plan auto --resources` (speed-weighted shares,
           or fewer workers if the planner predicts that faster)
  ideal    alone x (1 + 1/F): both devices fully busy, no reduction cost

and planned/ideal, planned/alone, planned/even. Every run's model_hash must
equal the single-process one (checked).

Usage: python3 bench/hetero_bench.py [--morph build/morph] [--steps 40]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from resources_file import write_two_types

JOB = os.path.join(os.path.dirname(__file__), "..", "examples", "fortunes-gpt.toml")
VNS = 18
SETS = ["--set", f"batch.global={8 * VNS}", "--set", f"batch.virtual_nodes={VNS}", "--set", "eval.every=0"]
WARMUP = 5


def run(morph, out, steps, extra, env=None):
    r = subprocess.run([morph, "run", JOB, "--steps", str(steps), "--out", out, "--quiet"] + SETS + extra,
                       check=True, capture_output=True, text=True, env=env)
    h = re.findall(r"model_hash: (\w+)", r.stdout)[-1]
    with open(os.path.join(out, "metrics.jsonl")) as f:
        t = [json.loads(l)["unix_time"] for l in f]
    gaps = [b - a for a, b in zip(t[WARMUP:-2], t[WARMUP + 1:-1])]
    with open(os.path.join(out, "summary.json")) as f:
        shares = json.load(f).get("vn_shares")
    return 8 * VNS / statistics.median(gaps), h, shares


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--morph", default=os.path.join(os.path.dirname(__file__), "..", "build", "morph"))
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="morph_hetero_")
    env = dict(os.environ, MORPH_CACHE=os.path.join(tmp, "cache"))
    ref = subprocess.run([a.morph, "run", JOB, "--steps", str(a.steps), "--out", os.path.join(tmp, "ref"),
                          "--quiet"] + SETS, check=True, capture_output=True, text=True)
    ref_hash = re.findall(r"model_hash: (\w+)", ref.stdout)[-1]
    print(f"{'slowdown':>8s} {'alone':>8s} {'even':>8s} {'planned':>8s} {'ideal':>8s}  {'shares':10s} "
          f"{'pl/ideal':>8s} {'pl/alone':>8s} {'pl/even':>8s}")
    for F in (2, 3):
        res = os.path.join(tmp, f"res{F}.toml")
        write_two_types(res, F)
        even_plan = os.path.join(tmp, "even.json")
        with open(even_plan, "w") as f:
            json.dump({"stages": [["embed", "head"]], "replicas": 2, "vn_shares": [VNS // 2, VNS - VNS // 2]}, f)
        alone, h1, _ = run(a.morph, os.path.join(tmp, "alone"), a.steps, ["--workers", "1"])
        even, h2, _ = run(a.morph, os.path.join(tmp, "even"), a.steps, ["--resources", res, "--plan", even_plan])
        planned, h3, shares = run(a.morph, os.path.join(tmp, f"planned{F}"), a.steps,
                                  ["--resources", res, "--plan", "auto"], env)
        for h in (h1, h2, h3):
            assert h == ref_hash, f"hash {h} differs from the single-process {ref_hash}"
        ideal = alone * (1 + 1 / F)
        print(f"{F:8d} {alone:8.0f} {even:8.0f} {planned:8.0f} {ideal:8.0f}  {'+'.join(map(str, shares)):10s} "
              f"{planned / ideal:8.3f} {planned / alone:8.3f} {planned / even:8.3f}", flush=True)
    print(f"every model_hash equals the single-process {ref_hash}")


if __name__ == "__main__":
    sys.exit(main())
