#!/usr/bin/env python3
"""Morph vs PyTorch DDP over Gloo, by wall clock, measured in the same run.

Models: the MLP 784-512-512-10 and the CNN (Fashion-MNIST, global batch 256
cut into 8 micro-batches (VNs) of 32, SGD momentum), and gpt-mini
(examples/fortunes-gpt.toml: 2 blocks, dim 64, 4 heads, seq_len 64, the
fortunes text, global batch 32 sequences in 4 VNs of 8, AdamW with warm-up,
cosine schedule and clip_norm 1.0). One intra-op thread per process. Morph
runs in exact and float reduction modes; DDP (bench/ddp_baseline.py, the
same model, data, optimiser and step structure) accumulates over its
micro-batches with no_sync, with glibc's malloc thresholds set as `morph`
sets them (ddp_baseline.py --malloc morph; `--ddp-glibc` adds a row of DDP
with glibc's own). Before a model's rows the script prints both
sides' parameter counts (Morph's from a 1-step checkpoint, DDP's from the
PyTorch model) and stops if they differ.

Both sides are timed the same way, from outside: the wall clock of the
whole command (`morph run`, `ddp_baseline.py`) for S steps and for S + E
steps; the difference divided by E is the marginal time of one steady step.
Start-up (process launch, data loading, Gloo rendezvous), the final
evaluation and teardown cancel; everything either system does between
steps counts (for Morph: the control plane's store round trips and the
metrics line). Morph's evaluation runs only after
the last step (eval.every = 0), so it cancels too.

A second measure of the same rounds, the "steady window" line under each
row, has no start-up or teardown in it at all: the long run's last E steps
by each system's own clock on its rank 0, from the end of step S to the
end of step S + E (Morph: the `unix_time` of those steps' metrics lines,
taken when the step commits, before any evaluation; DDP: the `end` of
those steps in ddp_baseline.py's timeline, after the optimiser). Between
two step ends everything of a step counts on both sides; what the
marginal method adds is the noise of process start-up, which on a shared
machine of 2 cores can exceed the E steps' whole signal.

Exact mode runs in both fixed-point formats: "exact" is the default 64-bit
one (int64 reduce-scatter + float all-gather, 12 bytes per value), "exact32"
the 32-bit one (reduce.bits = 32: int32 reduce-scatter + float all-gather,
8 bytes per value, as DDP's float all-reduce; docs/exact_reduction.md);
`--no-exact32` leaves it out.

A round runs every system (DDP, exact, exact32, float) once short and once long, in
an order that rotates from round to round; each round gives one ratio
Morph/DDP in samples per second, and the table shows the median samples/s
of each system and the min/median/max of the per-round ratios. The exact
columns also give the median time per step spent waiting for the
reductions (`reduce_seconds` of the long run's metrics, after the first 5
steps) and the collective payload one worker hands to Gloo per step. The
last column is the 1-minute load average when the row started and ended
(the development machine is shared).

A line under each row gives every system's wall milliseconds per step
next to its CPU milliseconds per step: user + system time of all its
processes (`morph run` with its workers, or ddp_baseline.py with its
ranks; getrusage of the waited-for children), marginal over the E extra
steps like the time, and in brackets how busy that keeps the cores its
W workers can use (CPU / (wall x min(W, cores))), and the minor page
faults per step of all those processes. The CPU time is the
work; a system far below 1.0 waited (for a peer, the scheduler, memory
the kernel or the hypervisor had to map again) instead of working, and a
ratio of samples/s between it and a busy one measures that wait, not
faster compute.

Emulated links (`--link RATE[:DELAY],...`, root and iproute2): the W
processes (default 4) run in W network namespaces, each joined by a veth
pair to a bridge in a hub namespace, and every veth end is shaped to RATE
(e.g. 1gbit, 10gbit) in both directions, like hosts on a switch: with
`tc qdisc netem rate RATE delay DELAY` where the kernel has sch_netem,
otherwise with a token bucket (`tc qdisc tbf rate RATE burst RATE/1000
latency 50ms`), which shapes the rate but cannot add delay (a DELAY is
then refused). With links, a line under each row gives the bytes on the
wire per step and worker of every system: the transmit counters of the W
veth ends in the workers' namespaces, read before and after each run,
marginal over the E extra steps like the time, divided by W (everything
sent counts: Gloo's collectives, and for Morph the control plane). Morph: `morph run --workers W --spawn 1 --host` in the
first namespace (manager and worker 0), `morph worker --join` in the
others. DDP: one `ddp_baseline.py --rank R` per namespace, rank 0's
address as MASTER_ADDR, GLOO_SOCKET_IFNAME = that namespace's veth. The
namespaces are removed on exit, also on an error or SIGTERM/SIGINT/SIGHUP.

  /usr/bin/python3 bench/vs_ddp.py [--morph build/morph] [--rounds 5] [--models mlp,cnn,gptmini]
        [--workers 1,2] [--exact-buckets BYTES,...]   (extra exact rows with MORPH_BUCKET_BYTES=BYTES)
        [--exact-wires allreduce,...]   (extra exact rows with MORPH_EXACT_WIRE=...)
        [--link 1gbit,10gbit [--workers 4]] [--extra E]   (E: override the model's extra steps)
        [--ddp-glibc]   (an extra row: DDP with glibc's own malloc thresholds)
        [--before OTHER/morph]   (extra rows exact-before, exact32-before: both exact formats with another
                                  build, in the same rounds; each row gives after/before per round)
"""
import argparse
import glob
import json
import os
import random
import resource
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import netns

