#!/usr/bin/env python3
"""PyTorch DistributedDataParallel baseline for benchmarking Morph.

Runs the same models, loss, optimiser and "V micro-batches over N workers"
step structure as Morph, using N CPU processes joined by gloo over TCP:

  * the global batch B is cut into V micro-batches (B/V samples each);
  * the V micro-batches are split contiguously over the N processes, the
    first V % N processes getting one extra;
  * each process runs its micro-batches one after another, accumulating
    gradients locally (``ddp.no_sync()`` for all but its last micro-batch),
    so gradients are all-reduced once per step;
  * the loss is cross-entropy with reduction='sum' per micro-batch, and
    the all-reduced (averaged over N) gradient is scaled by N/B, so the
    effective gradient is sum/B;
  * SGD, lr 0.05, momentum 0.9 (mlp, cnn); for gpt-mini AdamW, lr 0.003,
    20 warm-up steps then cosine, gradient clipped to norm 1.0, as
    examples/fortunes-gpt.toml;
  * glibc's malloc thresholds and huge-page mode as `morph` sets them
    (--malloc morph, the default; --malloc glibc keeps glibc's own), so that both sides'
    tensors come from the same kind of allocator.

gpt-mini is the twin of Morph's built-in one (src/models/zoo.cpp): token and
position embeddings (vocabulary 256 bytes), pre-norm transformer blocks
(causal self-attention, 4x GELU MLP), a final LayerNorm and an output head
tied to the token embedding; trained on the text of the fortunes package
(/usr/share/games/fortunes, read as Morph reads it: every regular file but
*.dat and *.u8, sorted by name, concatenated, cut into windows of seq_len
bytes, the last 1/20 held out), B sequences of seq_len tokens per step.
`--param-count` prints the model's parameter count and exits.

Run with Debian's python (which has torch):

  /usr/bin/python3 bench/ddp_baseline.py --model cnn --workers 2 --json

One rank per command (for processes in separate network namespaces; rank 0
hosts the rendezvous and prints the result; set GLOO_SOCKET_IFNAME):

  /usr/bin/python3 bench/ddp_baseline.py --model mlp --workers 4 --rank R \
      --master-addr 10.0.0.1 --port 29500 --json
"""

import argparse
import datetime
import gzip
import json
import multiprocessing.connection
import os
import socket
import struct
import sys
import time
import traceback

import numpy as np

DATA_DIR = "/usr/share/datasets/fashion-mnist"
FORTUNES_DIR = "/usr/share/games/fortunes"
MEAN = 0.2860
STD = 0.3530
NUM_SYNTHETIC = 60000
TEARDOWN_GRACE_S = 120  # how long the launcher waits for stragglers once one rank is done


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

def _read_idx(path, magic_expected, ndims):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = struct.unpack(">I", raw[:4])[0]
    if magic != magic_expected:
        raise ValueError("%s: bad magic %#x (expected %#x)" % (path, magic, magic_expected))
    dims = struct.unpack(">" + "I" * ndims, raw[4:4 + 4 * ndims])
    header = 4 + 4 * ndims
    count = int(np.prod(dims))
    data = np.frombuffer(raw, dtype=np.uint8, count=count, offset=header)
    if data.size != count:
        raise ValueError("%s: truncated file" % path)
    return data.reshape(dims)


