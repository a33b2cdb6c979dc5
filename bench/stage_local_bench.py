#!/usr/bin/env python3
"""Stage-local models: what a pipeline worker holds, writes and evaluates.

One gpt-mini whose training state (parameters, gradients, AdamW state, the
fixed-point gradient buffer: 24 bytes per parameter) plus the process does
not fit a per-worker cap, trained with checkpoints and a final evaluation:

  1. the single process (no cap: it could not run under it) — the baseline;
  2. P = 2, 3, 4 stages with --memory-cap CAP, 1f1b, D = 1.

Table A (largest model): each stage's peak RSS against the cap and against
the single process's, the parameters each stage held (the trainer's own
high-water mark) against the model's / P, and the --memory-cap estimate.
Table B (checkpoints): mean seconds per checkpoint until it was published
(the committer's, world rank 0: its own share, then waiting for every
stage's share, then the manifest) and of the snapshot copy in the training
thread: P writers against the single writer.
Table C (evaluation): seconds of the final evaluation (the test set through
the stages) against the single process's.
With --before MORPH (a build of an earlier commit), the P = 2 and P = 3 runs
are repeated with it, no cap, for world rank 0's peak RSS before and after.

Every run is checked for the single process's model_hash.

usage: python3 bench/stage_local_bench.py [--morph build/morph] [--before OLD/morph]
           [--cap MIB] [--keep DIR] [--dry-run]
"""
import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pipeline_bench as pb  # noqa: E402  (Runner, job_args, make_corpus, fmt, ...)

MODEL = dict(dim=512, heads=8, layers=8, seq_len=16, vn_batch=2, dropout=0.1)  # 25.4 M parameters
M, STEPS = 4, 3


def mib(b):
    return None if b is None else b / pb.MIB