HERE = os.path.dirname(os.path.abspath(__file__))

JOB = """[job]
name = "bench-{name}"
seed = 1
steps = {steps}
[data]
{data}
[model]
{model}
[batch]
global = {batch}
virtual_nodes = {vns}
[optim]
{optim}
[reduce]
mode = "{mode}"
{bits}[eval]
every = 0
batch = {eval_batch}
{extra}"""

SGD = 'name = "sgd"\nlr = 0.05\nmomentum = 0.9'
# name -> Morph's job keys, DDP's model name, batch, VNs, (short steps S,
# extra steps E): E steps take a few seconds on one worker.
MODELS = {
    "mlp": dict(data='dataset = "fashion-mnist"', model='name = "mlp"\nhidden = [512, 512]', optim=SGD,
                ddp="mlp", batch=256, vns=8, window=(20, 200), eval_batch=1000),
    "cnn": dict(data='dataset = "fashion-mnist"', model='name = "cnn"', optim=SGD,
                ddp="cnn", batch=256, vns=8, window=(10, 40), eval_batch=1000),
    # examples/fortunes-gpt.toml
    "gptmini": dict(data='dataset = "fortunes-char"\nseq_len = 64',
                    model='name = "gpt-mini"\nlayers = 2\ndim = 64\nheads = 4',
                    optim='name = "adamw"\nlr = 0.003\nwarmup_steps = 20\nschedule = "cosine"\nclip_norm = 1.0',
                    ddp="gpt-mini", batch=32, vns=4, window=(5, 100), eval_batch=256),
}
ALIASES = {"gpt-mini": "gptmini", "gpt": "gptmini"}
# On a machine loaded far beyond its cores (others' builds) the default
# heartbeat timeout declared both workers of a 2-worker gpt-mini run dead;
# a longer one changes nothing between steps (heartbeats are a background
# thread's).
HEARTBEAT = ["--heartbeat-timeout", "60"]


