#!/usr/bin/env bash
# model.name = "torchscript" (tests/cli/torchscript_models.py writes the
# modules with python3-torch): an MLP with dropout and a CNN with top-level
# batch norms and a residual block give the same model_hash on 1, 2 and 3
# workers and on 2 pipeline stages with each schedule (the CNN also when
# resumed from a checkpoint on another worker count); dropout is live in
# training; one float-mode step (SGD with momentum on the CNN, AdamW on an
# mse regression) matches PyTorch's own step within 1e-6 relative; bad
# model files exit 2 naming the file and the problem; morph run --export
# and morph export give files PyTorch loads.
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
make_work
# Debian's python3-torch lives with the system python, not with a python3
# that another environment may put first on PATH.
PY=${MORPH_PYTHON:-/usr/bin/python3}
"$PY" -c "import torch" 2>/dev/null || { echo "FAIL: $PY cannot import torch (apt-get install python3-torch)"; exit 1; }
models="$(dirname "$0")/torchscript_models.py"
"$PY" "$models" write "$work"

# job FILE MODEL [EXTRA TOML]: 3 steps of 20 synthetic samples in 4 VNs.
job() {
  cat > "$1" <<TOML
[job]
name = "ts"
seed = 5
steps = ${STEPS:-3}
[data]
dataset = "synthetic"
train_size = 60
test_size = 20
[model]
name = "torchscript"
path = "$2"
[batch]
global = 20
virtual_nodes = 4
[optim]
lr = 0.05
momentum = 0.9
${3:-}
TOML
}

hash_of() { "$MORPH" run "$@" --quiet | tail -n 1; }
declare -A hashes

for m in mlp cnn; do
  job "$work/$m.toml" "$m.pt"  # relative: the job file's folder
  ref=$(hash_of "$work/$m.toml" --out "$work/$m-1")
  [[ "$ref" == model_hash:* ]] || { echo "FAIL: $m: no hash: $ref"; exit 1; }
  for w in 2 3; do
    got=$(hash_of "$work/$m.toml" --workers $w --out "$work/$m-w$w")
    [[ "$got" == "$ref" ]] || { echo "FAIL: $m on $w workers: $got, 1 worker: $ref"; exit 1; }
  done
  for s in gpipe 1f1b varuna; do
    got=$(hash_of "$work/$m.toml" --stages 2 --schedule $s --out "$work/$m-$s")
    [[ "$got" == "$ref" ]] || { echo "FAIL: $m on 2 stages ($s): $got, 1 worker: $ref"; exit 1; }
  done
  hashes[$m]=$ref
  if [[ $m == cnn ]]; then
    # Checkpoints and resume: 2 steps, then the third on 2 workers.
    STEPS=2 job "$work/$m-2.toml" "$m.pt" "[checkpoint]
every = 1"
    "$MORPH" run "$work/$m-2.toml" --quiet --out "$work/$m-ck" > /dev/null
    got=$(hash_of "$work/$m.toml" --resume "$work/$m-ck/checkpoints" --workers 2 --out "$work/$m-resumed")
    [[ "$got" == "$ref" ]] || { echo "FAIL: $m resumed from step 2 on 2 workers: $got, uninterrupted: $ref"; exit 1; }
  fi
  echo "ok: $m: $ref on 1-3 workers and 2 stages (gpipe, 1f1b, varuna)"
done

# model.path is relative to the job file's folder, not to where `morph run`
# starts (docs/job_file.md, "Paths"); --out is relative to the latter.
mkdir -p "$work/elsewhere/deeper"
got=$(cd "$work/elsewhere/deeper" && hash_of ../../mlp.toml --workers 2 --out out)
[[ "$got" == "${hashes[mlp]}" ]] || { echo "FAIL: mlp from another working directory: $got, ${hashes[mlp]}"; exit 1; }
[[ -f "$work/elsewhere/deeper/out/summary.json" ]] || { echo "FAIL: --out is not relative to the working directory"; exit 1; }

# Dropout draws in training: the same weights without it train differently.
job "$work/nodrop.toml" "mlp_nodrop.pt"
nodrop=$(hash_of "$work/nodrop.toml" --out "$work/nodrop")
[[ "$nodrop" != "${hashes[mlp]}" ]] || { echo "FAIL: dropout had no effect in training"; exit 1; }
# ...and none in evaluation: the test loss is the same in one process and
# through two pipeline stages (other processes, other generator states).
loss1=$(grep -o '"test_loss": [^,]*' "$work/mlp-1/summary.json")
loss2=$(grep -o '"test_loss": [^,]*' "$work/mlp-gpipe/summary.json")
[[ -n "$loss1" && "$loss1" == "$loss2" ]] || { echo "FAIL: test loss $loss1 in one process, $loss2 on 2 stages"; exit 1; }

