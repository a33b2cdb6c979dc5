#!/usr/bin/env python3
"""Pipeline parallelism: bubble, peak memory per stage and step time of the
gpipe, 1f1b and varuna schedules, on gpt-mini over the fortunes text
(examples/fortunes-gpt.toml with --set overrides; D = 1 replica throughout).

1. Bubble: the measured bubble fraction (summary.json's bubble_fraction: mean
   over ranks and steady steps of 1 - busy compute time / step makespan)
   against (P-1)/(M+P-1), for gpipe and 1f1b, P = 2, 3 stages and M = 4, 8, 16
   VNs; about 20 ms of compute per VN per stage against a 128 KiB activation
   at each cut, so communication is small beside compute.
2. Memory: peak RSS per stage (stage_peak_rss_bytes) of gpipe, 1f1b and varuna
   with --recompute and of gpipe and 1f1b without, P = 2, M = 16, on a model
   whose activations dominate (seq_len 256). Baseline: gpipe without
   recomputation; the single-process run (one VN live at a time) is printed
   beside it.
2b. State memory: peak RSS per stage (stage_peak_rss_bytes; the single
   process's peak_rss_bytes) on a parameter-heavy model whose activations are
   small (gpt-mini dim 512, 8 blocks, heads 8, seq_len 16, AdamW, M = 4 VNs of
   2 sequences, 3 steps): a single process, and 1f1b with P = 2 and P = 4
   (--workers P), as ratios to the single process, beside the per-stage
   estimate of --memory-cap (the "morph: stage K needs about N MiB" lines its
   stdout carries without --quiet; the pipeline rows run with --memory-cap
   1000000, so nothing is rejected) and estimate / measured. Pipeline workers
   keep only their own stage's parameters, optimiser state and gradient
   buffer; world rank 0 (stage 0) keeps the whole model for evaluation and
   checkpoints. The single process is the baseline and runs even with
   --no-ref.
3. Step time of the three schedules, as ratios to gpipe measured in the same
   run (1f1b/gpipe and varuna/gpipe per condition, with and without
   --recompute), P = 2, M = 8: on loopback; on loopback with an emulated slow,
   jittery link, MORPH_TEST_PIPE_DELAY_MS=2:1 and =5:3 in the environment of
   the test build's `morph_crashy run` (--harness; so of every local worker):
   "emulated 2ms±1ms" and "emulated 5ms±3ms" (user-space emulation: each
   worker holds every activation/gradient
   message back MEAN ± JITTER ms, uniform, order kept per channel, on its
   per-channel send thread before sending it; not netem: packets, the
   manager's store traffic and the receive side are not delayed); then with
   the two stages in two network namespaces joined by a veth pair (manager
   and stage 0 in namespace A with --spawn 1, stage 1 joining from namespace
   B), without and with netem delay/jitter on both ends. The namespace part
   needs root and tc (iproute2), its netem rows a kernel with sch_netem; each
   is skipped with a message otherwise (the emulated rows always run).

Every table checks that the runs of one job (the same model, data, global
batch and VNs) end with the same model_hash whatever the schedule, P,
recomputation or network, and the single-process run's (--no-ref skips it).
Step times are the median of the steady steps in metrics.jsonl (the first
steps are warm-up). The jobs read a ~320 KB subset of the fortunes text (so
the evaluation after the last step is short) and use model.dropout = 0.1, so
that recomputation must replay each VN's dropout masks exactly.

--quick: table 1 at M = 4, 8 only; table 2 at M = 8 without the 1f1b run
without recomputation; table 2b whole; table 3 with recomputation only, on
loopback, emulated 2ms±1ms, and veth without netem and with netem 2ms 1ms
(31 runs instead of 61, references included; 28 and 49 where the kernel has
no netem).

The emulated link is a seam of the test build only (exec/pipeline.h,
LinkEmulation; tests/cli/crashy_main.cpp reads MORPH_TEST_PIPE_DELAY_MS):
the shipped `morph` never delays a message. So the emulated rows run
--harness (build/tests/morph_crashy, built with the tests), every other row
--morph; a MORPH_TEST_PIPE_DELAY_MS in this script's own environment is
removed from every run but the emulated ones.

  python3 bench/pipeline_bench.py [--quick] [--morph build/morph] [--harness build/tests/morph_crashy] [--repeat R]
          [--only bubble,memory,state,steps] [--no-ref] [--keep DIR] [--dry-run]

(--only state: table 2b.)
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOB = os.path.join(ROOT, "examples", "fortunes-gpt.toml")
FORTUNES = "/usr/share/games/fortunes"
MIB = 1 << 20
# "MEAN" or "MEAN:JITTER" ms per pipeline message, on the sender: read by the test build's morph_crashy only
# (tests/cli/crashy_main.cpp -> exec/pipeline.h's LinkEmulation).
DELAY_ENV = "MORPH_TEST_PIPE_DELAY_MS"

# gpt-mini shapes. vn_batch: sequences per VN (batch.global = M * vn_batch).
# Table 1 and 3: 9 layers (embed, 6 blocks, norm, tied head) cut into 2 or 3
# stages; about 40 ms of forward + backward per VN for the whole model on one
# core of the machine this was written on.
COMPUTE_MODEL = dict(dim=128, heads=4, layers=6, seq_len=64, vn_batch=4, dropout=0.1)
# Table 2: long sequences, few blocks: per VN and block, the attention
# probabilities alone are 4 heads x 256 x 256 x 8 sequences x 4 B = 8 MiB.
MEMORY_MODEL = dict(dim=128, heads=4, layers=2, seq_len=256, vn_batch=8, dropout=0.1)
# Table 2b: parameter-heavy, small activations: about 25 M parameters (100 MB of fp32 weights, twice that
# of AdamW state) against 2 sequences x 16 positions x 512 x 4 B = 64 KiB of stage input per VN.
STATE_MODEL = dict(dim=512, heads=8, layers=8, seq_len=16, vn_batch=2, dropout=0.1)
STATE_CAP_MIB = 1000000  # --memory-cap far above any need: the estimates are printed, nothing is rejected


def mib(b):
    return None if b is None else b / MIB


def fmt(x, spec, width):
    return f"{'n/a':>{width}}" if x is None else f"{x:{width}{spec}}"


def ratio(x, base):
    return None if x is None or not base else x / base


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def bubble_formula(p, m):
    return (p - 1) / (m + p - 1)


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    if lines:
        print(f"      --- last lines of {os.path.basename(path)} ---")
        for line in lines[-n:]:
            print(f"      {line}")


def job_args(model, m, steps, corpus, d=1):
    """--steps and --set overrides of one job: model `model`, M VNs per replica, D replicas."""
    v = m * d
    sets = {
        "model.dim": model["dim"],
        "model.heads": model["heads"],
        "model.layers": model["layers"],
        "model.dropout": model["dropout"],
        "data.seq_len": model["seq_len"],
        "data.path": json.dumps(corpus),
        "batch.virtual_nodes": v,
        "batch.global": v * model["vn_batch"],
        "eval.every": 0,  # evaluate only after the last step...
        "eval.batch": model["vn_batch"],  # ...one VN's worth at a time (keeps it out of the peak RSS)
        "log.every": 1000000,
    }
    args = ["--steps", str(steps)]
    for k, val in sets.items():
        args += ["--set", f"{k}={val}"]
    return args


def pipe_args(workers, stages, schedule, recompute):
    a = ["--workers", str(workers), "--stages", str(stages), "--schedule", schedule]
    return a + (["--recompute"] if recompute else [])


def make_corpus(tmp, dry):
    """A folder with a ~320 KB subset of the fortunes files (copies: the loader skips links)."""
    dst = os.path.join(tmp, "corpus")
    if dry:
        return dst
    if not os.path.isdir(FORTUNES):
        raise SystemExit(f"{FORTUNES} is missing (apt-get install fortunes)")
    os.makedirs(dst)
    total = 0
    for name in sorted(os.listdir(FORTUNES)):
        src = os.path.join(FORTUNES, name)
        if name.endswith((".dat", ".u8")) or os.path.islink(src) or not os.path.isfile(src):
            continue
        shutil.copyfile(src, os.path.join(dst, name))
        total += os.path.getsize(src)
        if total >= 256 * 1024:
            break
    return dst


class Runner:
    """Starts morph runs, one at a time; a failed run prints its log tails and yields None."""

    def __init__(self, morph, harness, work, dry, timeout, port):
        self.morph, self.work, self.dry, self.timeout = morph, work, dry, timeout
        self.harness = harness  # the test build's binary: the only one that emulates a link delay
        self.port = port  # the last fixed port handed to a namespace run
        self.count = 0
        self.live = []  # Popen objects still running (each the leader of its own process group)

    def outdir(self, label):
        self.count += 1
        return os.path.join(self.work, f"{self.count:03d}-" + re.sub(r"[^A-Za-z0-9.=+-]+", "_", label))

    def binary(self, delay):
        return self.harness if delay else self.morph

    @staticmethod
    def env(delay):
        """This process's environment without DELAY_ENV, plus DELAY_ENV=delay when given."""
        env = {k: v for k, v in os.environ.items() if k != DELAY_ENV}
        if delay:
            env[DELAY_ENV] = delay
        return env

    @staticmethod
    def shown(argv, delay):
        return (f"{DELAY_ENV}={shlex.quote(delay)} " if delay else "") + shlex.join(argv)

    def popen(self, argv, stem, delay=None):
        p = subprocess.Popen(argv, stdout=open(stem + ".stdout", "w"), stderr=open(stem + ".stderr", "w"),
                             stdin=subprocess.DEVNULL, start_new_session=True, env=self.env(delay))
        self.live.append(p)
        return p

    def finish(self, p, timeout):
        """Exit status, or None after killing its process group at the timeout."""
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(p)
            rc = None
        if p in self.live:
            self.live.remove(p)
        return rc

    @staticmethod
    def kill(p):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()

    def kill_all(self):
        for p in list(self.live):
            self.kill(p)
        self.live.clear()

    def collect(self, label, out, rc, logs, pipelined=True):
        if rc != 0:
            print(f"  ! {label}: " + ("timed out after %d s" % self.timeout if rc is None else f"exit status {rc}"))
            for path in logs:
                tail(path)
            return None
        try:
            with open(os.path.join(out, "summary.json")) as f:
                s = json.load(f)
        except (OSError, ValueError) as e:
            print(f"  ! {label}: no readable summary.json ({e})")
            for path in logs:
                tail(path)
            return None
        with open(out + ".stdout", errors="replace") as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
        m = re.match(r"model_hash: ([0-9a-fA-F]+)$", lines[-1]) if lines else None
        h = m.group(1) if m else s.get("model_hash")
        if m and s.get("model_hash") not in (None, h):
            print(f"  ! {label}: stdout says model_hash {h}, summary.json {s.get('model_hash')}")
        steps = []
        try:
            with open(os.path.join(out, "metrics.jsonl")) as f:
                steps = [json.loads(line)["step_seconds"] for line in f if line.strip()]
        except (OSError, ValueError, KeyError):
            pass
        # The same warm-up as the summary's steady figures (min(5, steps / 10)), at least one step.
        warm = max(1, min(5, len(steps) // 10))
        step = median(steps[warm:]) if len(steps) > warm else s.get("step_seconds")
        if pipelined and s.get("stages", 1) == 1:
            print(f"  ! {label}: summary.json says stages = {s.get('stages')}: not a pipeline run?")
        return {"label": label, "hash": h, "summary": s, "step": step, "out": out}

    def local(self, label, args, delay=None, quiet=True):
        """morph run on this machine (manager and its workers on loopback); delay: DELAY_ENV (then the harness)
        for it and so for every worker it starts (they inherit its environment); quiet=False keeps the
        progress output (the per-stage memory estimates of --memory-cap are printed only then)."""
        out = self.outdir(label)
        argv = [self.binary(delay), "run", JOB, *args, *(["--quiet"] if quiet else []), "--out", out]
        if self.dry:
            print("  $ " + self.shown(argv, delay))
            return None
        p = self.popen(argv, out, delay)
        rc = self.finish(p, self.timeout)
        return self.collect(label, out, rc, [out + ".stderr", out + ".stdout"], "--stages" in args)

    def split(self, label, args, ns, port, delay=None):
        """Manager and one spawned worker (the first to register: rank 0, stage 0) in namespace A,
        the other worker (stage 1) joining from namespace B across the veth link; delay: DELAY_ENV (the harness)
        for both the manager (so its spawned worker) and the joining worker."""
        out = self.outdir(label)
        join = f"{ns.host_a}:{port}"
        mgr_argv = ["ip", "netns", "exec", ns.a, self.binary(delay), "run", JOB, *args, "--spawn", "1", "--host", ns.host_a,
                    "--port", str(port), "--quiet", "--out", out]
        wkr_argv = ["ip", "netns", "exec", ns.b, self.binary(delay), "worker", "--join", join, "--token-file", out + "/token"]
        if self.dry:
            print("  $ " + self.shown(mgr_argv, delay) + " &")
            print(f"    (wait until `ip netns exec {ns.a} {self.morph} status --join {join} --token-file {out}/token`"
                  " shows alive >= 1)")
            print("  $ " + self.shown(wkr_argv, delay))
            return None
        logs = [out + ".stderr", out + ".stdout", out + ".worker.stderr", out + ".worker.stdout"]
        mgr = self.popen(mgr_argv, out, delay)
        deadline = time.time() + 60
        while time.time() < deadline and mgr.poll() is None:
            with open(out + ".stdout", errors="replace") as f:
                if "manager on port" in f.read():
                    break
            time.sleep(0.05)
        if mgr.poll() is not None or time.time() >= deadline:
            rc = self.finish(mgr, 0.1)
            print(f"  ! {label}: the manager " + ("did not print its port within 60 s" if rc is None
                                                 else f"ended (status {rc}) before the remote worker joined"))
            for path in logs[:2]:
                tail(path)
            return None
        # Ranks follow registration: the remote worker must register after the local one.
        registered = False
        while time.time() < deadline and mgr.poll() is None and not registered:
            registered = self.alive(ns, join, out + "/token") >= 1
            if not registered:
                time.sleep(0.1)
        if not registered and mgr.poll() is None:
            print(f"  ! {label}: could not see the local worker register; starting the remote one anyway")
        rx0 = ns.rx_bytes()
        wkr = self.popen(wkr_argv, out + ".worker", delay)
        rc = self.finish(mgr, self.timeout)
        wrc = self.finish(wkr, 30)
        if rc == 0 and wrc != 0:
            print(f"  ! {label}: the worker in {ns.b} ended with " + ("a timeout" if wrc is None else f"status {wrc}"))
        res = self.collect(label, out, rc, logs, "--stages" in args)
        if res is not None:
            rx = ns.rx_bytes()
            res["rx_bytes"] = None if rx is None or rx0 is None else rx - rx0
        return res

    def alive(self, ns, join, token_file):
        try:
            r = subprocess.run(["ip", "netns", "exec", ns.a, self.morph, "status", "--join", join, "--token-file",
                                token_file],
                               capture_output=True, text=True, timeout=15)
            return int(json.loads(r.stdout).get("alive", 0))
        except (subprocess.TimeoutExpired, ValueError, AttributeError, TypeError):
            return 0


class NetnsPair:
    """Two network namespaces joined by a veth pair (as tests/cli/netns_test.sh)."""

    def __init__(self, dry):
        tag = os.getpid()
        self.dry = dry
        self.a, self.b = f"morph_pb_a_{tag}", f"morph_pb_b_{tag}"
        self.va, self.vb = f"mpba{tag % 100000}", f"mpbb{tag % 100000}"  # at most 15 characters
        net = f"10.201.{tag % 200}"
        self.host_a, self.host_b = f"{net}.1", f"{net}.2"
        self.created = False

    def sh(self, argv, check=True):
        if self.dry:
            print("  $ " + shlex.join(argv))
            return ""
        r = subprocess.run(argv, capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)}: {r.stderr.strip()}")
        return r.stdout

    def up(self):
        self.created = True
        self.sh(["ip", "netns", "add", self.a])
        self.sh(["ip", "netns", "add", self.b])
        self.sh(["ip", "link", "add", self.va, "type", "veth", "peer", "name", self.vb])
        self.sh(["ip", "link", "set", self.va, "netns", self.a])
        self.sh(["ip", "link", "set", self.vb, "netns", self.b])
        self.sh(["ip", "-n", self.a, "addr", "add", self.host_a + "/24", "dev", self.va])
        self.sh(["ip", "-n", self.b, "addr", "add", self.host_b + "/24", "dev", self.vb])
        for ns, dev in ((self.a, self.va), (self.b, self.vb)):
            self.sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            self.sh(["ip", "-n", ns, "link", "set", dev, "up"])

    def netem(self, spec):
        """spec: e.g. "delay 2ms 1ms" on both ends of the link, or None for none."""
        for ns, dev in ((self.a, self.va), (self.b, self.vb)):
            if spec is None:
                self.sh(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], check=False)
            else:
                self.sh(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "netem", *spec.split()])

    def rx_bytes(self):
        """Bytes received on B's end of the link so far."""
        if self.dry:
            return None
        out = self.sh(["ip", "-n", self.b, "-s", "link", "show", self.vb], check=False)
        lines = out.splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("RX:") and i + 1 < len(lines):
                try:
                    return int(lines[i + 1].split()[0])
                except (ValueError, IndexError):
                    return None
        return None

    def down(self):
        if not self.created:
            return
        self.created = False
        for ns in (self.a, self.b):
            # Only processes this script started can be in these namespaces.
            pids = self.sh(["ip", "netns", "pids", ns], check=False) if not self.dry else ""
            for pid in pids.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for ns in (self.a, self.b):
            self.sh(["ip", "netns", "del", ns], check=False)
        if not self.dry:  # a veth end left behind by a half-done up()
            self.sh(["ip", "link", "del", self.va], check=False)