def children_cpu():
    """(CPU seconds (user + system), minor page faults) of every process
    this script has waited for so far, their own waited-for children
    included (`morph run`'s workers, ddp_baseline.py's ranks)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def timed(cmd, env=None, stdout_path=None):
    t0 = time.perf_counter()
    if stdout_path:  # its output and errors, shown if it fails
        with open(stdout_path, "w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        if r.returncode:
            with open(stdout_path) as f:
                sys.stderr.write(f.read())
            raise subprocess.CalledProcessError(r.returncode, cmd)
    else:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def write_job(model, mode, steps, tmp, extra=""):
    m = MODELS[model]
    path = os.path.join(tmp, f"{model}-{mode}-{steps}.toml")
    # "exact32": exact mode in the 32-bit format (reduce.bits = 32, issue 31).
    # (Only then a `bits` line: builds_ab.py runs builds from before the key.)
    bits = "bits = 32\n" if mode == "exact32" else ""
    with open(path, "w") as f:
        f.write(JOB.format(name=model, steps=steps, mode="exact" if mode == "exact32" else mode, bits=bits,
                           data=m["data"], model=m["model"], batch=m["batch"], vns=m["vns"], optim=m["optim"],
                           eval_batch=m["eval_batch"], extra=extra))
    return path


def add_job_args(p, steps, morph=True):
    """The options of the scripts that run one of MODELS on local workers
    (bucket_sizes.py, float_breakdown.py, builds_ab.py)."""
    if morph:
        p.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    p.add_argument("--model", default="mlp", choices=sorted(MODELS))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=steps)


def morph_cmd(binary, model, workers, mode, steps, tmp):
    path = write_job(model, mode, steps, tmp)
    out = os.path.join(tmp, f"out-{model}-{mode}-{workers}-{steps}")
    return [binary, "run", path, "--workers", str(workers), "--quiet", "--out", out] + HEARTBEAT, out


def tensor_file_params(path):
    """{name: numel} of the param/ entries of a Morph tensor file (docs/checkpoint_format.md)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:8] != b"MRPHTNS1":
        raise ValueError(f"{path}: not a Morph tensor file")
    count = struct.unpack_from("<I", raw, 12)[0]
    pos, out = 16, {}
    for _ in range(count):
        (n,) = struct.unpack_from("<I", raw, pos)
        name = raw[pos + 4:pos + 4 + n].decode()
        pos += 4 + n + 1  # name, dtype
        (ndim,) = struct.unpack_from("<I", raw, pos)
        dims = struct.unpack_from(f"<{ndim}q", raw, pos + 4)
        pos += 4 + 8 * ndim
        (nbytes,) = struct.unpack_from("<Q", raw, pos)
        pos += 8 + nbytes
        numel = 1
        for d in dims:
            numel *= d
        if name.startswith("param/"):
            out[name] = numel
    return out


def morph_param_count(binary, model, tmp):
    """Parameters Morph trains for `model`: the param/ tensors of a 1-step checkpoint."""
    path = write_job(model, "exact", 1, tmp, extra="[checkpoint]\nevery = 1\n")
    out = os.path.join(tmp, f"params-{model}")
    subprocess.run([binary, "run", path, "--quiet", "--out", out], check=True, stdout=subprocess.DEVNULL)
    total = 0
    for f in glob.glob(os.path.join(out, "checkpoints", "step-*", "layer-*.bin")):
        total += sum(tensor_file_params(f).values())
    if total == 0:
        raise RuntimeError(f"no parameters found in {out}/checkpoints")
    return total


def ddp_param_count(model):
    r = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "ddp_baseline.py"), "--model", MODELS[model]["ddp"],
                        "--param-count"], check=True, stdout=subprocess.PIPE, text=True)
    return int(r.stdout.split()[-1])


def morph_netns(net, binary, model, workers, mode, steps, tmp, env):
    """Seconds of one Morph job across the namespaces, and its --out folder."""
    path = write_job(model, mode, steps, tmp)
    out = os.path.join(tmp, f"out-{model}-{mode}-{workers}-{steps}")
    log = os.path.join(tmp, f"manager-{model}-{mode}-{steps}.log")
    t0 = time.perf_counter()
    procs = netns.start_morph(net, [binary, "run", path, "--workers", str(workers), "--spawn", "1", "--quiet",
                                    "--out", out] + HEARTBEAT, workers, out, log, env=env)
    try:
        netns.wait_all(procs, f"morph {model} {mode} {steps} steps")
    except BaseException:
        netns.end(procs)
        raise
    return time.perf_counter() - t0, out


def ddp_netns(net, model, workers, steps, malloc="morph", stdout_path=None):
    """Seconds of one DDP job across the namespaces; rank 0's output goes to stdout_path."""
    port = str(random.randint(20000, 40000))
    env = dict(os.environ)
    t0 = time.perf_counter()
    procs = []
    try:
        for r in range(workers):
            e = dict(env, GLOO_SOCKET_IFNAME=net.ifs[r])
            with open(stdout_path if r == 0 and stdout_path else os.devnull, "w") as so:
                procs.append(subprocess.Popen(["ip", "netns", "exec", net.ns[r]] +
                                              ddp_cmd(model, workers, steps, malloc) +
                                              ["--rank", str(r), "--master-addr", net.ips[0], "--port", port],
                                              stdout=so, stderr=subprocess.STDOUT if r == 0 and stdout_path
                                              else None, env=e))
        netns.wait_all(procs, f"ddp {model} {steps} steps")
    except BaseException:
        for p in procs:
            if p.poll() is None:
                p.kill()
        raise
    return time.perf_counter() - t0


