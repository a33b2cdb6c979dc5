#!/usr/bin/env bash
# dataset = "npy": Fashion-MNIST exported to .npy (tests/cli/npy_export.py)
# trains to the same model_hash as the IDX job (the IDX job in one process,
# the npy job on 2 workers); bad .npy files exit 2 naming the file and the
# problem.
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
got=$("$MORPH" run "$work/npy.toml" --quiet --workers 2 --out "$work/npy2" | tail -n 1)
[[ "$got" == "$ref" ]] || { echo "FAIL: npy on 2 workers: $got, IDX: $ref"; exit 1; }
acc_idx=$(grep -o '"test_accuracy":[^,}]*' "$work/ref/summary.json")
acc_npy=$(grep -o '"test_accuracy":[^,}]*' "$work/npy2/summary.json")
[[ "$acc_idx" == "$acc_npy" ]] || { echo "FAIL: test accuracy $acc_npy vs $acc_idx"; exit 1; }

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
