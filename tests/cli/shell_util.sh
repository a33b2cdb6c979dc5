# Helpers of the shell tests (source it): a scratch folder removed on exit
# with every process started from it, a small MLP job, and the port of a
# manager from its log.

# Sets $work to a fresh folder; on exit kills what runs from it and removes it.
make_work() {
  work=$(mktemp -d)
  trap 'pkill -9 -f "$work/" 2>/dev/null || true; rm -rf "$work"' EXIT
}

# cluster_parts MORPH [PART [DIR]]: the arguments of the live cluster tests
# (cluster_live_test.sh, cluster_types_test.sh): sets MORPH, $part (refs,
# all, or one of $CLUSTER_LIVE_PARTS, default "live"; default all; else
# usage, exit 2), $work (a scratch folder),
# $refs (DIR, default $work/refs) and $cluster_pid (empty); on exit ends
# the cluster at $cluster_pid if one runs and removes $work (kept, and
# named, with KEEP=1).
cluster_parts() {
  MORPH=$1
  part=${2:-all}
  local live_parts=${CLUSTER_LIVE_PARTS:-live}
  [[ " refs $live_parts all " == *" $part "* ]] || { echo "usage: $0 MORPH [refs|${live_parts// /|}|all [DIR]]" >&2; exit 2; }
  work=$(mktemp -d)
  refs=${3:-$work/refs}
  cluster_pid=""
  trap cluster_parts_end EXIT
}
cluster_parts_end() {
  if [[ -n "$cluster_pid" ]]; then kill -TERM "$cluster_pid" 2>/dev/null || true; wait "$cluster_pid" 2>/dev/null || true; fi
  if [[ -n "${KEEP:-}" ]]; then echo "kept $work"; else rm -rf "$work"; fi
}

# mlp_job FILE NAME SEED [EXTRA TOML]: a 200-sample synthetic MLP job, 4 VNs
# ($STEPS steps, default 6; one hidden layer of $HIDDEN, default 16).
mlp_job() {
  cat > "$1" <<TOML
[job]
name = "$2"
seed = $3
steps = ${STEPS:-6}
[data]
dataset = "synthetic"
train_size = 200
test_size = 20
[model]
name = "mlp"
hidden = [${HIDDEN:-16}]
[batch]
global = 20
virtual_nodes = 4
[optim]
lr = 0.05
${4:-}
TOML
}

# manager_port LOG: waits (10 s at most) for "manager on port N" in LOG; prints N.
manager_port() {
  local p=""
  for _ in $(seq 1 200); do
    p=$(sed -n 's/.*manager on port \([0-9]*\).*/\1/p' "$1")
    [[ -n "$p" ]] && break
    sleep 0.05
  done
  [[ -n "$p" ]] || { echo "FAIL: the manager did not start" >&2; cat "$1" >&2; return 1; }
  echo "$p"
}

# expect_bad JOB PATTERN FILE: `morph run JOB` exits 2 and its message names
# FILE and matches PATTERN (uses $MORPH and $work).
expect_bad() {
  set +e
  "$MORPH" run "$1" --quiet --out "$work/badout" > /dev/null 2> "$work/bad.err"
  local rc=$?
  set -e
  [[ $rc == 2 ]] || { echo "FAIL ($2): exit $rc, expected 2"; cat "$work/bad.err"; exit 1; }
  grep -qF "$3" "$work/bad.err" || { echo "FAIL ($2): message does not name $3"; cat "$work/bad.err"; exit 1; }
  grep -q "$2" "$work/bad.err" || { echo "FAIL ($2): message lacks it"; cat "$work/bad.err"; exit 1; }
}

# elastic_mlp_job FILE NAME SEED STEPS [EXTRA TOML]: the 600-sample synthetic
# MLP job of the elastic tests (12 VNs, global batch 36), with straggler
# re-plans off so that only the membership changes a test makes (and
# timing noise on shared cores never) start generations.
elastic_mlp_job() {
  cat > "$1" <<TOML
[job]
name = "$2"
seed = $3
steps = $4
[data]
dataset = "synthetic"
train_size = 600
test_size = 60
[model]
name = "mlp"
hidden = [24]
[batch]
global = 36
virtual_nodes = 12
[optim]
lr = 0.02
momentum = 0.9
${5:-}
[elastic]
straggler_replan = false
TOML
}

# fast_and_slow SLOWDOWN FILE [MEMORY_MIB]: a resources file (docs/resources.md)
# of one device of type "fast" and one of type "slow", SLOWDOWN times slower,
# each with MEMORY_MIB (default 1024).
fast_and_slow() {
  local mib=${3:-1024}
  cat > "$2" <<TOML
[types.fast]
memory_mib = $mib
[types.slow]
memory_mib = $mib
slowdown = $1
[[devices]]
type = "fast"
count = 1
[[devices]]
type = "slow"
count = 1
TOML
}