def hash_check(runs, ref):
    """'ok' when every run (and the reference) has one hash; else which differ."""
    got = [r for r in runs if r is not None]
    hashes = {r["hash"] for r in got}
    if ref is not None:
        hashes.add(ref["hash"])
    if not got:
        return "n/a"
    if len(hashes) == 1:
        return "ok" if ref is not None else "ok (no ref)"
    base = ref["hash"] if ref is not None else got[0]["hash"]
    bad = sorted({r["label"] + " = " + r["hash"][:8] for r in got if r["hash"] != base})
    return f"WARNING differs from {'ref' if ref is not None else 'first'} {base[:8]}: " + ", ".join(bad)


def run_ref(r, label, args, no_ref):
    if no_ref:
        return None
    res = r.local(label, args)
    if res is None and not r.dry:
        print(f"  ! {label}: no reference hash; the hash column compares the pipeline runs only")
    return res


def agg(results, key):
    """Median over repeats of a summary key, or of the step time (key 'step')."""
    if key == "step":
        return median([x["step"] for x in results if x])
    return median([x["summary"].get(key) for x in results if x])


# --- 1. bubble ------------------------------------------------------------------------------------

def bubble_table(a, r, corpus):
    ps = (2, 3)
    ms = (4, 8) if a.quick else (4, 8, 16)
    scheds = ("gpipe", "1f1b")
    steps = 10
    mdl = COMPUTE_MODEL
    print("\n== 1. bubble fraction, measured vs (P-1)/(M+P-1); D = 1 (--workers P), no recomputation ==")
    print(f"gpt-mini dim {mdl['dim']}, {mdl['layers']} blocks, seq_len {mdl['seq_len']}, {mdl['vn_batch']} sequences "
          f"per VN: activation at each cut {mdl['vn_batch'] * mdl['seq_len'] * mdl['dim'] * 4 // 1024} KiB per VN; "
          f"{steps} steps a run, {a.repeat} run(s) per cell (medians).")
    print("note: this machine has 2 cores; at P = 3 three stage processes share them, so a stage can be descheduled"
          " while it computes and the measured bubble of P = 3 mixes waiting with time-sharing.")
    res, refs = {}, {}
    for rep in range(a.repeat):
        for p in ps:
            for m in ms:
                for s in scheds:
                    label = f"{s} --stages {p} M={m}" + (f" #{rep + 1}" if a.repeat > 1 else "")
                    res.setdefault((p, m, s), []).append(
                        r.local(label, pipe_args(p, p, s, False) + job_args(mdl, m, steps, corpus)))
    for m in ms:
        refs[m] = run_ref(r, f"single-process M={m}", job_args(mdl, m, steps, corpus), a.no_ref)
    if r.dry:
        return
    print(f"\n{'P':>2} {'M':>3} {'formula':>8} | {'gpipe':>6} {'x form':>6} {'step ms':>8} | "
          f"{'1f1b':>6} {'x form':>6} {'step ms':>8} | {'1f1b/gpipe step':>15} | model hash (same M = same job)")
    for p in ps:
        for m in ms:
            f = bubble_formula(p, m)
            cells, steps_ = [], {}
            for s in scheds:
                b = agg(res[(p, m, s)], "bubble_fraction")
                steps_[s] = agg(res[(p, m, s)], "step")
                cells.append(f"{fmt(b, '.3f', 6)} {fmt(ratio(b, f), '.2f', 6)} "
                             f"{fmt(None if steps_[s] is None else steps_[s] * 1e3, '.1f', 8)}")
                for x in res[(p, m, s)]:
                    bf = x and x["summary"].get("bubble_formula")
                    if bf is not None and abs(bf - f) > 1e-9:
                        print(f"  ! {x['label']}: summary.json bubble_formula {bf:.4f}, expected {f:.4f}")
            same_job = [x for pp in ps for s in scheds for x in res[(pp, m, s)]]
            print(f"{p:>2} {m:>3} {f:8.3f} | {cells[0]} | {cells[1]} | "
                  f"{fmt(ratio(steps_['1f1b'], steps_['gpipe']), '.2f', 15)} | {hash_check(same_job, refs[m])}")
    for m in ms:
        if refs[m] and refs[m]["step"]:
            print(f"single process, M = {m}: {refs[m]['step'] * 1e3:.1f} ms a step, "
                  f"{refs[m]['step'] / m * 1e3:.1f} ms per VN for the whole model")


