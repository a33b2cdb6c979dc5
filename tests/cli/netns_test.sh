#!/usr/bin/env bash
# Two hosts on one machine: network namespaces joined by a veth pair. The
# manager and one worker run in host A, a second worker joins from host B
# across the veth link; the model must equal the single-process run's.
# Needs root and iproute2 (CI runs as root).
set -euo pipefail
MORPH=$1
tag=$$
nsa=morph_a_$tag nsb=morph_b_$tag
va=mva$tag vb=mvb$tag
work=$(mktemp -d)
cleanup() {
  [[ -n "${mpid:-}" ]] && kill "$mpid" 2>/dev/null || true
  ip netns pids "$nsa" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns pids "$nsb" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$nsa" 2>/dev/null || true
  ip netns del "$nsb" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$nsa"
ip netns add "$nsb"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$nsa"
ip link set "$vb" netns "$nsb"
ip -n "$nsa" addr add 10.200.$((tag % 200)).1/24 dev "$va"
ip -n "$nsb" addr add 10.200.$((tag % 200)).2/24 dev "$vb"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
ip -n "$nsa" link set "$va" up
ip -n "$nsb" link set "$vb" up
host_a=10.200.$((tag % 200)).1

cat > "$work/job.toml" <<'TOML'
[job]
name = "netns"
seed = 9
steps = 4
[data]
dataset = "synthetic"
train_size = 256
test_size = 32
[model]
name = "cnn"
channels = [4, 8]
fc = 16
[batch]
global = 40
virtual_nodes = 5
[optim]
lr = 0.05
momentum = 0.9
TOML

managerPort() {  # managerPort LOG: the port the manager printed, waiting up to 10 s
  local p=""
  for _ in $(seq 1 200); do
    p=$(sed -n 's/.*manager on port \([0-9]*\).*/\1/p' "$1")
    [[ -n "$p" ]] && { echo "$p"; return 0; }
    sleep 0.05
  done
  echo "manager did not start" >&2; cat "$1" >&2; return 1
}

ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)

ip netns exec "$nsa" "$MORPH" run "$work/job.toml" --quiet --workers 2 --spawn 1 --host "$host_a" \
  --out "$work/two" > "$work/manager.log" 2>&1 &
mpid=$!
port=$(managerPort "$work/manager.log")
# The remote worker proves the job's token (OUT/token of the manager).
ip netns exec "$nsb" "$MORPH" worker --join "$host_a:$port" --token-file "$work/two/token" > "$work/worker.log" 2>&1
wait "$mpid"
mpid=""
got=$(tail -n 1 "$work/manager.log")
rx=$(ip -n "$nsb" -s link show "$vb" | awk '/RX:/{getline; print $1}')
echo "single process: $ref"
echo "two hosts:      $got (host B received $rx bytes over $vb)"
[[ "$got" == "$ref" ]] || { echo "FAIL: hashes differ"; cat "$work/manager.log" "$work/worker.log"; exit 1; }
# 4 steps of int64 gradients of a ~7k-parameter model (56 KB a step) crossed the link.
((rx > 100000)) || { echo "FAIL: too little traffic crossed the veth link"; exit 1; }

# A host lost: the worker in host B is killed; the manager notices the silence
# of its heartbeats (1 s), host A's worker carries on alone, same model.
sed -i 's/^steps = 4$/steps = 400/' "$work/job.toml"
ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref2" | tail -n 1)
ip netns exec "$nsa" "$MORPH" run "$work/job.toml" --quiet --workers 2 --spawn 1 --host "$host_a" \
  --heartbeat-timeout 1 --out "$work/lost" > "$work/manager2.log" 2>&1 &
mpid=$!
port=$(managerPort "$work/manager2.log")
MORPH_TOKEN=$(cat "$work/lost/token") ip netns exec "$nsb" "$MORPH" worker --join "$host_a:$port" \
  > "$work/worker2.log" 2>&1 &
bpid=$!
for _ in $(seq 1 600); do
  [[ -f "$work/lost/metrics.jsonl" ]] && (( $(wc -l < "$work/lost/metrics.jsonl") >= 20 )) && break
  sleep 0.1
done
kill -9 "$bpid"
wait "$mpid"
mpid=""
got=$(tail -n 1 "$work/manager2.log")
echo "host B lost mid-run: $got (single process: $ref)"
[[ "$got" == "$ref" ]] || { echo "FAIL: hashes differ after losing host B"; cat "$work/manager2.log"; exit 1; }
grep -q "missed its heartbeats\|was killed\|exited" "$work/manager2.log" || { echo "FAIL: loss not reported"; cat "$work/manager2.log"; exit 1; }
grep -q '"cause": "failure"' "$work/lost/summary.json" || { echo "FAIL: no failure resize"; exit 1; }
echo "netns test passed"
