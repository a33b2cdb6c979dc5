#!/usr/bin/env bash
# The 32-bit exact format (reduce.bits = 32, issue 31; docs/exact_reduction.md,
# "The 32-bit format"): the hash checks of the 64-bit format, in one script.
# - An MLP with redos (headroom_bits = 0, 12 VNs): the single process's hash
#   and redos on 1-4 workers in 256-byte buckets over both exact wires, in
#   a pipeline of 2 stages x 2 replicas, and differing from the 64-bit hash.
# - gpt-mini (tied head) and the CNN (batch norm), buckets_test.sh's jobs:
#   3 sharded workers and 2 stages x 2 in small buckets.
# - Resume: a checkpoint of step 4 resumed on 2 workers ends with the
#   uninterrupted hash; resumed in the other format it exits 2 naming
#   reduce.bits (both ways).
# - A live `morph resize` 2 -> 3 -> 2: the undisturbed hash.
# - reduce.bits other than 32 or 64 exits 2 naming the key.
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
make_work
[[ -n "${KEEP_WORK:-}" ]] && trap - EXIT && echo "work: $work"
B32="--set reduce.bits=32"

cat > "$work/mlp.toml" <<'TOML'
[job]
name = "exact32"
seed = 5
steps = 6
[data]
dataset = "synthetic"
train_size = 300
test_size = 40
[model]
name = "mlp"
hidden = [24]
[batch]
global = 96
virtual_nodes = 12
[optim]
lr = 0.05
momentum = 0.9
[reduce]
headroom_bits = 0
[checkpoint]
every = 2
TOML

attempts() { grep -o '"attempts":[0-9]*' "$1/metrics.jsonl" | cut -d: -f2 | tr '\n' ' '; }
fail=0
check() {  # check WHAT GOT WANT
  if [[ "$2" == "$3" ]]; then echo "ok   $1: $2"; else echo "FAIL $1: got '$2', want '$3'"; fail=1; fi
}

# shellcheck disable=SC2086
want=$("$MORPH" run "$work/mlp.toml" --quiet $B32 --out "$work/ref" | tail -n 1)
want_attempts=$(attempts "$work/ref")
echo "mlp single process, 32-bit: $want, attempts $want_attempts"
[[ "$want_attempts" == *2* ]] || { echo "FAIL: no step was redone (the test needs redos)"; fail=1; }
h64=$("$MORPH" run "$work/mlp.toml" --quiet --out "$work/ref64" | tail -n 1)
[[ "$h64" != "$want" ]] || { echo "FAIL: reduce.bits = 32 gives the 64-bit hash (the key has no effect)"; fail=1; }

