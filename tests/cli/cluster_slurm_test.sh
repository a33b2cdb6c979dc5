#!/usr/bin/env bash
# morph cluster --slurm inside a real Slurm allocation (docs/cluster.md):
# the test configures and starts munged, slurmctld and two slurmd (nodes n1
# and n2 on this machine), takes a 3-task allocation of both nodes with
# salloc and runs `morph cluster --slurm --policy wfs` in it. Two jobs: j0
# (demand 2) runs first; j1 (priority 5, demand 2) arrives while it runs, so
# wfs shrinks j0 to 1 worker and starts j1; when j1 ends j0 grows again
# (new worker steps, then the resize). Checks: both hashes equal the
# standalone runs', j0 was resized while it ran, its managers and workers
# ran as Slurm job steps on both nodes. With a second argument `typed`, the
# same Slurm set-up runs slot types by node instead (see there). Needs root
# and Debian's slurmctld,
# slurmd, slurm-client and munge (installed with apt-get when missing);
# exits 77 (skipped, said in the output) when they cannot be installed.
set -euo pipefail
MORPH=$1
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/shell_util.sh"

need="slurmctld slurmd munged srun salloc scontrol squeue sinfo"
missing() { for b in $need; do command -v "$b" >/dev/null || return 0; done; return 1; }
if [[ $(id -u) != 0 ]]; then echo "SKIP: the Slurm test needs root (slurmd)"; exit 77; fi
if missing; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge \
    >/dev/null 2>&1 || true
fi
if missing; then echo "SKIP: Debian's slurmctld, slurmd, slurm-client and munge could not be installed"; exit 77; fi