# One float-mode step against PyTorch's: the whole 32-sample set is one VN.
ref_job() {  # FILE MODEL X Y LOSS OPTIM LR
  local optim="momentum = 0.9
weight_decay = 1e-4"
  [[ $6 == adamw ]] && optim="weight_decay = 0.01"
  cat > "$1" <<TOML
[job]
name = "ref"
seed = 1
steps = 1
[data]
dataset = "npy"
train_x = "$3"
train_y = "$4"
test_x = "$3"
test_y = "$4"
[model]
name = "torchscript"
path = "$2"
loss = "$5"
[batch]
global = 32
virtual_nodes = 1
[optim]
name = "$6"
lr = $7
$optim
[reduce]
mode = "float"
[checkpoint]
every = 1
TOML
}
check_step() {  # MODEL X Y LOSS OPTIM LR
  ref_job "$work/ref.toml" "$work/$1" "$work/$2" "$work/$3" "$4" "$5" "$6"
  "$MORPH" run "$work/ref.toml" --quiet --out "$work/ref-$1" > /dev/null
  "$PY" "$models" reference "$work/$1" "$work/$2" "$work/$3" "$4" "$5" "$6" \
    "$work/ref-$1/checkpoints/step-000000000001"
}
check_step cnn.pt img_x.npy img_y.npy cross_entropy sgd 0.1
check_step reg.pt reg_x.npy reg_y.npy mse adamw 0.01
grep -q '"test_loss"' "$work/ref-reg.pt/summary.json" || { echo "FAIL: an mse job reports no test_loss"; exit 1; }
if grep -q '"test_accuracy"' "$work/ref-reg.pt/summary.json"; then echo "FAIL: an mse job reports test_accuracy"; exit 1; fi

for bad in "missing.pt:is missing" "notscript.pt:not a TorchScript module file" \
           "statedict.pt:not a TorchScript module file" "empty.pt:has no parameters to train" \
           "nomomentum.pt:batch norm 'layer3.bn' (BatchNorm2d) has momentum=None" \
           "notrack.pt:batch norm 'layer3.bn' (BatchNorm2d) has track_running_stats=False" \
           "twoin.pt:forward takes 2 inputs" \
           "wrongout.pt:does not fit the cross_entropy loss"; do
  job "$work/bad.toml" "${bad%%:*}"
  expect_bad "$work/bad.toml" "${bad#*:}" "$work/${bad%%:*}"
done
ref_job "$work/bad.toml" "$work/reg.pt" "$work/reg_x.npy" "$work/reg_y2.npy" mse sgd 0.01
expect_bad "$work/bad.toml" "does not fit the mse loss" "$work/reg.pt"
ref_job "$work/bad.toml" "$work/reg.pt" "$work/reg_x.npy" "$work/img_y.npy" mse sgd 0.01
expect_bad "$work/bad.toml" "expects float32 targets" "$work/img_y.npy"
# Export (docs/models.md): the CNN trained in exact mode on 4 VNs comes back
# to PyTorch with torch.jit.load and evaluates as Morph did; a 2-stage run's
# checkpoint (layer files from both stages) exports to the same tensors.
ref_job "$work/exp.toml" "$work/cnn.pt" "$work/img_x.npy" "$work/img_y.npy" cross_entropy sgd 0.1
sed -i 's/^steps = 1/steps = 3/; s/^global = 32/global = 16/; s/^virtual_nodes = 1/virtual_nodes = 4/; s/^mode = "float"/mode = "exact"/' "$work/exp.toml"
"$MORPH" run "$work/exp.toml" --quiet --out "$work/exp" --export "$work/exp.pt" > /dev/null
"$PY" "$models" exported "$work/exp.pt" "$work/img_x.npy" "$work/img_y.npy" "$work/exp/summary.json"
"$MORPH" run "$work/exp.toml" --quiet --out "$work/exp-s2" --stages 2 > /dev/null
"$MORPH" export "$work/exp-s2/checkpoints" --job "$work/exp.toml" --out "$work/exp-s2.pt" > /dev/null
"$PY" "$models" same "$work/exp.pt" "$work/exp-s2.pt"
# A built-in model: a torch.load-able dict of the checkpoint's tensors.
cat > "$work/mlp-exp.toml" <<TOML
[job]
name = "mlpexp"
seed = 2
steps = 2
[data]
dataset = "npy"
train_x = "img_x.npy"
train_y = "img_y.npy"
test_x = "img_x.npy"
test_y = "img_y.npy"
[model]
name = "mlp"
hidden = [16]
[batch]
global = 16
virtual_nodes = 2
TOML
"$MORPH" run "$work/mlp-exp.toml" --quiet --out "$work/mlp-exp" --export "$work/mlp-exp.pth" > /dev/null
"$PY" "$models" exported-dict "$work/mlp-exp.pth" "$work/mlp-exp/checkpoints/step-000000000002"
# A checkpoint of another job is refused.
set +e
"$MORPH" export "$work/exp/checkpoints" --job "$work/mlp-exp.toml" --out "$work/wrong.pt" > /dev/null 2> "$work/bad.err"
rc=$?
set -e
[[ $rc == 2 ]] && grep -q "a checkpoint of job 'ref/torchscript/1', not of this job" "$work/bad.err" ||
  { echo "FAIL: morph export of another job's checkpoint: exit $rc"; cat "$work/bad.err"; exit 1; }
echo "ok: export: torch.jit.load evaluates as Morph did; a 2-stage checkpoint exports the same; built-in dict"

echo "PASS: TorchScript MLP and CNN: same hash on 1-3 workers and 2 stages; one step matches PyTorch; bad files exit 2"
