#!/usr/bin/env bash
# dataset = "npy": Fashion-MNIST exported to .npy (tests/cli/npy_export.py)
# trains to the same model_hash as the IDX job (the IDX job in one process,
# the npy job on 2 workers), also from another working directory with a
# worker in a third (paths relative to the job file's folder, outputs to the
# working directory) and resumed there; bad .npy files exit 2 naming the
# file and the problem.
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
make_work
idx=/usr/share/datasets/fashion-mnist
python3 "$(dirname "$0")/npy_export.py" "$idx" "$work"

# job FILE DATA_TOML: a small CNN, 6 steps of 32 samples in 4 VNs.
job() {
  cat > "$1" <<TOML
[job]
name = "npy"
seed = 3
steps = 6
[data]
$2
[model]
name = "cnn"
channels = [4, 8]
fc = 16
[batch]
global = 32
virtual_nodes = 4
[optim]
lr = 0.05
momentum = 0.9
TOML
}
job "$work/idx.toml" 'dataset = "fashion-mnist"'
npy_data="dataset = \"npy\"
train_x = \"$work/train_x.npy\"
train_y = \"$work/train_y.npy\"
test_x = \"$work/test_x.npy\"
test_y = \"$work/test_y.npy\"
mean = 0.2860
std = 0.3530"
job "$work/npy.toml" "$npy_data"

ref=$("$MORPH" run "$work/idx.toml" --quiet --out "$work/ref" | tail -n 1)
[[ "$ref" == model_hash:* ]] || { echo "FAIL: no reference hash: $ref"; exit 1; }
"$MORPH" run "$work/npy.toml" --quiet --workers 2 --out "$work/npy2" > "$work/npy2.log"
got=$(tail -n 1 "$work/npy2.log")
[[ "$got" == "$ref" ]] || { echo "FAIL: npy on 2 workers: $got, IDX: $ref"; exit 1; }
if grep -q "data:" "$work/npy2.log"; then echo "FAIL: --quiet, yet progress:"; cat "$work/npy2.log"; exit 1; fi
acc_idx=$(grep -o '"test_accuracy":[^,}]*' "$work/ref/summary.json")
acc_npy=$(grep -o '"test_accuracy":[^,}]*' "$work/npy2/summary.json")
[[ "$acc_idx" == "$acc_npy" ]] || { echo "FAIL: test accuracy $acc_npy vs $acc_idx"; exit 1; }

# Paths (docs/job_file.md): the npy files relative to the job file's
# folder, checkpoint.dir and --out relative to where `morph run` starts.
# The job runs from another folder, with its second worker started in a
# third; then it resumes in one process from its checkpoint.
# (Neither folder is a sibling of the job's, so no path resolves by chance.)
mkdir -p "$work/jobs" "$work/run/here" "$work/far/far/away"
job "$work/jobs/rel.toml" "${npy_data//$work\//../}
[checkpoint]
every = 4
dir = \"ck\""
grep -q 'train_x = "../train_x.npy"' "$work/jobs/rel.toml" || { echo "FAIL: test set-up"; cat "$work/jobs/rel.toml"; exit 1; }
(cd "$work/run/here" && exec "$MORPH" run ../../jobs/rel.toml --workers 2 --spawn 1 --out out > run.log 2> run.err) &
runner=$!
port=$(manager_port "$work/run/here/run.log")
set +e
(cd "$work/far/far/away" && exec timeout 120 "$MORPH" worker --join "127.0.0.1:$port" --token-file ../../../run/here/out/token \
  > worker.log 2>&1)
wrc=$?
wait $runner
rc=$?
set -e
[[ $wrc == 0 && $rc == 0 ]] || { echo "FAIL: paths: worker exit $wrc, run exit $rc"; cat "$work/run/here/run.log" "$work/run/here/run.err" "$work/far/far/away/worker.log"; exit 1; }
[[ $(tail -n 1 "$work/run/here/run.log") == "$ref" ]] || { echo "FAIL: paths: $(tail -n 1 "$work/run/here/run.log"), IDX: $ref"; exit 1; }
grep -q '"workers": 2' "$work/run/here/out/summary.json" || { echo "FAIL: paths: not 2 workers at the end"; cat "$work/run/here/out/summary.json"; exit 1; }
[[ -d "$work/run/here/ck/step-000000000004" && ! -e "$work/jobs/ck" ]] || { echo "FAIL: checkpoint.dir is not relative to the working directory"; exit 1; }
# Worker 0 (whichever registered first) says what it loaded.
cat "$work/run/here/run.log" "$work/far/far/away/worker.log" |
  grep -q "worker 0: data: npy: 60000 train + 10000 test samples of 1x28x28, memory-mapped" ||
  { echo "FAIL: no data line"; cat "$work/run/here/run.log" "$work/far/far/away/worker.log"; exit 1; }
