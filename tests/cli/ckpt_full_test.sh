#!/usr/bin/env bash
# A full disk while checkpointing (a 32 KiB tmpfs in a private mount
# namespace as the checkpoint folder: the marker fits, no checkpoint does).
# Training goes on and ends with the single-process model; each failure is
# reported on stderr and in metrics.jsonl (`checkpoint_error`). With
# checkpoint.max_failures = 2 the job stops with exit 3 naming the cause,
# in one process and with workers (not regrouping without rank 0 until no
# worker is left). Needs root and util-linux's unshare.
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
make_work
STEPS=8 mlp_job "$work/job.toml" ckfull 5 $'[checkpoint]\nevery = 2'

ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)
[[ "$ref" == model_hash:* ]] || { echo "FAIL: no reference hash: $ref"; exit 1; }

unshare -m bash -s "$MORPH" "$work" "$ref" <<'INNER'
set -euo pipefail
MORPH=$1 work=$2 ref=$3
mkdir -p "$work/full"
mount -t tmpfs -o size=32k tmpfs "$work/full"
# run_full OUT MAX_FAILURES [--workers N]: the job into the full folder; sets rc.
run_full() {
  set +e
  "$MORPH" run "$work/job.toml" --quiet ${3:+$3 $4} --checkpoint-dir "$work/full/ck" \
    --set checkpoint.max_failures=$2 --out "$work/$1" > "$work/$1.out" 2> "$work/$1.err"
  rc=$?
  set -e
}
for workers in "" "--workers 2"; do
  tag=w${workers##* }
  run_full "$tag" 100 $workers
  [[ $rc == 0 ]] || { echo "FAIL ($tag): exit $rc"; cat "$work/$tag.err"; exit 1; }
  got=$(tail -n 1 "$work/$tag.out")
  [[ "$got" == "$ref" ]] || { echo "FAIL ($tag): $got vs $ref"; exit 1; }
  grep -q "morph: warning: checkpoint of step" "$work/$tag.err" || { echo "FAIL ($tag): no warning"; cat "$work/$tag.err"; exit 1; }
  grep -q '"checkpoint_error"' "$work/$tag/metrics.jsonl" || { echo "FAIL ($tag): no checkpoint_error in metrics"; exit 1; }
  ! ls -d "$work/full/ck"/step-* > /dev/null 2>&1 || { echo "FAIL ($tag): a checkpoint fitted in 32 KiB?"; exit 1; }

  run_full "$tag-stop" 2 $workers
  [[ $rc == 3 ]] || { echo "FAIL ($tag): max_failures = 2 gave exit $rc"; cat "$work/$tag-stop.err"; exit 1; }
  grep -q "checkpoint.max_failures = 2" "$work/$tag-stop.err" || { echo "FAIL ($tag): cause not named"; cat "$work/$tag-stop.err"; exit 1; }
  if [[ -n "$workers" ]]; then
    ! grep -q "generation 1" "$work/$tag-stop.out" "$work/$tag-stop.err" || { echo "FAIL ($tag): regrouped"; cat "$work/$tag-stop.err"; exit 1; }
  fi
done
INNER
echo "PASS"
