#!/usr/bin/env bash
# Soak: random SIGKILLs, joins and graceful leaves on an MLP job for
# DURATION seconds (default 300), keeping 2..4 workers; then the job runs
# to its end and its model_hash is compared with the undisturbed
# single-process run of the same job.
#   bash bench/soak.sh [DURATION] [build/morph]
set -euo pipefail
duration=${1:-300}
MORPH=$(readlink -f "${2:-$(dirname "$0")/../build/morph}")
work=$(mktemp -d)
trap 'pkill -9 -f "morph worker --join 127.0.0.1:${port:-none}" 2>/dev/null || true; rm -rf "$work"' EXIT
# Roughly as long as the soak (about 10 ms a step with 3-4 workers on 2
# cores); the soak stops early if the job ends first.
steps=$(( duration * 100 + 500 ))
cat > "$work/job.toml" <<TOML
[job]
name = "soak"
seed = 11
steps = $steps
[data]
dataset = "synthetic"
train_size = 1000
test_size = 100
[model]
name = "mlp"
hidden = [64, 32]
[batch]
global = 48
virtual_nodes = 12
[optim]
lr = 0.01
momentum = 0.9
TOML
"$MORPH" run "$work/job.toml" --quiet --workers 3 --out "$work/soak" > "$work/manager.log" 2>&1 &
# (worker processes started here are the soak's own; silence bash's job reports)
set +m
mpid=$!
for _ in $(seq 1 100); do grep -q "manager on port" "$work/manager.log" && break; sleep 0.1; done
port=$(sed -n 's/.*manager on port \([0-9]*\).*/\1/p' "$work/manager.log")
end=$(( $(date +%s) + duration ))
kills=0 joins=0 leaves=0
while (( $(date +%s) < end )) && kill -0 "$mpid" 2>/dev/null; do
  sleep "$(( RANDOM % 4 + 1 ))"
  mapfile -t pids < <(pgrep -f "^$MORPH worker --join 127.0.0.1:$port" || true)
  n=${#pids[@]}
  r=$(( RANDOM % 3 ))
  if (( r == 0 && n > 2 )); then kill -9 "${pids[RANDOM % n]}"; kills=$((kills + 1))
  elif (( r == 1 && n > 2 )); then kill -TERM "${pids[RANDOM % n]}"; leaves=$((leaves + 1))
  elif (( n < 4 )); then "$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/soak/token" > /dev/null 2>&1 & joins=$((joins + 1))
  fi
done
echo "soak: $kills kills, $leaves leaves, $joins joins in ${duration} s; letting the job finish ($steps steps)"
set +e
wait "$mpid"
rc=$?
set -e
if (( rc != 0 )); then echo "soak: the job failed (exit code $rc):"; tail -n 30 "$work/manager.log"; exit 1; fi
got=$(tail -n 1 "$work/manager.log")
resizes=$(grep -c "first step committed" "$work/manager.log" || true)
ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)
echo "resizes survived: $resizes"
echo "soak run:        $got"
echo "single process:  $ref"
[[ "$got" == "$ref" ]] && echo "soak: hashes match" || { echo "soak: HASHES DIFFER"; exit 1; }