def eval_seconds(out):
    """eval_seconds of the last metrics line that has one."""
    import json
    last = None
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            for line in f:
                if line.strip():
                    m = json.loads(line)
                    if "eval_seconds" in m:
                        last = m["eval_seconds"]
    except (OSError, ValueError):
        pass
    return last


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--morph", default=os.path.join(pb.ROOT, "build", "morph"))
    ap.add_argument("--before", help="an earlier build's morph binary, for rank 0's peak RSS before this change")
    ap.add_argument("--cap", type=int, default=800, help="per-worker --memory-cap in MiB (default 800)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--keep", help="keep the runs' folders here")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    tmp = a.keep or tempfile.mkdtemp(prefix="stage_local_bench.")
    os.makedirs(tmp, exist_ok=True)
    r = pb.Runner(a.morph, tmp, a.dry_run, a.timeout, 0)
    corpus = pb.make_corpus(tmp, a.dry_run)
    ck = ["--set", f"checkpoint.every={STEPS}"]
    base = pb.job_args(MODEL, M, STEPS, corpus) + ck
    try:
        single = r.local("single process", base)
        runs = {}
        for p in (2, 3, 4):
            runs[p] = r.local(f"1f1b --stages {p} --memory-cap {a.cap}",
                              pb.pipe_args(p, p, "1f1b", False) + ["--memory-cap", str(a.cap)] + base, quiet=False)
        before = {}
        if a.before:
            old = pb.Runner(a.before, tmp, a.dry_run, a.timeout, 0)
            old.count = r.count
            for p in (2, 3):
                before[p] = old.local(f"before: 1f1b --stages {p}", pb.pipe_args(p, p, "1f1b", False) + base)
    finally:
        r.kill_all()
    if a.dry_run:
        return 0
    if single is None:
        print("  ! the single-process baseline failed")
        return 1
    s0 = single["summary"]
    want = single["hash"]
    params = s0.get("param_bytes")
    ss = s0.get("peak_rss_bytes")
    print(f"\n== A. largest model: gpt-mini dim {MODEL['dim']}, {MODEL['layers']} blocks, AdamW, checkpoint every "
          f"{STEPS} steps, {STEPS} steps; per-worker cap {a.cap} MiB; baseline: the single process ==")
    print(f"single process: peak RSS {pb.fmt(mib(ss), '.0f', 6)} MiB "
          f"({'over' if ss and ss > a.cap * pb.MIB else 'within'} the cap), hash {want}")
    print(f"\n{'P':>2} {'stage':>5} | {'peak RSS MiB':>12} {'x single':>8} {'<= cap':>6} | {'estimate MiB':>12} | "
          f"{'params MiB':>10} {'peak params':>11} {'all / P':>8} | {'hash':>4}")
    ok = True
    for p, x in runs.items():
        if x is None:
            print(f"{p:>2}   (failed)")
            ok = False
            continue
        s = x["summary"]
        est, _, _ = pb.stage_estimates(x["out"])
        peaks = s.get("stage_peak_rss_bytes", [])
        held = s.get("stage_param_bytes", [])
        peak_held = s.get("stage_peak_param_bytes", [])
        total = sum(held) if held else None
        same = x["hash"] == want
        ok = ok and same
        for k in range(p):
            rss = peaks[k] if k < len(peaks) else None
            print(f"{p:>2} {k:>5} | {pb.fmt(mib(rss), '.0f', 12)} {pb.fmt(pb.ratio(rss, ss), '.2f', 8)} "
                  f"{('yes' if rss is not None and rss <= a.cap * pb.MIB else 'NO'):>6} | "
                  f"{pb.fmt(est.get(k), 'd', 12)} | "
                  f"{pb.fmt(mib(held[k]) if k < len(held) else None, '.1f', 10)} "
                  f"{pb.fmt(mib(peak_held[k]) if k < len(peak_held) else None, '.1f', 11)} "
                  f"{pb.fmt(mib(total / p) if total else None, '.1f', 8)} | {'same' if same else 'DIFF'}")
    print("(params: what the stage's worker holds at the end; peak params: the most it ever held, from the build on;"
          " all / P: the model's parameters divided evenly. RSS includes the runtime, about 260 MiB.)")
    if params is not None:
        print(f"single process holds {mib(params):.1f} MiB of parameters")

    print(f"\n== B. checkpoint write, mean per checkpoint (world rank 0, which publishes it); baseline: the single "
          f"writer of the single process ==")
    c0 = s0.get("checkpoint", {})
    print(f"{'run':>8} | {'write s':>8} {'x single':>8} | {'snapshot s':>10} {'x single':>8}")
    print(f"{'single':>8} | {pb.fmt(c0.get('write_seconds'), '.3f', 8)} {'1.00':>8} | "
          f"{pb.fmt(c0.get('snapshot_seconds'), '.3f', 10)} {'1.00':>8}")
    for p, x in runs.items():
        if x is None:
            continue
        c = x["summary"].get("checkpoint", {})
        print(f"{'P = ' + str(p):>8} | {pb.fmt(c.get('write_seconds'), '.3f', 8)} "
              f"{pb.fmt(pb.ratio(c.get('write_seconds'), c0.get('write_seconds')), '.2f', 8)} | "
              f"{pb.fmt(c.get('snapshot_seconds'), '.3f', 10)} "
              f"{pb.fmt(pb.ratio(c.get('snapshot_seconds'), c0.get('snapshot_seconds')), '.2f', 8)}")

    print("\n== C. final evaluation (the test set), seconds on world rank 0; baseline: the single process ==")
    e0 = eval_seconds(single["out"])
    print(f"{'run':>8} | {'eval s':>8} {'x single':>8}")
    print(f"{'single':>8} | {pb.fmt(e0, '.3f', 8)} {'1.00':>8}")
    for p, x in runs.items():
        if x is not None:
            e = eval_seconds(x["out"])
            print(f"{'P = ' + str(p):>8} | {pb.fmt(e, '.3f', 8)} {pb.fmt(pb.ratio(e, e0), '.2f', 8)}")

    if before:
        print("\n== D. world rank 0's peak RSS (stage 0), before (--before) and after this change, no cap ==")
        print(f"{'P':>2} | {'before MiB':>10} {'after MiB':>9} {'after/before':>12}")
        for p in (2, 3):
            b, x = before.get(p), runs.get(p)
            rb = b["summary"].get("stage_peak_rss_bytes", [None])[0] if b else None
            ra = x["summary"].get("stage_peak_rss_bytes", [None])[0] if x else None
            print(f"{p:>2} | {pb.fmt(mib(rb), '.0f', 10)} {pb.fmt(mib(ra), '.0f', 9)} {pb.fmt(pb.ratio(ra, rb), '.2f', 12)}")
    if not a.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