# --- 2. memory ------------------------------------------------------------------------------------

def memory_table(a, r, corpus):
    p, m = 2, (8 if a.quick else 16)
    steps = 3
    mdl = MEMORY_MODEL
    variants = [("gpipe", False)] + ([] if a.quick else [("1f1b", False)]) + \
               [("gpipe", True), ("1f1b", True), ("varuna", True)]
    print(f"\n== 2. peak RSS per stage, P = {p}, M = {m}, D = 1; baseline: gpipe without recomputation ==")
    act = mdl["vn_batch"] * mdl["seq_len"] * mdl["dim"] * 4
    print(f"gpt-mini dim {mdl['dim']}, {mdl['layers']} blocks, seq_len {mdl['seq_len']}, {mdl['vn_batch']} sequences "
          f"per VN (stage input {act / MIB:.1f} MiB per VN; attention probabilities alone "
          f"{mdl['heads'] * mdl['seq_len'] ** 2 * mdl['vn_batch'] * 4 / MIB:.0f} MiB per VN and block); "
          f"{steps} steps a run. RSS includes the process's fixed cost (libtorch, data, model).")
    res = {}
    for s, rc in variants:
        label = f"{s}{' --recompute' if rc else ''} --stages {p} M={m}"
        res[(s, rc)] = r.local(label, pipe_args(p, p, s, rc) + job_args(mdl, m, steps, corpus))
    ref = run_ref(r, f"single-process M={m}", job_args(mdl, m, steps, corpus), a.no_ref)
    if r.dry:
        return
    base = res[variants[0]]
    base_st = base and base["summary"].get("stage_peak_rss_bytes")
    head = " | ".join(f"{'stage ' + str(k) + ' MiB':>13} {'x base':>6}" for k in range(p))
    print(f"\n{'schedule':>8} {'recompute':>9} | {head} | {'step ms':>8} {'x base':>6}")
    for s, rc in variants:
        x = res[(s, rc)]
        st = x and x["summary"].get("stage_peak_rss_bytes")
        if x and st is None:
            print(f"  ! {x['label']}: summary.json has no stage_peak_rss_bytes")
        cells = []
        for k in range(p):
            v = st[k] if st and k < len(st) else None
            bv = base_st[k] if base_st and k < len(base_st) else None
            cells.append(f"{fmt(mib(v), '.1f', 13)} {fmt(ratio(v, bv), '.2f', 6)}")
        step = x and x["step"]
        print(f"{s:>8} {'yes' if rc else 'no':>9} | {' | '.join(cells)} | "
              f"{fmt(None if step is None else step * 1e3, '.1f', 8)} {fmt(ratio(step, base and base['step']), '.2f', 6)}")
    if ref:
        print(f"single process (whole model, one VN live at a time): {mib(ref['summary'].get('peak_rss_bytes')):.1f} MiB, "
              f"{ref['step'] * 1e3:.1f} ms a step")
    print("the last stage never recomputes (src/exec/schedule.h): under gpipe it still holds all M VNs'"
          " activations with --recompute.")
    print(f"model hash (one job): {hash_check(list(res.values()), ref)}")