def morph_reduce_stats(out):
    """(median reduce seconds per step after step 5, payload bytes per step) of a finished run."""
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    red = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if m["step"] >= 5 and "reduce_seconds" in m:
                red.append(m["reduce_seconds"])
    return (statistics.median(red) if red else 0.0), s.get("reduce_payload_bytes_per_step", 0)


def morph_steady(out, s, e):
    """Seconds per step over steps s+1 .. s+e of a finished run: the
    difference of the `unix_time` (rank 0's wall clock when the step
    committed, before any evaluation) of steps s and s+e, over e."""
    t = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            t.append((m["step"], m["unix_time"]))
    t.sort()
    if len(t) != s + e:
        raise RuntimeError(f"{out}: {len(t)} metrics lines, expected {s + e}")
    return (t[s + e - 1][1] - t[s - 1][1]) / e


def ddp_steady(path, s, e):
    """Seconds per step over steps s+1 .. s+e of a DDP run, from rank 0's
    result (ddp_baseline.py --json): the difference of the `end`s of steps s
    and s+e in its timeline (perf_counter after the optimiser; one warm-up
    step is not in the timeline), over e."""
    with open(path) as f:  # its result is its last line that is a JSON object
        res = json.loads([x for x in f.read().splitlines() if x.startswith("{")][-1])
    tl, warm = res["timeline"], res["warmup"]
    if len(tl) != s + e - warm:
        raise RuntimeError(f"{path}: {len(tl)} timeline steps, expected {s + e - warm}")
    return (tl[-1]["end"] - tl[s - 1 - warm]["end"]) / e


def ddp_cmd(model, workers, steps, malloc="morph"):
    """DDP with Morph's malloc thresholds (ddp_baseline.py --malloc morph), or glibc's own ("glibc")."""
    m = MODELS[model]
    return ["/usr/bin/python3", os.path.join(HERE, "ddp_baseline.py"), "--model", m["ddp"], "--workers",
            str(workers), "--steps", str(steps), "--warmup", "1", "--micro-batches", str(m["vns"]),
            "--global-batch", str(m["batch"]), "--malloc", malloc, "--json"]


def window(a, model):
    s, e = MODELS[model]["window"]
    return s, (a.extra or e)


def marginal(system, a, model, workers, tmp, long_first, net=None):
    """Seconds per steady step of one system, Morph's reduce stats, (with
    links) bytes on the wire per step and worker, CPU per step, and the
    seconds per step over the long run's last E steps by the system's own
    clock (morph_steady(), ddp_steady())."""
    s, e = window(a, model)
    times, stats, sent, cpu, steady = {}, (0.0, 0), {}, {}, 0.0
    for steps in ((s + e, s) if long_first else (s, s + e)):
        tx0 = net.tx_bytes() if net else 0
        cpu0 = children_cpu()
        if system in ("ddp", "ddp-glibc"):
            malloc = "glibc" if system == "ddp-glibc" else "morph"
            res = os.path.join(tmp, f"ddp-{model}-{workers}-{steps}.json")
            times[steps] = (ddp_netns(net, model, workers, steps, malloc, res) if net
                            else timed(ddp_cmd(model, workers, steps, malloc), stdout_path=res))
            if steps == s + e:
                steady = ddp_steady(res, s, e)
        else:
            # mode[@MORPH_BUCKET_BYTES][~MORPH_EXACT_WIRE][-before]
            binary = a.morph
            if system.endswith("-before"):
                binary, system = a.before, system[:-len("-before")]
            rest, _, wire = system.partition("~")
            mode, _, bucket = rest.partition("@")
            env = dict(os.environ)
            env.pop("MORPH_BUCKET_BYTES", None)
            env.pop("MORPH_EXACT_WIRE", None)
            if bucket:
                env["MORPH_BUCKET_BYTES"] = bucket
            if wire:
                env["MORPH_EXACT_WIRE"] = wire
            if net:
                times[steps], out = morph_netns(net, binary, model, workers, mode, steps, tmp, env)
            else:
                cmd, out = morph_cmd(binary, model, workers, mode, steps, tmp)
                times[steps] = timed(cmd, env)
            if steps == s + e:
                stats = morph_reduce_stats(out)
                steady = morph_steady(out, s, e)
        sent[steps] = net.tx_bytes() - tx0 if net else 0
        cpu[steps] = [b - a for a, b in zip(cpu0, children_cpu())]
    return ((times[s + e] - times[s]) / e, stats, (sent[s + e] - sent[s]) / e / workers,
            [(b - a) / e for a, b in zip(cpu[s], cpu[s + e])], steady)


