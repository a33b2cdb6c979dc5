"""Emulated hosts for the benches: W network namespaces on a bridge, every
link shaped to a rate (root, iproute2), and a Morph job across them.

Each namespace ns_i holds one veth end (address 10.N.T.(i+1)); its peer is
a port of a bridge in a hub namespace, so the namespaces are hosts on a
switch. shape() sets the same qdisc on both ends of every veth: `netem rate
RATE [delay DELAY]` where the kernel has sch_netem, otherwise a token
bucket (`tbf rate RATE burst RATE/1000 latency 50ms`), which shapes the
rate but cannot add delay. down() kills what still runs in the namespaces
and removes them: call it in a `finally` (bench/vs_ddp.py,
bench/wsp_tta.py).
"""
import json
import os
import re
import signal
import subprocess
import time

import procs as procs_mod


def sh(*argv, check=True):
    return subprocess.run(argv, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rate_bits(rate):
    """Bits per second of a tc rate such as 100mbit, 1gbit, 12.5mbps."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)(bit|bps)?", rate.lower())
    if not m:
        raise ValueError(f"link rate {rate!r}: expected e.g. 1gbit, 10gbit, 500mbit")
    v = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return v * 8 if m.group(3) == "bps" else v


class Net:
    """W namespaces `{prefix}{tag}n{i}` (address 10.`subnet`.T.(i+1) on veth
    `{ifprefix}{tag}e{i}`), their peers on a bridge in a hub namespace;
    shape() sets the rate on both ends of every veth. down() kills what runs
    in them and removes them. Interface names must fit 15 characters."""

    def __init__(self, n, prefix="vsddp", ifprefix="vd", subnet=201):
        tag = os.getpid() % 10000
        self.hub = f"{prefix}{tag}hub"
        self.ns = [f"{prefix}{tag}n{i}" for i in range(n)]
        self.ifs = [f"{ifprefix}{tag}e{i}" for i in range(n)]
        self.ports = [f"{ifprefix}{tag}p{i}" for i in range(n)]
        self.ips = [f"10.{subnet}.{tag % 250}.{i + 1}" for i in range(n)]
        self.made = []
        self.qdisc = ""

    def up(self):
        for ns in [self.hub] + self.ns:
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        for ns, dev, port, ip in zip(self.ns, self.ifs, self.ports, self.ips):
            sh("ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name", port, "netns", self.hub)
            sh("ip", "-n", ns, "addr", "add", ip + "/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", self.hub, "link", "set", port, "master", "br0")
            sh("ip", "-n", self.hub, "link", "set", port, "up")
        # Does this kernel have netem? (Probe on the hub's loopback.)
        self.has_netem = sh("tc", "-n", self.hub, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "0ms",
                            check=False).returncode == 0
        sh("tc", "-n", self.hub, "qdisc", "del", "dev", "lo", "root", check=False)
        # Every namespace reaches every other through the bridge.
        for i, ns in enumerate(self.ns):
            j = (i + 1) % len(self.ns)
            if j != i:
                sh("ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "5", self.ips[j], check=False)

    def shape(self, spec):
        rate, _, delay = spec.partition(":")
        bits = rate_bits(rate)
        if self.has_netem:
            q = ["netem", "rate", rate] + (["delay", delay] if delay else [])
        elif delay:
            raise SystemExit(f"--link {spec}: this kernel has no netem qdisc (sch_netem), so no delay can be "
                             "emulated; give the rate alone (shaped with tbf)")
        else:
            burst = max(32768, int(bits / 8 / 1000))  # 1 ms at the rate
            q = ["tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]
        self.qdisc = " ".join(q)
        for ns, dev in list(zip(self.ns, self.ifs)) + [(self.hub, p) for p in self.ports]:
            sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *q)

    def tx_bytes(self):
        """Bytes sent so far by the workers' ends of the veth pairs."""
        total = 0
        for ns, dev in zip(self.ns, self.ifs):
            info = json.loads(sh("ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev).stdout)
            total += info[0]["stats64"]["tx"]["bytes"]
        return total

    def down(self):
        for ns in reversed(self.made):
            pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for ns in reversed(self.made):
            sh("ip", "netns", "del", ns, check=False)
        self.made = []


def start_morph(net, run_argv, workers, out, log, env=None):
    """Starts `run_argv` (a `morph run ... --out OUT` with `--spawn 1` or a
    resources file of one local device) in the first namespace, listening on
    its address (`--host` is added), and one `morph worker --join` in each
    of the next workers - 1 namespaces once the manager prints its port.
    Returns the Popens, the manager's first: it leads a session of its own
    (its spawned worker shares its process group), so end() ends exactly
    these. The manager's output goes to `log`."""
    with open(log, "w") as lf:
        mgr = procs_mod.start(["ip", "netns", "exec", net.ns[0]] + run_argv + ["--host", net.ips[0]],
                              stdout=lf, stderr=subprocess.STDOUT, env=env)
    started = [mgr]
    try:
        port = None
        while port is None:
            with open(log) as f:
                m = re.search(r"manager on port (\d+)", f.read())
            if m:
                port = m.group(1)
            elif mgr.poll() is not None:
                raise RuntimeError(f"morph run exited with {mgr.returncode}: {open(log).read()}")
            else:
                time.sleep(0.02)
        binary = run_argv[0]
        for i in range(1, workers):
            started.append(subprocess.Popen(["ip", "netns", "exec", net.ns[i], binary, "worker", "--join",
                                             f"{net.ips[0]}:{port}", "--token-file", os.path.join(out, "token")],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
    except BaseException:
        end(started)
        raise
    return started


def end(started):
    """Ends the processes start_morph started (and the manager's group)."""
    procs_mod.end(*started)


def wait_all(started, what, timeout=900):
    deadline = time.monotonic() + timeout
    for p in started:
        left = max(1.0, deadline - time.monotonic())
        try:
            p.wait(left)
        except subprocess.TimeoutExpired:
            end(started)
            raise RuntimeError(f"{what}: timed out")
    bad = [p.returncode for p in started if p.returncode != 0]
    if bad:
        raise RuntimeError(f"{what}: exit codes {[p.returncode for p in started]}")