# --- 2b. per-stage state memory --------------------------------------------------------------------

ESTIMATE_RE = re.compile(r"morph: stage (\d+) needs about (\d+) MiB")
CUT_RE = re.compile(r"morph: pipeline of \d+ stages x \d+ replicas, .*cut: (.*)$")


def stage_estimates(out):
    """The per-stage estimate lines of --memory-cap in a run's stdout: ({stage: MiB}, {stage: line}, [layers])."""
    est, lines, cuts = {}, {}, []
    try:
        with open(out + ".stdout", errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                m = ESTIMATE_RE.match(line)
                if m:
                    est[int(m.group(1))] = int(m.group(2))
                    lines[int(m.group(1))] = line
                c = CUT_RE.match(line)
                if c:
                    cuts = [x.strip() for x in c.group(1).split("|")]
    except OSError:
        pass
    return est, lines, cuts


def state_table(a, r, corpus):
    m, steps = 4, 3
    mdl = STATE_MODEL
    ps = (2, 4)
    print(f"\n== 2b. per-stage state memory (parameters, optimiser state, gradient buffer), 1f1b, M = {m}, D = 1;"
          " baseline: the single process ==")
    act = mdl["vn_batch"] * mdl["seq_len"] * mdl["dim"] * 4
    print(f"gpt-mini dim {mdl['dim']}, {mdl['layers']} blocks, heads {mdl['heads']}, seq_len {mdl['seq_len']}, AdamW, "
          f"{mdl['vn_batch']} sequences per VN (stage input {act // 1024} KiB per VN: activations are small, the "
          f"state dominates); {steps} steps a run. Pipeline rows run with --memory-cap {STATE_CAP_MIB} and without"
          " --quiet, for the 'stage K needs about N MiB' estimate lines. RSS includes the process's fixed cost"
          " (libtorch, Gloo, data); no checkpoints here, so every stage, world rank 0 too, holds only its own layers.")
    res = {}
    # The single process is this table's baseline, so it runs even with --no-ref.
    res[1] = r.local("single-process state", job_args(mdl, m, steps, corpus))
    for p in ps:
        res[p] = r.local(f"1f1b --stages {p} state",
                         pipe_args(p, p, "1f1b", False) + ["--memory-cap", str(STATE_CAP_MIB)] +
                         job_args(mdl, m, steps, corpus), quiet=False)
    if r.dry:
        return
    single = res[1] and res[1]["summary"].get("peak_rss_bytes")
    if res[1] and single is None:
        print(f"  ! {res[1]['label']}: summary.json has no peak_rss_bytes")
    print(f"\n{'run':>10} {'stage':>5} {'layers':>14} | {'peak RSS MiB':>12} {'x single':>8} | "
          f"{'estimate MiB':>12} {'est/meas':>8} | {'model hash':>16}")
    print(f"{'single':>10} {'-':>5} {'all':>14} | {fmt(mib(single), '.1f', 12)} {fmt(ratio(single, single), '.2f', 8)} | "
          f"{'-':>12} {'-':>8} | {res[1]['hash'] if res[1] else 'n/a':>16}")
    notes, under = [], []
    for p in ps:
        x = res[p]
        if x is None:
            print(f"{'--stages ' + str(p):>10}   (failed)")
            continue
        st = x["summary"].get("stage_peak_rss_bytes")
        if st is None:
            print(f"  ! {x['label']}: summary.json has no stage_peak_rss_bytes")
        elif len(st) != p:
            print(f"  ! {x['label']}: stage_peak_rss_bytes has {len(st)} entries, expected {p}")
        est, lines, cuts = stage_estimates(x["out"])
        if len(est) != p:
            print(f"  ! {x['label']}: {len(est)} 'stage K needs about N MiB' lines in its stdout, expected {p}")
        for k in range(p):
            v = st[k] if st and k < len(st) else None
            e = est.get(k)
            eb = None if e is None else e * MIB
            name = f"--stages {p}" if k == 0 else ""
            if e is not None and v is not None and eb < v:
                under.append(f"--stages {p} stage {k} ({e} < {mib(v):.1f} MiB)")
            print(f"{name:>10} {k:>5} {cuts[k] if k < len(cuts) else '?':>14} | {fmt(mib(v), '.1f', 12)} "
                  f"{fmt(ratio(v, single), '.2f', 8)} | {fmt(e, 'd', 12)} {fmt(ratio(eb, v), '.2f', 8)} | "
                  f"{x['hash'] if k == 0 else '':>16}")
        if st and len(st) == p:
            print(f"{'':>10} {'sum':>5} {'':>14} | {mib(sum(st)):12.1f} {fmt(ratio(sum(st), single), '.2f', 8)} |"
                  f" {fmt(sum(est.values()) if len(est) == p else None, 'd', 12)} "
                  f"{fmt(ratio(sum(est.values()) * MIB, sum(st)) if len(est) == p else None, '.2f', 8)} |")
        notes += [f"--stages {p}: {lines[k]}" for k in sorted(lines)]
    if notes:
        print("estimate lines (MiB; process = the manager's resident size after loading the data):")
        for line in notes:
            print(f"  {line}")
    if under:
        print("note: estimate below the measured peak RSS (a --memory-cap between the two would pass a stage that"
              " then exceeds it): " + ", ".join(under))
    print("est/meas >= 1: the estimate is on the safe side. x single: the stage's peak RSS over the single"
          " process's (whole model, AdamW state and gradients in one process).")
    print(f"model hash (one job): {hash_check([res[p] for p in ps], res[1])}")


# --- 3. step time -----------------------------------------------------------------------------------

def netns_usable():
    """None when the namespace part can run, else why not."""
    if os.geteuid() != 0:
        return "not root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None and not any(os.access(os.path.join(d, tool), os.X_OK) for d in ("/usr/sbin", "/sbin")):
            return f"`{tool}` not found (apt-get install iproute2)"
    return None


def steps_table(a, r, corpus):
    p, m = 2, 8
    steps = 10
    mdl = COMPUTE_MODEL
    scheds = ("gpipe", "1f1b", "varuna")
    recomputes = (True,) if a.quick else (True, False)
    # (name, split across namespaces, netem spec, DELAY_ENV for the harness)
    conditions = [("loopback", False, None, None)]
    emulated = [("emulated 2ms±1ms", False, None, "2:1"), ("emulated 5ms±3ms", False, None, "5:3")]
    if r.dry or os.access(r.harness, os.X_OK):
        conditions += emulated[:1] if a.quick else emulated
    else:
        print(f"SKIPPED the emulated-link rows: {r.harness} not found (the test build's binary: build with"
              " MORPH_BUILD_TESTS=ON, or pass --harness)")
    nets = [("veth, no netem", True, None, None), ("netem 2ms 1ms", True, "delay 2ms 1ms", None),
            ("netem 5ms 3ms", True, "delay 5ms 3ms", None)]
    conditions += nets[:2] if a.quick else nets
    print(f"\n== 3. step time by schedule, P = {p}, M = {m}, D = 1; baseline: gpipe under the same condition ==")
    print(f"gpt-mini as in table 1; {steps} steps a run, {a.repeat} run(s) per cell (medians).")
    print(f"emulated A±B rows: loopback with {DELAY_ENV}=A:B in the environment of `{r.harness} run` (the test"
          " build's binary: the shipped one never delays a message), so of every"
          " worker it starts: a USER-SPACE EMULATION of a slow, jittery link, not netem. Each worker holds every"
          " activation/gradient message back A ms ± B ms (uniform; order kept per channel: a message never leaves"
          " before the one ahead of it) on its per-channel send thread, then sends it over loopback. One delay"
          " per message, on the sender only; the manager's store traffic and the receive side are not delayed,"
          " no packet is reordered or lost.")
    print("netem rows: netem applies on both ends of the veth link (each direction delayed once: the round trip"
          " gets twice the delay; its jitter can reorder packets, as netem does). The manager's store traffic to"
          " the worker in B crosses the link too.")
    why = netns_usable()
    ns = None
    if why and any(c[1] for c in conditions):
        msg = f"SKIPPED the network-namespace part ({why}): it needs root and tc/ip from iproute2"
        if r.dry:
            print(f"  (dry run: {msg}; printing its commands anyway)")
        else:
            print(msg)
            conditions = [c for c in conditions if not c[1]]
    res = {}
    try:
        if any(c[1] for c in conditions):
            ns = NetnsPair(r.dry)
            try:
                ns.up()
            except RuntimeError as e:
                print(f"SKIPPED the network-namespace part: could not set it up: {e}")
                ns.down()
                ns = None
                conditions = [c for c in conditions if not c[1]]
        if ns is not None and not r.dry and any(c[2] for c in conditions):
            try:
                ns.netem("delay 1ms")
                ns.netem(None)
            except RuntimeError as e:
                print(f"SKIPPED the netem rows: this kernel offers no netem qdisc (sch_netem): {e}")
                print("  (the emulated rows above stand in for them: a per-message delay on the sender, not"
                      " a packet-level one)")
                conditions = [c for c in conditions if not c[2]]
        for name, split, netem, delay in conditions:
            if split:
                try:
                    ns.netem(netem)
                except RuntimeError as e:
                    print(f"SKIPPED {name}: {e}")
                    continue
            for rep in range(a.repeat):
                for rc in recomputes:
                    for s in scheds:
                        label = f"{s}{' --recompute' if rc else ''} {name}" + (f" #{rep + 1}" if a.repeat > 1 else "")
                        args = pipe_args(p, p, s, rc) + job_args(mdl, m, steps, corpus)
                        if split:
                            r.port += 1  # a fresh port a run: no clash with the last run's closing sockets
                            x = r.split(label, args, ns, r.port, delay)
                        else:
                            x = r.local(label, args, delay)
                        res.setdefault((name, rc, s), []).append(x)
    finally:
        if ns is not None:
            ns.down()
    ref = run_ref(r, f"single-process M={m}", job_args(mdl, m, steps, corpus), a.no_ref)
    if r.dry:
        return
    w = max(len(c[0]) for c in conditions)
    print(f"\n{'condition':>{w}} {'recompute':>9} | {'gpipe ms':>8} | {'1f1b ms':>8} {'x gpipe':>7} | "
          f"{'varuna ms':>9} {'x gpipe':>7} | {'gpipe x loopback':>16} | {'B rx MB/run':>11}")
    loop = {rc: agg(res.get(("loopback", rc, "gpipe"), []), "step") for rc in recomputes}
    done, ratios = [], {}
    for name, split, netem, delay in conditions:
        for rc in recomputes:
            if (name, rc, "gpipe") not in res:
                continue
            st = {s: agg(res[(name, rc, s)], "step") for s in scheds}
            ms_ = {s: None if st[s] is None else st[s] * 1e3 for s in scheds}
            ratios[(name, rc)] = (ratio(st["1f1b"], st["gpipe"]), ratio(st["varuna"], st["gpipe"]))
            rx = median([x.get("rx_bytes") for s in scheds for x in res[(name, rc, s)] if x])
            print(f"{name:>{w}} {'yes' if rc else 'no':>9} | {fmt(ms_['gpipe'], '.1f', 8)} | "
                  f"{fmt(ms_['1f1b'], '.1f', 8)} {fmt(ratios[(name, rc)][0], '.2f', 7)} | "
                  f"{fmt(ms_['varuna'], '.1f', 9)} {fmt(ratios[(name, rc)][1], '.2f', 7)} | "
                  f"{fmt(ratio(st['gpipe'], loop[rc]), '.2f', 16)} | {fmt(None if rx is None else rx / 1e6, '.1f', 11)}")
            if split and rx is not None and rx < 1e6:
                print(f"  ! {name}: only {rx} bytes crossed the veth link: were both stages really split?")
            done += [x for s in scheds for x in res[(name, rc, s)]]
        if delay:
            # gpipe alone can hide a small delay (its fill and drain pay it once, and on a 2-core machine a stage
            # waiting for a message frees a core for the other), so only a condition where no schedule got
            # slower than on loopback is suspect.
            slower = [ratio(agg(res[(name, rc, s)], "step"), agg(res.get(("loopback", rc, s), []), "step"))
                      for rc in recomputes for s in scheds if (name, rc, s) in res]
            slower = [x for x in slower if x is not None]
            if slower and max(slower) <= 1.0:
                print(f"  ! {name}: no schedule is slower than on loopback: was {DELAY_ENV}={delay} applied?")
    if ratios:
        which = " / ".join("yes" if rc else "no" for rc in recomputes)
        print(f"\nstep-time ratios to gpipe under the same condition (< 1: faster than gpipe); --recompute {which}:")
        print(f"{'condition':>{w}} | {'1f1b/gpipe':>13} | {'varuna/gpipe':>13}")
        for name, *_ in conditions:
            cells = []
            for k in range(2):
                cells.append(" / ".join(fmt(ratios[(name, rc)][k] if (name, rc) in ratios else None, '.2f', 4)
                                        for rc in recomputes))
            if any((name, rc) in ratios for rc in recomputes):
                print(f"{name:>{w}} | {cells[0]:>13} | {cells[1]:>13}")
    print(f"model hash (one job): {hash_check(done, ref)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--morph", default=os.path.join(ROOT, "build", "morph"))
    ap.add_argument("--harness", default=os.path.join(ROOT, "build", "tests", "morph_crashy"),
                    help="the test build's morph (emulated link delay, MORPH_TEST_PIPE_DELAY_MS): the emulated rows")
    ap.add_argument("--quick", action="store_true", help="a reduced grid (about half the runs)")
    ap.add_argument("--only", default="bubble,memory,state,steps",
                    help="comma-separated subset of bubble,memory,state,steps (state: table 2b)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per timing cell, interleaved; medians are printed")
    ap.add_argument("--no-ref", action="store_true", help="skip the single-process reference runs")
    ap.add_argument("--port", type=int, default=29700, help="first of the fixed ports of the namespace runs")
    ap.add_argument("--timeout", type=int, default=300, help="seconds before a run is killed")
    ap.add_argument("--keep", help="keep every run's folder and logs here (default: a temporary folder)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    a = ap.parse_args()
    a.repeat = max(1, a.repeat)
    only = {x.strip() for x in a.only.split(",") if x.strip()}
    unknown = only - {"bubble", "memory", "state", "steps"}
    if unknown:
        ap.error(f"--only: unknown table(s) {', '.join(sorted(unknown))}")
    a.morph = os.path.abspath(a.morph)
    a.harness = os.path.abspath(a.harness)
    if not a.dry_run:
        if not os.access(a.morph, os.X_OK):
            raise SystemExit(f"{a.morph}: not found; build first (cmake --build build)")
        helptext = subprocess.run([a.morph, "run", "--help"], capture_output=True, text=True).stdout
        missing = [f for f in ("--stages", "--schedule", "--recompute") if f not in helptext]
        if missing:
            raise SystemExit(f"{a.morph} run does not take {', '.join(missing)} yet (pipeline parallelism)")

    # SIGTERM/SIGHUP unwind through the finally blocks (namespaces, processes, temp folder).
    def stop(sig, _frame):
        raise SystemExit(128 + sig)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)

    tmp = tempfile.mkdtemp(prefix="pipeline_bench.")
    work = os.path.abspath(a.keep) if a.keep else tmp
    os.makedirs(work, exist_ok=True)
    r = Runner(a.morph, a.harness, work, a.dry_run, a.timeout, a.port - 1)
    print(f"morph: {a.morph}; {os.cpu_count()} cores; " + ("quick grid" if a.quick else "full grid") +
          ("; dry run" if a.dry_run else "") + (f"; runs kept in {work}" if a.keep else ""))
    load = os.getloadavg()[0]
    if not a.dry_run and load > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {load:.1f} on {os.cpu_count()} cores before the first run: other processes"
              " compete for the cores and the times will be noisy (--repeat helps)")
    try:
        corpus = make_corpus(tmp, a.dry_run)
        if "bubble" in only:
            bubble_table(a, r, corpus)
        if "memory" in only:
            memory_table(a, r, corpus)
        if "state" in only:
            state_table(a, r, corpus)
        if "steps" in only:
            steps_table(a, r, corpus)
    finally:
        r.kill_all()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