def spread(xs):
    return f"{min(xs):.3f}/{statistics.median(xs):.3f}/{max(xs):.3f}"


def load():
    return "%.1f" % os.getloadavg()[0]


def run_rows(a, tmp, models, workers_list, systems, extra, net=None, link=""):
    for model in models:
        B = MODELS[model]["batch"]
        for workers in workers_list:
            load0 = load()
            sps = {k: [] for k in systems + extra}
            win = {k: [] for k in systems + extra}  # samples/s over the long run's last E steps
            red = {k: [] for k in ("exact", "exact32", "float") if k in systems}
            payload = {k: 0 for k in red}
            wire = {k: [] for k in systems + extra}
            cpu = {k: [] for k in systems + extra}
            faults = {k: [] for k in systems + extra}
            for r in range(a.rounds):
                every = systems + extra
                order = every[r % len(every):] + every[:r % len(every)]
                for system in order:
                    sec, (rs, pb), wb, cs, st = marginal(system, a, model, workers, tmp, long_first=r % 2 == 1,
                                                         net=net)
                    sps[system].append(B / sec)
                    win[system].append(B / st)
                    wire[system].append(wb)
                    cpu[system].append(cs[0])
                    faults[system].append(cs[1])
                    if system in red:
                        red[system].append(rs)
                        payload[system] = pb
            ex = [e / d for e, d in zip(sps["exact"], sps["ddp"])]
            fl = [f / d for f, d in zip(sps["float"], sps["ddp"])]
            med = {k: statistics.median(v) for k, v in sps.items()}
            print(f"{model:7} {workers:>2} {link:>7} {med['ddp']:7.0f} {med['exact']:7.0f} {med['float']:7.0f} "
                  f"{spread(ex):>17} {spread(fl):>17} {statistics.median(red['exact']) * 1e3:9.2f} "
                  f"{statistics.median(red['float']) * 1e3:9.2f} {payload['exact']:10.0f} {payload['float']:10.0f} "
                  f"{load0 + '-' + load():>9}", flush=True)
            if "exact32" in sps:
                e32 = [e / d for e, d in zip(sps["exact32"], sps["ddp"])]
                print(f"{'':7} {'':>2} {'exact32:':>15} {med['exact32']:7.0f} samples/s, exact32/ddp {spread(e32)}, "
                      f"exact32/exact {spread([e / b for e, b in zip(sps['exact32'], sps['exact'])])}, "
                      f"red {statistics.median(red['exact32']) * 1e3:.2f} ms, {payload['exact32']:.0f} B/step",
                      flush=True)
            # The same rounds by the steady window: no process start or
            # teardown in either figure.
            print(f"{'':7} {'':>2} {'steady window:':>15} " + ", ".join(
                f"{k} {statistics.median(win[k]):.0f} samples/s" + (
                    "" if k == "ddp" else f" ({k}/ddp {spread([x / d for x, d in zip(win[k], win['ddp'])])})")
                for k in win), flush=True)
            # Wall clock and CPU time per step side by side: where a ratio
            # of samples/s is not a ratio of work, one side waited (for its
            # peers, a lock, the scheduler) rather than computed.
            cores = min(workers, len(os.sched_getaffinity(0)))
            print(f"{'':7} {'':>2} {'ms/step wall | CPU (busy) faults:':>35} " + ", ".join(
                f"{k} {B / statistics.median(sps[k]) * 1e3:.1f} | {statistics.median(cpu[k]) * 1e3:.1f} "
                f"({statistics.median(cpu[k]) / (B / statistics.median(sps[k])) / cores:.2f}) "
                f"{statistics.median(faults[k]):.0f}" for k in sps), flush=True)
            if net:
                print(f"{'':7} {'':>2} {'wire B/step/worker (median):':>28} " +
                      ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in wire.items()), flush=True)
            for x in extra:
                ratio = [e / d for e, d in zip(sps[x], sps["ddp"])]
                if x.endswith("-before"):  # this build's row of the same mode against the other build's
                    base = x[:-len("-before")]
                    vs = f"{base}/{x} {spread([b / e for e, b in zip(sps[x], sps[base])])}"
                else:
                    vs = f"{x}/exact {spread([e / b for e, b in zip(sps[x], sps['exact'])])}"
                print(f"{'':7} {'':>2} {x + ':':>15} {statistics.median(sps[x]):7.0f} samples/s, "
                      f"{x}/ddp {spread(ratio)}, {vs}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--morph", default=os.path.join(HERE, "..", "build", "morph"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp, cnn, gptmini (or gpt-mini)")
    p.add_argument("--workers", default=None, help="comma-separated worker counts (default 1,2; 4 with --link)")
    p.add_argument("--exact-buckets", default="",
                   help="comma-separated MORPH_BUCKET_BYTES values: extra exact systems (rows 'exact@BYTES')")
    p.add_argument("--exact-wires", default="",
                   help="comma-separated MORPH_EXACT_WIRE values (auto, sharded, allreduce): extra exact systems "
                        "(rows 'exact~WIRE')")
    p.add_argument("--link", default="",
                   help="comma-separated RATE[:DELAY] (e.g. 1gbit,10gbit): run the workers in network namespaces "
                        "on a bridge with every link shaped to RATE (root, iproute2)")
    p.add_argument("--extra", type=int, default=0, help="extra steps E (default: the model's)")
    p.add_argument("--no-exact32", action="store_true",
                   help="leave out exact mode's 32-bit format (reduce.bits = 32; the row under each model's)")
    p.add_argument("--before", default="",
                   help="another build of morph: extra systems exact-before and exact32-before run with it in the "
                        "same rounds (a before/after comparison of a change)")
    p.add_argument("--ddp-glibc", action="store_true",
                   help="an extra system: DDP with glibc's own malloc thresholds (row 'ddp-glibc'); the baseline "
                        "'ddp' has Morph's")
    a = p.parse_args()
    a.morph = os.path.abspath(a.morph)
    models = [ALIASES.get(m, m) for m in a.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}: expected mlp, cnn or gptmini")
    workers_list = [int(w) for w in (a.workers or ("4" if a.link else "1,2")).split(",")]
    links = [x for x in a.link.split(",") if x]
    systems = ["ddp", "exact", "float"] + ([] if a.no_exact32 else ["exact32"])
    extra = [f"exact@{b}" for b in a.exact_buckets.split(",") if b]
    extra += [f"exact~{w}" for w in a.exact_wires.split(",") if w]
    extra += ["ddp-glibc"] if a.ddp_glibc else []
    if a.before:
        a.before = os.path.abspath(a.before)
        extra += ["exact-before"] + ([] if a.no_exact32 else ["exact32-before"])
    print(f"start: load average {' '.join('%.2f' % x for x in os.getloadavg())}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    net = None

    def stop(signum, _frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, stop)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for m in models:
                mc, dc = morph_param_count(a.morph, m, tmp), ddp_param_count(m)
                print(f"{m}: parameters Morph {mc}, DDP {dc}" + ("" if mc == dc else "  MISMATCH"), flush=True)
                if mc != dc:
                    return 1
            if links:
                if os.geteuid() != 0:
                    p.error("--link needs root (network namespaces, tc)")
                net = netns.Net(max(workers_list))
                net.up()
            print("samples/s by wall clock (marginal time of E extra steps), medians over rounds; "
                  "ratio = Morph/DDP per round, min/median/max; load = 1-min load average at the row's start-end")
            print(f"{'model':7} {'W':>2} {'link':>7} {'ddp':>7} {'exact':>7} {'float':>7} {'exact/ddp':>17} "
                  f"{'float/ddp':>17} {'ex red ms':>9} {'fl red ms':>9} {'ex B/step':>10} {'fl B/step':>10} "
                  f"{'load':>9}", flush=True)
            if not links:
                run_rows(a, tmp, models, workers_list, systems, extra, link="lo")
            for spec in links:
                net.shape(spec)
                print(f"# link {spec}: every veth end: tc qdisc {net.qdisc}", flush=True)
                run_rows(a, tmp, models, workers_list, systems, extra, net=net, link=spec)
    finally:
        if net:
            net.down()
        print(f"end: load average {' '.join('%.2f' % x for x in os.getloadavg())}, "
              f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