class TextWindows:
    """The fortunes text as Morph's TextDataset sees it: sample i is window i
    (x = bytes [i*T, (i+1)*T), y = the same shifted by one byte)."""

    def __init__(self, seq_len, path=FORTUNES_DIR):
        import torch
        files = sorted(e.path for e in os.scandir(path)
                       if e.is_file(follow_symlinks=False) and not e.path.endswith((".dat", ".u8")))
        text = b"".join(open(f, "rb").read() for f in files)
        windows = (len(text) - 1) // seq_len
        test = max(1, windows // 20)
        self.seq_len = seq_len
        self.bytes = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        self.n = windows - test  # training windows
        self.offsets = torch.arange(seq_len, dtype=torch.int64)

    def batch(self, idx):
        pos = (idx * self.seq_len).unsqueeze(1) + self.offsets
        return self.bytes[pos].long(), self.bytes[pos + 1].long()


def load_data(kind, seq_len=64):
    """Returns (images float32 [n,1,28,28], labels int64 [n]) as torch tensors,
    or (TextWindows, None) for the fortunes text."""
    import torch
    if kind == "fortunes-char":
        return TextWindows(seq_len), None
    if kind == "fashion-mnist":
        images = _read_idx(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz"), 0x00000803, 3)
        labels = _read_idx(os.path.join(DATA_DIR, "train-labels-idx1-ubyte.gz"), 0x00000801, 1)
        if images.shape[0] != labels.shape[0]:
            raise ValueError("image/label count mismatch")
        x = torch.from_numpy(images.astype(np.float32))
        x = (x / 255.0 - MEAN) / STD
        x = x.reshape(-1, 1, 28, 28).contiguous()
        y = torch.from_numpy(labels.astype(np.int64))
        return x, y
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(NUM_SYNTHETIC, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (NUM_SYNTHETIC,), generator=g, dtype=torch.int64)
    return x, y


# --------------------------------------------------------------------------
# Models (shapes match Morph's)
# --------------------------------------------------------------------------

def build_gpt_mini(vocab=256, seq_len=64, dim=64, layers=2, heads=4):
    import math
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.ln2 = nn.LayerNorm(dim)
            self.fc1 = nn.Linear(dim, 4 * dim)
            self.fc2 = nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, t, c = x.shape
            d = c // heads
            q, k, v = (z.view(b, t, heads, d).transpose(1, 2) for z in self.qkv(self.ln1(x)).chunk(3, -1))
            att = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            future = torch.ones(t, t, dtype=torch.bool).triu(1)
            att = torch.softmax(att.masked_fill(future, float("-inf")), -1)
            y = att.matmul(v).transpose(1, 2).contiguous().view(b, t, c)
            h = x + self.proj(y)
            return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))

    class GptMini(nn.Module):
        def __init__(self):
            super().__init__()
            self.token = nn.Parameter(torch.randn(vocab, dim) * 0.02)
            self.position = nn.Parameter(torch.randn(seq_len, dim) * 0.02)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.norm = nn.LayerNorm(dim)

        def forward(self, x):
            h = F.embedding(x, self.token) + self.position[:x.size(1)]
            return self.norm(self.blocks(h)).matmul(self.token.t())  # head tied to the embedding

    return GptMini()


def build_model(name, seq_len=64):
    import torch.nn as nn
    if name == "gpt-mini":
        return build_gpt_mini(seq_len=seq_len)
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(784, 512), nn.ReLU(),
            nn.Linear(512, 512), nn.ReLU(),
            nn.Linear(512, 10),
        )
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
            nn.Linear(128, 10),
        )
    raise ValueError("unknown model %r" % name)


# --------------------------------------------------------------------------
# Work split
# --------------------------------------------------------------------------

def micro_batch_bounds(global_batch, micro_batches):
    """[(start, end)] sample offsets within the global batch for each micro-batch.

    B/V samples each; if B % V != 0 the first B % V micro-batches get one extra.
    """
    base, rem = divmod(global_batch, micro_batches)
    bounds, pos = [], 0
    for j in range(micro_batches):
        n = base + (1 if j < rem else 0)
        bounds.append((pos, pos + n))
        pos += n
    return bounds


def worker_micro_batches(micro_batches, workers, rank):
    """Contiguous range [first, last) of micro-batch ids owned by `rank`."""
    base, rem = divmod(micro_batches, workers)
    first = rank * base + min(rank, rem)
    count = base + (1 if rank < rem else 0)
    return first, first + count


# --------------------------------------------------------------------------
# Worker process
# --------------------------------------------------------------------------

# Morph's allocator settings (src/core/sys.cpp, tuneAllocator(), called at
# the start of every morph process): glibc serves blocks up to 64 MiB from
# its heap instead of fresh mmaps, and keeps up to 256 MiB of free heap
# instead of returning it to the kernel. --malloc morph (the default) gives
# the baseline the same, so a comparison is not decided by page faults;
# --malloc glibc keeps glibc's defaults.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
MORPH_MALLOPT = {M_MMAP_THRESHOLD: 64 << 20, M_TRIM_THRESHOLD: 256 << 20}


