"""The processes a bench starts, and only those.

Other sessions run Morph jobs on the same machine: a bench must never
pick its victims or clean up by a name pattern (`pkill -f`, `pgrep -f`).
It starts `morph run` as the leader of a session of its own (its spawned
workers share that process group), keeps the Popen of every
`morph worker --join` it starts itself, and ends exactly those.
"""
import os
import signal
import subprocess


def start(argv, **kw):
    """Popen of argv as the leader of a new session (and process group)."""
    return subprocess.Popen(argv, start_new_session=True, **kw)


def is_worker(pid):
    """Whether `pid` runs `morph worker` (a child of `morph run` may also be
    its worker zygote, whose command line is the manager's)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    return len(args) > 1 and args[1] == b"worker"


def children(pid):
    """Pids of the live direct children of `pid` that are workers (for
    `morph run`: the workers it spawned), oldest first, from /proc."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
        except FileNotFoundError:
            pass
    return sorted(p for p in set(out) if is_worker(p))


def end(*procs):
    """SIGKILL each started process group (`start`) or process (a Popen
    started without a session of its own) that is still running, and reap it."""
    for p in procs:
        if p is None or p.poll() is not None:
            continue
        try:
            if os.getpgid(p.pid) == p.pid:
                os.killpg(p.pid, signal.SIGKILL)
            else:
                p.kill()
        except ProcessLookupError:
            pass
        p.wait()
