#!/usr/bin/env bash
# morph cluster --slurm inside a real Slurm allocation (docs/cluster.md):
# the test configures and starts munged, slurmctld and two slurmd (nodes n1
# and n2 on this machine), takes a 3-task allocation of both nodes with
# salloc and runs `morph cluster --slurm --policy wfs` in it. Two jobs: j0
# (demand 2) runs first; j1 (priority 5, demand 2) arrives while it runs, so
# wfs shrinks j0 to 1 worker and starts j1; when j1 ends j0 grows again
# (new worker steps, then the resize). Checks: both hashes equal the
# standalone runs', j0 was resized while it ran, its managers and workers
# ran as Slurm job steps on both nodes. Needs root and Debian's slurmctld,
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
STEPS=300 mlp_job "$work/j1.toml" j1 2
for i in 0 1; do "$MORPH" run "$work/j$i.toml" --out "$work/ref$i" --quiet --status off > /dev/null; done

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
for p in $(pgrep -P "$salloc_pid" || true); do kill -TERM "$p"; done
wait "$salloc_pid" || true
salloc_pid=""
grep -q "cluster stopped" "$work/c.log" || { echo "FAIL: the cluster did not stop cleanly"; cat "$work/c.log"; exit 1; }
echo PASS