def tune_allocator(kind):
    if kind != "morph":
        return
    import ctypes
    libc = ctypes.CDLL(None)
    for param, value in MORPH_MALLOPT.items():
        if libc.mallopt(param, value) != 1:
            raise RuntimeError("mallopt(%d, %d) failed" % (param, value))


# And the engine's malloc on transparent huge pages: the `morph` front execs
# it with glibc.malloc.hugetlb=1 in GLIBC_TUNABLES (src/cli/command_line.h,
# hugePageTunables). Tunables are read when a process starts, so a baseline
# with --malloc morph executes itself again, once, with the same setting
# (its worker processes inherit it).
def same_malloc_as_morph(kind):
    if kind != "morph":
        return
    given = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" in given:
        return
    env = dict(os.environ, GLIBC_TUNABLES=(given + ":" if given else "") + "glibc.malloc.hugetlb=1")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def worker(rank, args, port, result_queue):
    tune_allocator(args.malloc)  # before torch allocates anything in this process
    # Both paths leave through os._exit: with torch 1.13, letting Python free
    # the DDP module (Reducer -> ProcessGroupGloo destructor, run with the GIL
    # held) can deadlock against a gloo worker thread that needs the GIL to
    # free a tensor. Everything worth keeping has been sent by then.
    keep = None  # holds the DDP module until os._exit
    try:
        keep = _worker(rank, args, port, result_queue)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if keep is not None else 1)


def _worker(rank, args, port, result_queue):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass

    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (args.master_addr, port),
                            rank=rank, world_size=args.workers,
                            timeout=datetime.timedelta(seconds=600))
    x_all, y_all = load_data(args.data, args.seq_len)
    text = x_all if args.data == "fortunes-char" else None
    n_samples = text.n if text is not None else x_all.shape[0]
    B, V, N = args.global_batch, args.micro_batches, args.workers

    torch.manual_seed(0)
    model = build_model(args.model, args.seq_len)
    # broadcast_buffers=False: BatchNorm running stats stay per-replica, so
    # the only collective per step is the gradient all-reduce (plus the
    # one-off parameter broadcast at construction).
    ddp = DDP(model, broadcast_buffers=args.broadcast_buffers)
    ddp.train()
    params = [p for p in ddp.parameters() if p.requires_grad]
    sched = None
    if args.model == "gpt-mini":
        # examples/fortunes-gpt.toml: AdamW lr 0.003 (weight decay 0, Morph's
        # default), 20 warm-up steps then cosine over the job, clip_norm 1.0.
        import math
        opt = torch.optim.AdamW(params, lr=0.003, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        warm, total = 20, args.steps

        def lr_factor(step):
            if step < warm:
                return (step + 1) / warm
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    else:
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)

    bounds = micro_batch_bounds(B, V)
    first, last = worker_micro_batches(V, N, rank)
    mine = bounds[first:last]
    # DDP averages over N; want sum / B (per token for gpt-mini: the loss
    # sums over every token of the B sequences).
    grad_scale = float(N) / float(B * (args.seq_len if text is not None else 1))

    # Same permutation stream on every rank (as with a shared seed).
    perm_gen = torch.Generator().manual_seed(42)
    perm = torch.randperm(n_samples, generator=perm_gen)
    perm_pos = 0

    def next_global_indices():
        nonlocal perm, perm_pos
        if perm_pos + B > n_samples:
            perm = torch.randperm(n_samples, generator=perm_gen)
            perm_pos = 0
        idx = perm[perm_pos:perm_pos + B]
        perm_pos += B
        return idx

    last_loss = 0.0
    # Each timed step on this rank (the result's "timeline", read by
    # bench/float_breakdown.py): when it began (before the index selection
    # and zero_grad: everything of a step counts), the seconds of each
    # micro-batch (data included; the last one's backward waits for the
    # all-reduce), and when it ended (after the optimiser). perf_counter
    # seconds.
    timeline = []
    timing = [False]

    def train_step():
        nonlocal last_loss
        t_step = time.perf_counter()
        mb_seconds = []
        idx = next_global_indices()
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for k, (s, e) in enumerate(mine):
            t_mb = time.perf_counter()
            mb_idx = idx[s:e]
            if text is not None:
                xb, yb = text.batch(mb_idx)
            else:
                xb = x_all.index_select(0, mb_idx)
                yb = y_all.index_select(0, mb_idx)

            def fwd_bwd():
                out = ddp(xb)
                loss = F.cross_entropy(out.reshape(-1, out.size(-1)), yb.reshape(-1), reduction="sum")
                loss.backward()
                return loss
            if k + 1 < len(mine):
                with ddp.no_sync():
                    loss = fwd_bwd()
            else:
                loss = fwd_bwd()  # all-reduce (average over N) happens here
            loss_sum += loss.item()
            mb_seconds.append(time.perf_counter() - t_mb)
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(grad_scale)
        if sched is not None:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if sched is not None:
            sched.step()
        last_loss = loss_sum
        if timing[0]:
            timeline.append({"start": t_step, "end": time.perf_counter(), "micro_batches": mb_seconds})

    for _ in range(args.warmup):
        train_step()

    dist.barrier()
    t0 = time.perf_counter()
    timing[0] = True
    for _ in range(args.steps - args.warmup):
        train_step()
    dist.barrier()
    seconds = time.perf_counter() - t0

    # Mean training loss of the last step over the whole global batch.
    loss_t = torch.tensor([last_loss], dtype=torch.float64)
    dist.all_reduce(loss_t)
    if rank == 0:
        timed = args.steps - args.warmup
        result_queue.put({
            "model": args.model,
            "workers": N,
            "global_batch": B,
            "micro_batches": V,
            "steps": args.steps,
            "warmup": args.warmup,
            "timed_steps": timed,
            "threads": args.threads,
            "malloc": args.malloc,
            "data": args.data,
            "samples_per_second": B * timed / seconds,
            "seconds": seconds,
            "final_loss": loss_t.item() / (B * (args.seq_len if text is not None else 1)),
            "timeline": timeline,
        })
    # Leaves the process group; `ddp` (still referenced here) keeps the
    # gloo objects alive until worker() calls os._exit.
    dist.destroy_process_group()
    return ddp