work=$(mktemp -d)
chmod 755 "$work"
salloc_pid=""
cleanup() {
  if [[ -n "$salloc_pid" ]]; then
    for p in $(pgrep -P "$salloc_pid" || true); do kill -TERM "$p" 2>/dev/null || true; done
    wait "$salloc_pid" 2>/dev/null || true
  fi
  for f in "$work"/slurmd-n1.pid "$work"/slurmd-n2.pid "$work"/slurmctld.pid "$work"/m/munged.pid; do
    [[ -s "$f" ]] && kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  sleep 0.5
  [[ -n "${MORPH_KEEP_WORK:-}" ]] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
# stop_cluster: ends the allocation's cluster (started in the background as
# $salloc_pid) and checks it stopped cleanly.
stop_cluster() {
  for p in $(pgrep -P "$salloc_pid" || true); do kill -TERM "$p"; done
  wait "$salloc_pid" || true
  salloc_pid=""
  grep -q "cluster stopped" "$work/c.log" || { echo "FAIL: the cluster did not stop cleanly"; cat "$work/c.log"; exit 1; }
}

# munge with a key of its own, on a socket in the work folder.
mkdir -p "$work/m" "$work/state" "$work/spool/n1" "$work/spool/n2" "$work/log"
chmod 711 "$work/m"
dd if=/dev/urandom of="$work/m/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$work/m/munge.key"
munged -f --socket="$work/m/munge.sock" --key-file="$work/m/munge.key" --log-file="$work/m/munged.log" \
  --pid-file="$work/m/munged.pid" --seed-file="$work/m/munged.seed"

read -r p1 p2 p3 < <(python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
host=$(hostname -s)
cat > "$work/slurm.conf" <<CONF
ClusterName=morphtest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/m/munge.sock
CredType=cred/munge
SlurmctldPort=$p1
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=n1 NodeAddr=127.0.0.1 NodeHostname=$host Port=$p2 CPUs=2 State=UNKNOWN
NodeName=n2 NodeAddr=127.0.0.1 NodeHostname=$host Port=$p3 CPUs=2 State=UNKNOWN
PartitionName=main Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$work/slurm.conf
slurmctld -i
slurmd -N n1
slurmd -N n2
for _ in $(seq 1 100); do
  [[ $(sinfo -h -o %T 2>/dev/null | sort -u | tr -d '\n') == idle ]] && break
  sleep 0.2
done
[[ $(sinfo -h -o %T | sort -u | tr -d '\n') == idle ]] || { echo "FAIL: Slurm nodes not idle"; sinfo; cat "$work"/log/*; exit 1; }

STEPS=20000 mlp_job "$work/j0.toml" j0 1
# Typed: j1 runs long enough (3000 steps, a few seconds) for the scheduler
# to learn its worker's node and slow it.
STEPS=$([[ ${2:-} == typed ]] && echo 3000 || echo 300) mlp_job "$work/j1.toml" j1 2
if [[ ${2:-} == typed ]]; then  # the emulated slow workers are not the jobs' stragglers to release
  for i in 0 1; do printf '[elastic]\nstraggler_replan = false\n' >> "$work/j$i.toml"; done
fi
for i in 0 1; do "$MORPH" run "$work/j$i.toml" --out "$work/ref$i" --quiet --status off > /dev/null; done

if [[ ${2:-} == typed ]]; then
  # Slot types by node (docs/cluster.md, "Slot types under Slurm"): n1 is a
  # fast slot, n2 a slow one (slowdown 1.5), one task of the allocation on
  # each. wfs places counts by type order: j0 (demand 2) starts on both;
  # j1 (priority 5, demand 1) makes it shrink, giving back its slow slot,
  # so j0 must release the worker that runs on n2 (by id, from the label
  # its step was given); j1 then runs on n2, slowed 1.5x, and j0 grows
  # back onto n2 once j1 ends. Checks: both hashes equal the standalone
  # runs'; the scheduler learned both of j0's workers' nodes, released the
  # one on n2, and slowed the slow ones; Slurm ran j1's worker steps only on
  # n2 and, while j1 ran, j0's only on n1.
  cat > "$work/r.toml" <<TOML
[types.fast]
memory_mib = 1024
[types.slow]
memory_mib = 1024
slowdown = 1.5
[[devices]]
type = "fast"
host = "n1"
[[devices]]
type = "slow"
host = "n2"
TOML
  # Bad input first: a host that is not a node of the allocation.
  sed 's/"n2"/"n7"/' "$work/r.toml" > "$work/bad.toml"
  rc=0
  salloc -N2 --ntasks-per-node=1 "$MORPH" cluster --slurm --resources "$work/bad.toml" --out "$work/bad" \
    > "$work/bad.log" 2>&1 || rc=$?
  grep -q 'host must name a node of the allocation (n1, n2)' "$work/bad.log" && [[ $rc == 2 ]] ||
    { echo "FAIL: a host outside the allocation was not refused with exit 2 (rc $rc)"; cat "$work/bad.log"; exit 1; }
  # And a node given more devices than the allocation's tasks there (1 each).
  printf '[[devices]]\ntype = "slow"\nhost = "n2"\n' | cat "$work/r.toml" - > "$work/bad2.toml"
  rc=0
  salloc -N2 --ntasks-per-node=1 "$MORPH" cluster --slurm --resources "$work/bad2.toml" --out "$work/bad2" \
    > "$work/bad2.log" 2>&1 || rc=$?
  grep -q 'node n2 has 2 devices, but the allocation gives it 1 task(s)' "$work/bad2.log" && [[ $rc == 2 ]] ||
    { echo "FAIL: more devices than tasks on a node was not refused with exit 2 (rc $rc)"; cat "$work/bad2.log"; exit 1; }

  salloc -N2 --ntasks-per-node=1 "$MORPH" cluster --slurm --policy wfs --resources "$work/r.toml" --out "$work/c" \
    > "$work/c.log" 2>&1 &
  salloc_pid=$!
  for _ in $(seq 1 300); do [[ -s "$work/c/address" ]] && break; sleep 0.1; done
  [[ -s "$work/c/address" ]] || { echo "FAIL: morph cluster --slurm --resources did not start"; cat "$work/c.log"; exit 1; }
  export MORPH_TOKEN=$(cat "$work/c/token")
  addr=$(cat "$work/c/address")
  "$MORPH" submit --cluster "$addr" "$work/j0.toml" --demand 2 > /dev/null
  python3 - "$MORPH" "$addr" "$work" <<'PY'
import json, os, re, subprocess, sys, time, urllib.request
morph, addr, work = sys.argv[1:4]
log = lambda: open(work + "/c.log").read()

def queue():
    rq = urllib.request.Request(f"http://{addr}/queue", headers={"Authorization": "Bearer " + os.environ["MORPH_TOKEN"]})
    return json.load(urllib.request.urlopen(rq, timeout=10))

seen = []  # (j1 stepping and j0 on its fast slot only, before and after the squeue call; step name, node)
def poll_steps(q):
    on = lambda q: (len(q["jobs"]) > 1 and q["jobs"][1]["state"] == "running" and q["jobs"][1]["step"] > 0 and
                    q["jobs"][0]["slot_types"] == {"fast": 1})
    out = subprocess.run(["squeue", "-s", "-h", "-o", "%j %N"], capture_output=True, text=True).stdout
    j1_on = on(q) and on(queue())  # a grow of j0 back onto n2 once j1 ended may fall within the squeue call
    for line in out.splitlines():
        seen.append((j1_on, *line.split()))

def labels(job):
    return {int(w): n for w, n, t in re.findall(rf"morph: job {job}: worker ([0-9]+) on (n[0-9]) \(([a-z]+)\)", log())}

deadline = time.time() + 90
while True:  # j0 stepping, both its workers' nodes known
    q = queue(); poll_steps(q)
    if q["jobs"][0]["state"] == "running" and q["jobs"][0]["step"] > 0 and len(labels(0)) == 2:
        break
    assert time.time() < deadline, ("j0 did not start on both nodes", q, log())
    time.sleep(0.1)
assert q["jobs"][0]["slot_types"] == {"fast": 1, "slow": 1}, q
first = labels(0)
assert sorted(first.values()) == ["n1", "n2"], ("j0's workers are not labelled with one node each", first, log())
subprocess.run([morph, "submit", "--cluster", addr, work + "/j1.toml", "--demand", "1", "--priority", "5"],
               check=True, capture_output=True)
# From j0's slots before j1 came (checked above): the scheduler may shrink
# j0 before the first poll below sees it.
types = {0: [q["jobs"][0]["slot_types"]], 1: []}
deadline = time.time() + 180
while True:
    q = queue(); poll_steps(q)
    for i, j in enumerate(q["jobs"]):
        if not types[i] or types[i][-1] != j["slot_types"]:
            types[i].append(j["slot_types"])
    for t in ("fast", "slow"):
        assert sum(j["slot_types"].get(t, 0) for j in q["jobs"]) <= 1, ("a slot type held twice", q)
    if all(j["state"] in ("done", "failed", "cancelled") for j in q["jobs"]):
        break
    assert time.time() < deadline, ("jobs did not finish", q, log())
    time.sleep(0.2)
for i, j in enumerate(q["jobs"]):
    ref = json.load(open(f"{work}/ref{i}/summary.json"))["model_hash"]
    assert j["state"] == "done", (j, open(os.path.join(j["dir"], "log")).read())
    assert j["model_hash"] == ref, (i, j["model_hash"], ref)
log0 = open(os.path.join(q["jobs"][0]["dir"], "log")).read()
released = re.findall(r"resize requested: 2 -> 1 workers, releasing worker\(s\) ([0-9]+)", log0)
slow_id = [w for w, n in first.items() if n == "n2"][0]
assert released and int(released[0]) == slow_id, ("j0 did not release its worker on n2", released, first, log0, log())
assert types[0][:2] == [{"fast": 1, "slow": 1}, {"fast": 1}], ("j0's slots over time", types)
assert {"slow": 1} in types[1] and all("fast" not in t for t in types[1]), ("j1's slots over time", types)
lab1 = labels(1)
assert list(lab1.values()) == ["n2"], ("j1's worker is not on n2", lab1, log())
# Every worker on the slow node was slowed to its type (morph slow), no other.
slowed = open(work + "/c/slow.log").read() if os.path.exists(work + "/c/slow.log") else ""  # none: nobody slowed
for job, lab in ((0, first), (1, lab1)):
    port = re.search(r"manager on port ([0-9]+)", open(os.path.join(q["jobs"][job]["dir"], "log")).read())[1]
    for w, n in lab.items():
        said = re.search(rf"asked worker {w} of the job at [^ ]+:{port} to run 1.5 times slower", slowed) is not None
        assert said == (n == "n2"), (job, w, n, slowed)
nodes = lambda name, during=None: {n for on, s, n in seen if s == name and (during is None or on == during)}
assert nodes("morph-1-worker") == {"n2"}, ("j1's worker steps", sorted(set(seen)))
assert nodes("morph-0-worker", True) <= {"n1"}, ("j0's worker steps while j1 ran", sorted(set(seen)))
assert nodes("morph-0-worker", False) >= {"n1", "n2"}, ("j0's worker steps", sorted(set(seen)))
margin = q["jobs"][0]["ended"] - q["jobs"][1]["ended"]
grown = re.findall(r"generation [0-9]+: request, 1 -> 2 workers", log0)
if margin > 15:
    assert grown and types[0][:3] == [{"fast": 1, "slow": 1}, {"fast": 1}, {"fast": 1, "slow": 1}], \
        ("j0 did not grow back onto n2 after j1", types, log0, log())
print(f"slurm typed: both hashes equal the standalone runs'; j0's workers {first}, released {released[0]}; "
      f"j1's {lab1}; j0's slots {types[0]}, j1's {types[1]}; grown back {bool(grown)} (outlived j1 by {margin:.1f} s)")
PY
  stop_cluster
  echo PASS
  exit 0
fi

salloc -N2 -n3 "$MORPH" cluster --slurm --policy wfs --out "$work/c" > "$work/c.log" 2>&1 &
salloc_pid=$!
for _ in $(seq 1 300); do [[ -s "$work/c/address" ]] && break; sleep 0.1; done
[[ -s "$work/c/address" ]] || { echo "FAIL: morph cluster --slurm did not start"; cat "$work/c.log"; exit 1; }
grep -q "3 slots" "$work/c.log" || { echo "FAIL: slots are not the allocation's 3 tasks"; cat "$work/c.log"; exit 1; }
export MORPH_TOKEN=$(cat "$work/c/token")
addr=$(cat "$work/c/address")
"$MORPH" submit --cluster "$addr" "$work/j0.toml" --demand 2 > /dev/null

python3 - "$MORPH" "$addr" "$work" <<'PY'
import json, os, re, subprocess, sys, time, urllib.request
morph, addr, work = sys.argv[1:4]

def queue():  # the scheduler's HTTP API directly: a `morph queue` process per poll would load the cores
    rq = urllib.request.Request(f"http://{addr}/queue", headers={"Authorization": "Bearer " + os.environ["MORPH_TOKEN"]})
    return json.load(urllib.request.urlopen(rq, timeout=10))

steps = set()
def poll_steps():
    out = subprocess.run(["squeue", "-s", "-h", "-o", "%j %N"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        steps.add(tuple(line.split()))

deadline = time.time() + 90
while True:
    q = queue(); poll_steps()
    j0 = q["jobs"][0]
    if j0["state"] == "running" and j0["step"] > 0:
        break
    assert time.time() < deadline, ("j0 did not start", q, open(work + "/c.log").read())
    time.sleep(0.1)
subprocess.run([morph, "submit", "--cluster", addr, work + "/j1.toml", "--demand", "2", "--priority", "5"],
               check=True, capture_output=True)
deadline = time.time() + 180
while True:
    q = queue(); poll_steps()
    assert sum(j["workers"] for j in q["jobs"]) <= 3, q
    if all(j["state"] in ("done", "failed", "cancelled") for j in q["jobs"]):
        break
    assert time.time() < deadline, ("jobs did not finish", q, open(work + "/c.log").read())
    time.sleep(0.2)
# morph queue --json agrees with the API.
assert json.loads(subprocess.run([morph, "queue", "--cluster", addr, "--json"], check=True, capture_output=True,
                                 text=True).stdout)["jobs"] == q["jobs"]
for i, j in enumerate(q["jobs"]):
    ref = json.load(open(f"{work}/ref{i}/summary.json"))["model_hash"]
    assert j["state"] == "done", (j, open(os.path.join(j["dir"], "log")).read())
    assert j["model_hash"] == ref, (i, j["model_hash"], ref)
log0 = open(os.path.join(q["jobs"][0]["dir"], "log")).read()
gens = re.findall(r"generation [0-9]+: request, ([0-9]+) -> ([0-9]+) workers", log0)
assert ("2", "1") in gens, ("j0 was not shrunk while it ran", log0)
# j0 outlived j1: it grows back, a new worker step first, the resize once
# that worker has registered (a few seconds: srun, libtorch, the data).
margin = q["jobs"][0]["ended"] - q["jobs"][1]["ended"]
workers0 = [f for f in os.listdir(q["jobs"][0]["dir"]) if f.startswith("worker-")]
if margin > 1:
    assert len(workers0) >= 3, ("no worker step started for j0's grow", workers0, open(work + "/c.log").read())
if margin > 15:
    assert ("1", "2") in gens, ("j0 did not grow back after j1", log0, open(work + "/c.log").read())
names = {n for n, _ in steps}
nodes = {node for n, node in steps if n.endswith("-worker")}
assert {"morph-0-manager", "morph-0-worker", "morph-1-manager", "morph-1-worker"} <= names, steps
assert nodes >= {"n1", "n2"}, ("worker steps not on both nodes", steps)
print(f"slurm: both hashes equal the standalone runs'; j0 resized {gens} ({len(workers0)} worker steps, "
      f"outlived j1 by {margin:.1f} s); steps seen {sorted(steps)}")
PY
stop_cluster
echo PASS
