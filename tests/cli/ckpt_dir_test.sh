#!/usr/bin/env bash
# Where checkpoints live (docs/job_file.md, "Checkpoints"): --checkpoint-dir
# puts them in the folder named, and a resume from there gives the
# single-process model; a worker that cannot see that folder (here: a
# private mount namespace with an empty tmpfs over it, as a host without the
# shared folder) exits 2 naming it. Needs root and util-linux's unshare.
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
make_work
mlp_job "$work/job.toml" ckdir 11 $'[checkpoint]\nevery = 2'

ref=$("$MORPH" run "$work/job.toml" --quiet --out "$work/ref" | tail -n 1)
# Checkpoints in the folder named, none in the run folder.
got=$("$MORPH" run "$work/job.toml" --quiet --workers 2 --checkpoint-dir "$work/shared/ck" --out "$work/two" | tail -n 1)
[[ "$got" == "$ref" ]] || { echo "FAIL: $got vs $ref"; exit 1; }
ls -d "$work/shared/ck"/step-* > /dev/null || { echo "FAIL: no checkpoint in $work/shared/ck"; exit 1; }
[[ ! -e "$work/two/checkpoints" ]] || { echo "FAIL: checkpoints also in the run folder"; exit 1; }
[[ -f "$work/shared/ck/.morph-job" ]] || { echo "FAIL: no marker"; exit 1; }
# Resume from the folder named: the same model.
got=$("$MORPH" run "$work/job.toml" --quiet --resume "$work/shared/ck" --out "$work/resumed" | tail -n 1)
[[ "$got" == "$ref" ]] || { echo "FAIL: resumed $got vs $ref"; exit 1; }

# A worker that does not see the folder.
"$MORPH" run "$work/job.toml" --quiet --workers 1 --spawn 0 --checkpoint-dir "$work/shared/ck2" \
  --out "$work/blind" > "$work/manager.log" 2>&1 &
port=$(manager_port "$work/manager.log")
set +e
unshare -m sh -c "mount -t tmpfs tmpfs '$work/shared' && exec '$MORPH' worker --join 127.0.0.1:$port --token-file '$work/blind/token'" \
  > "$work/worker.log" 2>&1
rc=$?
set -e
[[ $rc -eq 2 ]] || { echo "FAIL: blind worker exited $rc, expected 2"; cat "$work/worker.log"; exit 1; }
grep -q "checkpoint folder $work/shared/ck2: this worker does not see" "$work/worker.log" ||
  { echo "FAIL: message does not name the folder"; cat "$work/worker.log"; exit 1; }
echo "checkpoint folder test passed"