# --------------------------------------------------------------------------
# Launcher
# --------------------------------------------------------------------------

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="PyTorch DDP (gloo, CPU) baseline for Morph.")
    p.add_argument("--model", choices=["mlp", "cnn", "gpt-mini"], default="mlp")
    p.add_argument("--workers", type=int, default=1, help="number of processes (N)")
    p.add_argument("--global-batch", type=int, default=256, help="global batch size (B)")
    p.add_argument("--micro-batches", type=int, default=8,
                   help="micro-batches per global batch (V), split over the workers")
    p.add_argument("--steps", type=int, default=60, help="total steps, including warmup")
    p.add_argument("--warmup", type=int, default=5, help="steps excluded from timing")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    p.add_argument("--data", choices=["fashion-mnist", "synthetic", "fortunes-char"], default=None,
                   help="default: fortunes-char for gpt-mini, fashion-mnist otherwise")
    p.add_argument("--seq-len", type=int, default=64, help="gpt-mini's sequence length (tokens per sample)")
    p.add_argument("--param-count", action="store_true", help="print the model's parameter count and exit")
    p.add_argument("--rank", type=int, default=None,
                   help="run only this rank in this process (needs --port; rank 0 prints the result)")
    p.add_argument("--master-addr", default="127.0.0.1", help="address of rank 0 (the rendezvous)")
    p.add_argument("--port", type=int, default=0, help="rendezvous port (0 = pick a free one)")
    p.add_argument("--broadcast-buffers", action="store_true",
                   help="let DDP broadcast BatchNorm buffers from rank 0 every forward")
    p.add_argument("--json", action="store_true", help="print one JSON line with the result")
    p.add_argument("--malloc", choices=["morph", "glibc"], default="morph",
                   help="glibc's malloc thresholds: Morph's (default, as `morph` sets them) or glibc's own")
    args = p.parse_args(argv)

    if args.data is None:
        args.data = "fortunes-char" if args.model == "gpt-mini" else "fashion-mnist"
    if (args.model == "gpt-mini") != (args.data == "fortunes-char"):
        p.error("gpt-mini trains on fortunes-char, and only gpt-mini does")
    if args.rank is not None and not (0 <= args.rank < args.workers and args.port):
        p.error("--rank needs 0 <= rank < --workers and an explicit --port")
    if args.workers < 1:
        p.error("--workers must be >= 1")
    if args.micro_batches < 1:
        p.error("--micro-batches must be >= 1")
    if args.micro_batches < args.workers:
        p.error("--micro-batches (%d) must be >= --workers (%d)" % (args.micro_batches, args.workers))
    if args.global_batch < args.micro_batches:
        p.error("--global-batch must be >= --micro-batches")
    if args.data != "fortunes-char" and args.global_batch > (NUM_SYNTHETIC if args.data == "synthetic" else 60000):
        p.error("--global-batch larger than the data set")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if args.steps <= args.warmup:
        p.error("--steps must be greater than --warmup")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    if not (0 <= args.port < 65536):
        p.error("--port out of range")
    return args


