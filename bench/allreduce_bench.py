#!/usr/bin/env python3
"""Gloo SUM all-reduce time by element type, the wire formats an exact
reduction could use (bench/results/HISTORY.md, "What the exact reduction
costs").

N processes on loopback (PyTorch's ProcessGroupGloo, the same Gloo as
libtorch's), one all-reduce of `--elements` values per call, dtypes
interleaved call by call so the machine's noise hits all alike. Prints the
median and min milliseconds per all-reduce and the ratio to int64. With
--convert it also times the conversions the float64 carrier adds on one
rank (int64 -> float64 of the local buffer, float64 -> int64 of the sum).

  /usr/bin/python3 bench/allreduce_bench.py [--workers 2] [--elements 669706] [--iters 200]
"""
import argparse
import datetime
import os
import socket
import statistics
import sys
import time

DTYPES = ["int64", "float64", "float32", "int32"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, a, port, q):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=a.workers, timeout=datetime.timedelta(seconds=300))
    bufs = {d: torch.ones(a.elements, dtype=getattr(torch, d)) for d in DTYPES}
    times = {d: [] for d in DTYPES}
    for it in range(a.warmup + a.iters):
        for d in (DTYPES[it % len(DTYPES):] + DTYPES[:it % len(DTYPES)]):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(bufs[d])
            t = time.perf_counter() - t0
            if it >= a.warmup:
                times[d].append(t)
    conv = {}
    if a.convert and rank == 0:
        i64 = torch.randint(-2**51, 2**51, (a.elements,), dtype=torch.int64)
        f64 = torch.empty(a.elements, dtype=torch.float64)
        c1, c2 = [], []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            f64.copy_(i64)
            c1.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            i64.copy_(f64)
            c2.append(time.perf_counter() - t0)
        conv = {"int64->float64": c1, "float64->int64": c2}
    if rank == 0:
        q.put((times, conv))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--elements", type=int, default=669706)  # MLP 784-512-512-10
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--convert", action="store_true")
    a = p.parse_args()
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[v] = "1"
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = free_port()
    ps = [ctx.Process(target=worker, args=(r, a, port, q)) for r in range(a.workers)]
    for x in ps:
        x.start()
    times, conv = q.get()
    for x in ps:
        x.join()
    base = statistics.median(times["int64"])
    print(f"{a.workers} workers, {a.elements} elements, {a.iters} calls per type (interleaved)")
    print(f"{'type':16} {'bytes':>10} {'median ms':>10} {'min ms':>8} {'vs int64':>9}")
    for d in DTYPES:
        m = statistics.median(times[d])
        size = 8 if d in ("int64", "float64") else 4
        print(f"{d:16} {a.elements * size:10d} {m * 1e3:10.2f} {min(times[d]) * 1e3:8.2f} {m / base:9.2f}")
    for k, v in conv.items():
        print(f"{k:16} {'':10} {statistics.median(v) * 1e3:10.2f} {min(v) * 1e3:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
