#!/usr/bin/env bash
# A network partition between workers (docs/distributed.md, "Partitions"):
# three hosts made of network namespaces. The manager runs in host M; hosts
# X and Y each reach M over a link of their own, and M routes between them.
# Workers keep reaching the manager when M stops forwarding, but X and Y no
# longer reach each other.
#  1. Two workers, one in X and one in Y: at step 50 M stops forwarding. The
#     job commits steps again within 2 x the collective deadline with one
#     worker; after healing the other rejoins; the model is the single
#     process's.
#  2. Three workers, two in X and one in Y: the two in X go on, the one in
#     Y rejoins after healing; the model is the single process's.
# Needs root and iproute2 (CI runs as root).
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
tag=$$
nsm=morph_pm_$tag nsx=morph_px_$tag nsy=morph_py_$tag
work=$(mktemp -d)
cleanup() {
  for ns in "$nsm" "$nsx" "$nsy"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

n=$((tag % 200))
for ns in "$nsm" "$nsx" "$nsy"; do
  ip netns add "$ns"
  ip -n "$ns" link set lo up
done
ip link add "pmx$tag" type veth peer name "pxm$tag"
ip link add "pmy$tag" type veth peer name "pym$tag"
ip link set "pmx$tag" netns "$nsm"
ip link set "pmy$tag" netns "$nsm"
ip link set "pxm$tag" netns "$nsx"
ip link set "pym$tag" netns "$nsy"
ip -n "$nsm" addr add "10.210.$n.1/24" dev "pmx$tag"
ip -n "$nsm" addr add "10.211.$n.1/24" dev "pmy$tag"
ip -n "$nsx" addr add "10.210.$n.2/24" dev "pxm$tag"
ip -n "$nsy" addr add "10.211.$n.2/24" dev "pym$tag"
ip -n "$nsm" link set "pmx$tag" up
ip -n "$nsm" link set "pmy$tag" up
ip -n "$nsx" link set "pxm$tag" up
ip -n "$nsy" link set "pym$tag" up
ip -n "$nsx" route add default via "10.210.$n.1"
ip -n "$nsy" route add default via "10.211.$n.1"
forward() { ip netns exec "$nsm" sysctl -q -w "net.ipv4.ip_forward=$1"; }
forward 1
host_m=10.210.$n.1  # M's own address: reached from Y too, forwarding or not

DEADLINE=4  # elastic.collective_timeout
STEPS=400 mlp_job "$work/job.toml" partition 5 $'[elastic]\ncollective_timeout = '"$DEADLINE"$'\nstraggler_replan = false'
ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)

wait_for() {  # wait_for DESCRIPTION LOG COMMAND...: poll up to 90 s
  local what=$1 log=$2; shift 2
  for _ in $(seq 1 900); do
    if "$@" > /dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "FAIL: timed out waiting for: $what"; cat "$log" "$work"/w*.log; exit 1
}
lines() { [[ -f "$1/metrics.jsonl" ]] && (( $(wc -l < "$1/metrics.jsonl") >= $2 )); }
in_log() { grep -q "$2" "$1"; }

# run_case NAME HOSTS...: one worker per host (X or Y); partition at step
# 50, heal 40 s... once the survivors committed 30 more steps.
run_case() {
  local name=$1; shift
  local out=$work/$name log=$work/$name.log
  ip netns exec "$nsm" "$MORPH" run "$work/job.toml" --workers $# --spawn 0 --host "$host_m" --out "$out" \
    > "$log" 2>&1 &
  local mpid=$!
  wait_for "the manager" "$log" in_log "$log" "manager on port"
  local port
  port=$(sed -n 's/.*manager on port \([0-9]*\).*/\1/p' "$log")
  # Paced: each worker emulates a device 40x slower (timing only). Workers
  # start one at a time and each is slowed once registered, before the next
  # starts: the job begins when the last registers, already paced by the
  # others (a step waits for every member), so it cannot run ahead of the
  # pacing however long `morph slow` takes to start.
  slow() { ip netns exec "$nsm" "$MORPH" slow --join "$host_m:$port" --worker "$1" --factor 40 --token-file "$out/token"; }
  local i=0 h
  for h in "$@"; do
    local ns=$nsx
    [[ $h == Y ]] && ns=$nsy
    ip netns exec "$ns" "$MORPH" worker --join "$host_m:$port" --token-file "$out/token" > "$work/w$name$i.log" 2>&1 &
    wait_for "worker $i to register" "$log" slow "$i"
    i=$((i + 1))
  done
  wait_for "step 50" "$log" lines "$out" 50
  forward 0
  local cut_at committed
  cut_at=$(date +%s.%N)
  committed=$(wc -l < "$out/metrics.jsonl")
  wait_for "the partition to be found" "$log" in_log "$log" "partition in generation"
  wait_for "30 steps after the partition" "$log" lines "$out" $((committed + 30))
  forward 1
  local heal_at
  heal_at=$(date +%s.%N)
  wait_for "the rejoin" "$log" in_log "$log" "reaches every member of generation"
  wait "$mpid" || { echo "FAIL: the manager failed"; cat "$log" "$work"/w$name*.log; exit 1; }
  local got
  got=$(tail -n 1 "$log")
  echo "$name: single process $ref, partitioned $got"
  [[ "$got" == "$ref" ]] || { echo "FAIL: $name: hashes differ"; cat "$log"; exit 1; }
  # The first step of the generation after the partition, against the
  # moment forwarding stopped; the resizes: partition, then join.
  python3 - "$out" "$cut_at" "$DEADLINE" "$#" "$heal_at" <<'PY' || { echo "FAIL: $name"; cat "$log" "$work"/w$name*.log; exit 1; }
import json, sys
out, cut_at, deadline, workers = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
heal_at = float(sys.argv[5])
s = json.load(open(out + "/summary.json"))
causes = [r["cause"] for r in s["resizes"]]
assert causes == ["partition", "join"], causes
part, join = s["resizes"]
assert (part["from"], part["to"]) == (workers, workers - 1), part
assert (join["from"], join["to"]) == (workers - 1, workers), join
lines = [json.loads(l) for l in open(out + "/metrics.jsonl")]
first = min(l["unix_time"] for l in lines if l["unix_time"] > cut_at and l["generation"] >= 1)
gap = first - cut_at
last_gen = max(l["generation"] for l in lines)
rejoin = min(l["unix_time"] for l in lines if l["generation"] == last_gen) - heal_at
print(f"first step after the partition: {gap:.2f} s (deadline {deadline:.0f} s); "
      f"first step with every worker after healing: {rejoin:.2f} s")
assert gap < 2 * deadline, f"{gap:.2f} s is not within 2 x the collective deadline"
assert len(lines) == 400 and sorted(l["step"] for l in lines) == list(range(400)), "metrics lines"
PY
}

# PARTITION_CASES picks cases (bench/partition_bench.sh runs "two" again and again).
for c in ${PARTITION_CASES:-two three}; do
  case $c in
    two) run_case two X Y ;;
    three) run_case three X X Y ;;
    *) echo "partition_test: no case '$c'"; exit 1 ;;
  esac
done
