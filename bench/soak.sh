#!/usr/bin/env bash
# Soak: random SIGKILLs, joins and graceful leaves on an MLP job for
# DURATION seconds (default 300), keeping 2..4 workers; then the job runs
# to its end and its model_hash is compared with the undisturbed
# single-process run of the same job.
#
# Resource growth: one worker started with the job (the anchor) is never
# killed, so it lives through every regroup. The soak prints the RSS of
# every worker and the store's key count (`morph status`, store_keys) at
# the start and the end, and fails when
#   - the store holds more than KEY_BOUND keys at the end (default 200):
#     what a job needs is independent of its length and of the resizes so
#     far: ~20 job keys, <= 8 per live or recently departed worker, and two
#     generations' plans, reports and Gloo rendezvous keys (docs/
#     distributed.md, "Store keys"); a leak of one key per step or per
#     regroup passes it within seconds;
#   - the anchor's RSS grew by more than RSS_BOUND_MIB (default 64) — its
#     RSS after start-up is ~150 MiB; a leak per regroup (an undestroyed
#     process group, an abandoned gradient buffer) grows with the resizes.
#   bash bench/soak.sh [DURATION] [build/morph]
set -euo pipefail
duration=${1:-300}
MORPH=$(readlink -f "${2:-$(dirname "$0")/../build/morph}")
KEY_BOUND=${KEY_BOUND:-200}
RSS_BOUND_MIB=${RSS_BOUND_MIB:-64}
work=$(mktemp -d)
# Only the processes this script starts are ended: the manager (its spawned
# workers exit with it) and the joiners it started (never a name pattern:
# other jobs on this machine run the same binary).
mpid=""
joiners=()
cleanup() {
  local p
  for p in "${joiners[@]}" $mpid; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
# Longer than the soak (3-4 ms a step with 3-4 workers on the 2-core
# development machine, 2026-12-02; 10 ms on a slower one): the job must
# outlive the soak, or there is no key count and RSS at the end (the soak
# then says so and fails); what is left runs after the soak.
steps=$(( duration * 400 + 500 ))
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
# The job's live workers: the manager's children and the joiners still running.
workers() {
  local p
  { cat /proc/"$mpid"/task/*/children 2>/dev/null | tr ' ' '\n'
    for p in "${joiners[@]}"; do kill -0 "$p" 2>/dev/null && echo "$p"; done
  } | grep -E '^[0-9]+$' | sort -n || true
}
rss_mib() { awk '/^VmRSS/ {printf "%d", $2 / 1024}' "/proc/$1/status" 2>/dev/null || echo 0; }
store_keys() {
  # (nothing when the job has ended: its store is gone)
  { "$MORPH" status --join "127.0.0.1:$port" --token-file "$work/soak/token" 2>/dev/null || true; } |
    sed -n 's/.*"store_keys": \([0-9]*\).*/\1/p'
}
rss_all() { local p; for p in $(workers); do printf ' %s:%sMiB' "$p" "$(rss_mib "$p")"; done; }
# The start: generation 0 formed and trained a few seconds.
for _ in $(seq 1 600); do grep -q "generation 0" "$work/manager.log" && break; sleep 0.1; done
sleep 5
anchor=$(workers | head -n 1)
[[ -n "$anchor" ]] || { echo "soak: no worker started"; cat "$work/manager.log"; exit 1; }
keys_start=$(store_keys)
anchor_start=$(rss_mib "$anchor")
echo "soak start: store keys $keys_start; worker RSS (pid:RSS):$(rss_all); anchor $anchor"
end=$(( $(date +%s) + duration ))
kills=0 joins=0 leaves=0
while (( $(date +%s) < end )) && kill -0 "$mpid" 2>/dev/null; do
  sleep "$(( RANDOM % 4 + 1 ))"
  mapfile -t pids < <(workers | grep -vx "$anchor" || true)  # victims: all but the anchor
  n=$(( ${#pids[@]} + 1 ))
  r=$(( RANDOM % 3 ))
  if (( r == 0 && n > 2 )); then kill -9 "${pids[RANDOM % ${#pids[@]}]}"; kills=$((kills + 1))
  elif (( r == 1 && n > 2 )); then kill -TERM "${pids[RANDOM % ${#pids[@]}]}"; leaves=$((leaves + 1))
  elif (( n < 4 )); then
    "$MORPH" worker --join "127.0.0.1:$port" --token-file "$work/soak/token" > /dev/null 2>&1 &
    joiners+=("$!")
    disown  # no "Killed" report when the soak kills it
    joins=$((joins + 1))
  fi
done
if ! kill -0 "$mpid" 2>/dev/null; then
  echo "soak: the job ended $(( end - $(date +%s) )) s before the soak did: no count at the end (raise its steps)"
fi
keys_end=$(store_keys)
anchor_end=$(rss_mib "$anchor")
echo "soak end:   store keys $keys_end; worker RSS (pid:RSS):$(rss_all)"
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
echo "store keys:       $keys_start at the start, $keys_end at the end (bound $KEY_BOUND)"
echo "anchor RSS:       $anchor_start MiB at the start, $anchor_end MiB at the end (bound +$RSS_BOUND_MIB MiB)"
echo "soak run:        $got"
echo "single process:  $ref"
status=0
[[ "$got" == "$ref" ]] && echo "soak: hashes match" || { echo "soak: HASHES DIFFER"; status=1; }
[[ -n "$keys_end" ]] && (( keys_end <= KEY_BOUND )) || { echo "soak: THE STORE GREW ($keys_end keys)"; status=1; }
(( anchor_end > 0 && anchor_end <= anchor_start + RSS_BOUND_MIB )) || { echo "soak: THE ANCHOR'S RSS GREW"; status=1; }
exit $status