class _PrintResult:
    """result_queue of a lone rank: rank 0 prints its result line."""

    def __init__(self, as_json):
        self.as_json = as_json

    def put(self, res):
        human = "ddp model=%s workers=%d samples_per_second=%.1f" % (
            res["model"], res["workers"], res["samples_per_second"])
        if self.as_json:
            print(human, file=sys.stderr)
            print(json.dumps(res))
        else:
            print(human)


def main(argv=None):
    args = parse_args(argv)
    if argv is None:
        same_malloc_as_morph(args.malloc)
    port = args.port or free_port()

    # Keep each child's thread pools at --threads before torch is imported there.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(args.threads)

    if args.param_count:
        import torch
        torch.manual_seed(0)
        print(sum(p.numel() for p in build_model(args.model, args.seq_len).parameters() if p.requires_grad))
        return 0
    if args.rank is not None:
        worker(args.rank, args, port, _PrintResult(args.json))  # leaves through os._exit

    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    result_queue = ctx.SimpleQueue()
    procs = []
    for rank in range(args.workers):
        p = ctx.Process(target=worker, args=(rank, args, port, result_queue),
                        name="ddp-rank%d" % rank)
        p.start()
        procs.append(p)

    failed = []
    first_clean_exit = None  # time the first child exited cleanly
    # Rank 0's result is read as soon as it arrives: a result larger than a
    # pipe's buffer (64 KiB: the timeline of a few thousand steps) blocks
    # rank 0 in put() until it is read, so waiting for its exit first would
    # hang it until TEARDOWN_GRACE_S (and lose the result).
    res = None
    try:
        alive = list(procs)
        while alive:
            ready = multiprocessing.connection.wait([p.sentinel for p in alive] +
                                                    ([result_queue._reader] if res is None else []), timeout=5)
            if res is None and result_queue._reader in ready:
                res = result_queue.get()
            if first_clean_exit is not None and alive and \
                    time.monotonic() - first_clean_exit > TEARDOWN_GRACE_S:
                # Peers finished long ago; these are stuck (e.g. in teardown).
                for p in alive:
                    if p.is_alive():
                        failed.append((p.name, "stuck after peers finished"))
                        p.kill()
            still = []
            for p in alive:
                if p.is_alive():
                    still.append(p)
                else:
                    p.join()
                    if p.exitcode != 0:
                        if not any(name == p.name for name, _ in failed):
                            failed.append((p.name, p.exitcode))
                    elif first_clean_exit is None:
                        first_clean_exit = time.monotonic()
            alive = still
            if failed and alive:
                # A peer died: the others would block in a collective. Stop them.
                for p in alive:
                    p.terminate()
                for p in alive:
                    p.join(10)
                    if p.is_alive():
                        p.kill()
                        p.join()
                alive = []
    except KeyboardInterrupt:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join()
        return 130

    if failed:
        for name, code in failed:
            print("ddp_baseline: %s exited with code %s" % (name, code), file=sys.stderr)
        return 1
    if res is None and not result_queue.empty():
        res = result_queue.get()
    if res is None:
        print("ddp_baseline: no result from rank 0", file=sys.stderr)
        return 1

    human = "ddp model=%s workers=%d samples_per_second=%.1f" % (
        res["model"], res["workers"], res["samples_per_second"])
    if args.json:
        # stdout carries only the JSON line; the human line goes to stderr.
        print(human, file=sys.stderr)
        print(json.dumps(res))
    else:
        print(human)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
