#!/usr/bin/env python3
"""One live run of `morph cluster` (tests/cli/cluster_live_test.sh): four
small jobs with different priorities on 3 slots under POLICY. Checks every
job ends done with its standalone run's model_hash; that at no poll (every
0.1 s) the jobs hold more than 3 slots, in the scheduler's queue and in the
process table (worker processes whose manager the cluster started); under
wfs and morph that at least one job was resized while it ran (its own log
says so); under fifo that none was, and that a cancelled queued job never
starts; that each job's measured step (the queue's step_seconds) is a mean
of its own gaps between commits. Only the processes this script starts are
ended (by pid).

  cluster_live_check.py MORPH POLICY WORKDIR   (WORKDIR holds j0..j3.toml and refs.json)
"""
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

MORPH, POLICY, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
SLOTS = 3
OUT = os.path.join(WORK, "c-" + POLICY)
refs = json.load(open(os.path.join(WORK, "refs.json")))


def fail(msg):
    print("FAIL (" + POLICY + "): " + msg)
    sys.exit(1)


def workers_running(cluster_pid):
    """Worker processes (`morph worker --join`) whose parent's parent is the cluster."""
    ppid, cmd = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] == "Z":
                continue
            ppid[int(d)] = int(fields[1])
            cmd[int(d)] = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
        except (OSError, ValueError):
            continue
    n = 0
    for p, c in cmd.items():
        if len(c) > 2 and c[1] == b"worker" and c[2] == b"--join" and ppid.get(ppid.get(p, 0), 0) == cluster_pid:
            n += 1
    return n


cluster = subprocess.Popen([MORPH, "cluster", "--slots", str(SLOTS), "--policy", POLICY, "--out", OUT],
                           stdout=open(OUT + ".log", "w"), stderr=subprocess.STDOUT)
try:
    for _ in range(200):
        if os.path.exists(os.path.join(OUT, "address")):
            break
        time.sleep(0.05)
    address = open(os.path.join(OUT, "address")).read().strip()
    token = open(os.path.join(OUT, "token")).read().strip()
    env = dict(os.environ, MORPH_TOKEN=token)

    def queue():
        rq = urllib.request.Request(f"http://{address}/queue", headers={"Authorization": "Bearer " + token})
        return json.load(urllib.request.urlopen(rq, timeout=10))

    def submit_start(i, prio, demand):
        return subprocess.Popen([MORPH, "submit", "--cluster", address, os.path.join(WORK, f"j{i}.toml"),
                                 "--priority", str(prio), "--demand", str(demand)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def submit_end(i, p):
        out, err = p.communicate()
        if p.returncode != 0:
            fail(f"submit j{i}: exit {p.returncode}: {err}")
        return int(out.strip())

    def submit(i, prio, demand):
        return submit_end(i, submit_start(i, prio, demand))

    max_queue, max_procs = 0, 0

    def poll():
        global max_queue, max_procs
        q = queue()
        max_queue = max(max_queue, sum(j["workers"] for j in q["jobs"]))
        max_procs = max(max_procs, workers_running(cluster.pid))
        if max_queue > SLOTS or max_procs > SLOTS:
            fail(f"more than {SLOTS} slots in use: queue {max_queue}, worker processes {max_procs}")
        return q

    # j0 demands all 3 slots: a long job narrower than the cluster would be
    # started at its demand early and kept there by the morph policy
    # (docs/cluster.md, "morph": long narrow jobs first), and no job resized.
    ids = {submit(0, 1, 3): 0}
    deadline = time.time() + 60
    while True:  # the second job arrives while the first runs
        q = poll()
        if q["jobs"][0]["state"] == "running" and q["jobs"][0]["step"] > 0:
            break
        if time.time() > deadline:
            fail("job 0 did not start: " + json.dumps(q))
        time.sleep(0.1)
    # The other three straight to the API (what `morph submit` sends; a
    # process per submission would load libtorch three more times).
    for i, prio, demand in ((1, 5, 2), (2, 10, 3), (3, 5, 1)):
        rq = urllib.request.Request(f"http://{address}/submit", headers={"Authorization": "Bearer " + token},
                                    data=json.dumps({"job": os.path.join(WORK, f"j{i}.toml"), "priority": prio,
                                                     "demand": demand}).encode())
        ids[json.load(urllib.request.urlopen(rq, timeout=30))["id"]] = i
    cancelled = None
    if POLICY == "fifo":  # queued behind the priority-10 job: cancel it before it starts
        cancelled = submit(1, 1, 3)
        r = subprocess.run([MORPH, "cancel", "--cluster", address, str(cancelled)], env=env, capture_output=True,
                           text=True)
        if r.returncode != 0 or "cancelled" not in r.stdout:
            fail(f"cancel: exit {r.returncode}: {r.stdout} {r.stderr}")
    deadline = time.time() + 150
    while True:
        q = poll()
        if all(j["state"] in ("done", "failed", "cancelled") for j in q["jobs"]):
            break
        if time.time() > deadline:
            fail("jobs did not finish: " + json.dumps(q))
        time.sleep(0.1)
    resized = []
    for j in q["jobs"]:
        if j["id"] == cancelled:
            if j["state"] != "cancelled" or j["started"] is not None:
                fail("the cancelled job: " + json.dumps(j))
            continue
        i = ids[j["id"]]
        if j["state"] != "done":
            fail(f"job {j['id']} (j{i}) ended {j['state']}: {open(os.path.join(j['dir'], 'log')).read()}")
        if j["model_hash"] != refs[str(i)]:
            fail(f"job j{i}: model_hash {j['model_hash']}, standalone {refs[str(i)]}")
        # The scheduler's measured step (step_seconds, by worker count): a
        # mean of the job's own gaps between commits on that count, so
        # between the smallest and the largest of them; the count it ran
        # most steps on is there.
        lines = [json.loads(l) for l in open(os.path.join(j["dir"], "metrics.jsonl"))]
        gaps = {}
        for a, b in zip(lines, lines[1:]):
            if a["workers"] == b["workers"]:
                gaps.setdefault(str(b["workers"]), []).append(b["unix_time"] - a["unix_time"])
        most = max(gaps, key=lambda k: len(gaps[k]))
        if most not in j["step_seconds"]:
            fail(f"job j{i}: no measured step on {most} workers: {j['step_seconds']}")
        for k, sec in j["step_seconds"].items():
            if k not in gaps or not min(gaps[k]) - 1e-6 <= sec <= max(gaps[k]) + 1e-6:
                fail(f"job j{i}: measured {sec} s per step on {k} workers, its gaps there "
                     f"{min(gaps.get(k, [0]))}..{max(gaps.get(k, [0]))} s")
        log = open(os.path.join(j["dir"], "log")).read()
        # Resized while it ran: its manager formed a new generation on request.
        if re.search(r"generation [0-9]+: request", log):
            resized.append(i)
            if j["resizes"] == 0:
                fail(f"job j{i} was resized but the queue counts no resize request: {log}")
    if POLICY in ("wfs", "morph") and not resized:
        fail("no job was resized while it ran")
    if POLICY == "fifo" and resized:
        fail(f"fifo resized {resized}")
    print(f"{POLICY}: 4 jobs done, hashes equal the standalone runs', resized while running: {resized}, "
          f"most slots held {max_queue} (queue) / {max_procs} (worker processes)")
finally:
    cluster.terminate()
    try:
        cluster.wait(timeout=30)
    except subprocess.TimeoutExpired:
        cluster.kill()
        cluster.wait()