export MORPH_BUCKET_BYTES=256
for case in "allreduce --workers 1" "allreduce --workers 3" "allreduce --stages 2 --workers 4" \
            "sharded --workers 2" "sharded --workers 4" "sharded --stages 2 --workers 4"; do
  wire=${case%% *}
  spec=${case#* }
  o="$work/mlp-$wire-${spec// /_}"
  # shellcheck disable=SC2086
  got=$(MORPH_EXACT_WIRE=$wire "$MORPH" run "$work/mlp.toml" --quiet $B32 $spec --out "$o" 2>&1 | tail -n 1)
  check "mlp $spec, $wire" "$got" "$want"
  check "mlp $spec, $wire, redos" "$(attempts "$o")" "$want_attempts"
  if [[ "$case" == "sharded --workers 2" ]]; then o_sharded2=$o; fi
done
# The wire sends 4 bytes per value: the sharded 2-worker run's reduced bytes
# are about half the 64-bit run's (the slots ride in 16-bit lanes).
b32=$(grep -o '"reduced_bytes":[0-9]*' "$o_sharded2/metrics.jsonl" | tail -n 1 | cut -d: -f2)
# shellcheck disable=SC2086
MORPH_EXACT_WIRE=sharded "$MORPH" run "$work/mlp.toml" --quiet --workers 2 --out "$work/mlp64-w2" > /dev/null
b64=$(grep -o '"reduced_bytes":[0-9]*' "$work/mlp64-w2/metrics.jsonl" | tail -n 1 | cut -d: -f2)
echo "reduced bytes per step, sharded, 2 workers: 32-bit $b32, 64-bit $b64"
(( b32 * 10 < b64 * 6 )) || { echo "FAIL: the 32-bit wire does not send about half the 64-bit bytes"; fail=1; }

# Tied weights and batch norm (buckets_test.sh's jobs, small buckets).
sed -n '/^cat > "\$work\/gpt.toml"/,/^TOML$/p;/^cat > "\$work\/cnn.toml"/,/^TOML$/p' \
  "$(dirname "$0")/buckets_test.sh" > "$work/jobs.sh"
# shellcheck disable=SC1091
source "$work/jobs.sh"
for model in gpt cnn; do
  unset MORPH_BUCKET_BYTES
  # shellcheck disable=SC2086
  ref=$("$MORPH" run "$work/$model.toml" --quiet $B32 --out "$work/$model-ref" | tail -n 1)
  ref_attempts=$(attempts "$work/$model-ref")
  for spec in "--workers 3" "--stages 2 --workers 4"; do
    o="$work/$model-${spec// /_}"
    # shellcheck disable=SC2086
    got=$(MORPH_BUCKET_BYTES=256 MORPH_EXACT_WIRE=sharded "$MORPH" run "$work/$model.toml" --quiet $B32 $spec \
          --out "$o" 2>&1 | tail -n 1)
    check "$model $spec, 256-byte buckets" "$got" "$ref"
    check "$model $spec, redos" "$(attempts "$o")" "$ref_attempts"
  done
done

# Resume: step 4's checkpoint of a 4-step run, continued to step 6 on 2
# workers; then refused in the other format.
# shellcheck disable=SC2086
"$MORPH" run "$work/mlp.toml" --quiet $B32 --steps 4 --out "$work/part" > /dev/null
# shellcheck disable=SC2086
got=$("$MORPH" run "$work/mlp.toml" --quiet $B32 --workers 2 --resume "$work/part/checkpoints" \
      --out "$work/resumed" 2>&1 | tail -n 1)
check "resumed on 2 workers" "$got" "$want"
refused() {  # refused WHAT WANT_TEXT ARGS...
  local what=$1 text=$2 rc=0
  shift 2
  "$MORPH" run "$@" > "$work/refused.log" 2>&1 || rc=$?
  if (( rc == 2 )) && grep -qF "$text" "$work/refused.log"; then
    echo "ok   $what: exit 2, '$text'"
  else
    echo "FAIL $what: exit $rc, expected 2 and '$text'"; cat "$work/refused.log"; fail=1
  fi
}
refused "32-bit checkpoint, 64-bit run" "reduce.bits (checkpoint 32, now 64)" \
  "$work/mlp.toml" --quiet --resume "$work/part/checkpoints" --out "$work/x1"
"$MORPH" run "$work/mlp.toml" --quiet --steps 2 --out "$work/part64" > /dev/null
# shellcheck disable=SC2086
refused "64-bit checkpoint, 32-bit run" "reduce.bits (checkpoint 64, now 32)" \
  "$work/mlp.toml" --quiet $B32 --resume "$work/part64/checkpoints" --out "$work/x2"
refused "reduce.bits = 48" "reduce.bits" "$work/mlp.toml" --quiet --set reduce.bits=48 --out "$work/x3"
refused "reduce.bits = 16" "reduce.bits" "$work/mlp.toml" --quiet --set reduce.bits=16 --out "$work/x4"

# A live resize 2 -> 3 -> 2 (elastic_test.sh's): the undisturbed hash.
elastic_mlp_job "$work/rs.toml" exact32-resize 4 600 $'[reduce]\nbits = 32'
rs_ref=$("$MORPH" run "$work/rs.toml" --quiet --out "$work/rs-ref" | tail -n 1)
"$MORPH" run "$work/rs.toml" --quiet --workers 2 --out "$work/rs" > "$work/rs.log" 2>&1 &
mpid=$!
port=$(manager_port "$work/rs.log")
wait_for() {  # wait_for DESCRIPTION COMMAND...: poll up to 60 s
  local what=$1; shift
  for _ in $(seq 1 600); do
    if "$@" > /dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "FAIL: timed out waiting for: $what"; cat "$work/rs.log"; exit 1
}
rs_workers() { tail -n 1 "$work/rs/metrics.jsonl" 2>/dev/null | grep -q "\"workers\":$1[,}]"; }
rs_lines() { [[ -f "$work/rs/metrics.jsonl" ]] && (( $(wc -l < "$work/rs/metrics.jsonl") >= $1 )); }
slow() { "$MORPH" slow --join "127.0.0.1:$port" --worker "$1" --factor "$2" --token-file "$work/rs/token" > /dev/null; }
wait_for "the resize job to train" rs_lines 1
slow 0 40 || echo "note: morph slow 0 failed"; slow 1 40 || echo "note: morph slow 1 failed"  # the job must outlast the new worker's start
"$MORPH" resize --join "127.0.0.1:$port" --workers 3 --token-file "$work/rs/token"
wait_for "the job to grow to 3 workers" rs_workers 3
"$MORPH" resize --join "127.0.0.1:$port" --workers 2 --token-file "$work/rs/token"
wait_for "the job to shrink to 2 workers" rs_workers 2
slow 0 1 || true; slow 1 1 || true
wait "$mpid"
got=$(tail -n 1 "$work/rs.log")
check "resized 2 -> 3 -> 2" "$got" "$rs_ref"
grep -q '"workers":3' "$work/rs/metrics.jsonl" || { echo "FAIL: 3 workers never trained"; fail=1; }

((fail == 0)) || exit 1
echo "exact32 test passed"