(cd "$work/run/here" && "$MORPH" run ../../jobs/rel.toml --resume ck --out resumed > resume.log)
log=$work/run/here/resume.log
[[ $(tail -n 1 "$log") == "$ref" ]] || { echo "FAIL: resumed: $(tail -n 1 "$log"), IDX: $ref"; cat "$log"; exit 1; }
grep -q "^morph: data: npy: 60000 train" "$log" && grep -q "^morph: loading checkpoint .*ck/step-000000000004 ([0-9.]* MB) \.\.\.$" "$log" &&
  grep -q "^morph: resuming from .*ck/step-000000000004 at step 4 ([0-9.]* MB loaded in [0-9.]* s)$" "$log" ||
  { echo "FAIL: resume progress"; cat "$log"; exit 1; }
echo "ok: paths from the job file's folder, outputs from the working directory; progress lines"

# expect_bad NAME PATTERN: the npy job with $work/bad/NAME (named ROLE.CASE,
# ROLE one of train_x, train_y, test_x, test_y) in place of ROLE's file
# exits 2, and its message names the file and matches PATTERN.
mkdir -p "$work/bad"
expect_bad() {
  local file=$work/bad/$1
  job "$work/bad.toml" "${npy_data//$work\/${1%%.*}.npy/$file}"
  set +e
  "$MORPH" run "$work/bad.toml" --quiet --out "$work/badout" > /dev/null 2> "$work/bad.err"
  local rc=$?
  set -e
  [[ $rc == 2 ]] || { echo "FAIL ($1): exit $rc, expected 2"; cat "$work/bad.err"; exit 1; }
  grep -q "$file" "$work/bad.err" || { echo "FAIL ($1): message does not name the file"; cat "$work/bad.err"; exit 1; }
  grep -q "$2" "$work/bad.err" || { echo "FAIL ($1): message lacks '$2'"; cat "$work/bad.err"; exit 1; }
}
head -c 1000 "$work/train_x.npy" > "$work/bad/train_x.trunc"
expect_bad train_x.trunc "truncated"
echo "not numpy" > "$work/bad/test_x.magic"
expect_bad test_x.magic "not a NumPy .npy file"
python3 - "$work/bad" <<'PY'
import struct, sys
def npy(path, descr, shape, payload):
    dims = ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "")
    head = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    head += " " * (63 - (10 + len(head)) % 64) + "\n"
    open(path, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode() + payload)
d = sys.argv[1]
npy(d + "/train_x.f64", "<f8", (2, 28, 28), bytes(2 * 784 * 8))             # dtype
npy(d + "/train_y.count", "<i8", (3,), struct.pack("<3q", 0, 1, 2))          # 3 labels, 60000 samples
npy(d + "/test_y.range", "<i8", (10000,), struct.pack("<q", 10) * 10000)     # label 10 of classes 0..9
npy(d + "/test_x.shape", "|u1", (10000, 27, 28), bytes(10000 * 27 * 28))     # sample shape
npy(d + "/train_y.neg", "<i8", (60000,), struct.pack("<q", -1) * 60000)      # negative label
PY
expect_bad train_x.f64 "dtype '<f8' is not supported"
expect_bad train_y.count "holds 3 labels"
expect_bad test_y.range "label 10 is outside"
expect_bad test_x.shape "do not match"
expect_bad train_y.neg "negative label"
rm "$work/test_y.npy"
job "$work/bad.toml" "$npy_data"
set +e; "$MORPH" run "$work/bad.toml" --quiet > /dev/null 2> "$work/bad.err"; rc=$?; set -e
[[ $rc == 2 ]] && grep -q "test_y.npy is missing" "$work/bad.err" || { echo "FAIL (missing): exit $rc"; cat "$work/bad.err"; exit 1; }
echo "PASS: npy hash $got equals IDX; bad files exit 2 naming the file"
