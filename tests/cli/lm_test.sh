#!/usr/bin/env bash
# A GPT-style language model (tests/cli/lm_models.py: nn.Embedding, three
# nn.TransformerEncoderLayer blocks, a head tied to the embedding and a
# feed-forward weight shared by blocks 0 and 2), scripted with
# torch.jit.script, trained on token data (int64 (N, T) inputs and labels
# from the fortunes text; per-position cross-entropy): the same model_hash
# on 1 and 2 workers and on 2, 3 and 4 pipeline stages (the shared weights
# on stages {0, 1}; {0, 2} and {1, 2}; {0, 3} and {1, 3}) and 2 stages x 2
# replicas; 5 steps of SGD with momentum and of AdamW match PyTorch's
# eager training within 1e-5 relative; the exported module loads in
# PyTorch with its ties and its test loss is Morph's.
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
make_work
PY=${MORPH_PYTHON:-/usr/bin/python3}
models="$(dirname "$0")/lm_models.py"
"$PY" "$models" write "$work" 2> /dev/null

# job FILE STEPS GLOBAL VNS [EXTRA TOML]
job() {
  cat > "$1" <<TOML
[job]
name = "lm"
seed = 5
steps = $2
[data]
dataset = "npy"
train_x = "lm_x.npy"
train_y = "lm_y.npy"
test_x = "lm_tx.npy"
test_y = "lm_ty.npy"
[model]
name = "torchscript"
path = "lm.pt"
[batch]
global = $3
virtual_nodes = $4
[optim]
lr = 0.05
momentum = 0.9
weight_decay = 1e-4
${5:-}
TOML
}
hash_of() { "$MORPH" run "$@" --quiet | tail -n 1; }

# Exact mode, 3 steps of 16 sequences in 4 VNs.
job "$work/lm.toml" 3 16 4
ref=$(hash_of "$work/lm.toml" --out "$work/w1")
[[ "$ref" == model_hash:* ]] || { echo "FAIL: no hash: $ref"; exit 1; }
for run in "--workers 2" "--stages 2" "--stages 4 --schedule varuna" "--workers 4 --stages 2"; do
  got=$(hash_of "$work/lm.toml" $run --out "$work/run")
  [[ "$got" == "$ref" ]] || { echo "FAIL: LM with $run: $got, 1 worker: $ref"; exit 1; }
done
# 3 stages (gpipe), writing checkpoints and exporting the model; its step-1
# checkpoint (layer files from 3 stages) resumed on 2 stages (varuna).
got=$(hash_of "$work/lm.toml" --stages 3 --schedule gpipe --out "$work/exp" --export "$work/exp.pt" \
      --set checkpoint.every=1)
[[ "$got" == "$ref" ]] || { echo "FAIL: LM with --stages 3 --schedule gpipe: $got, 1 worker: $ref"; exit 1; }
mkdir -p "$work/ck1"
cp -r "$work/exp/checkpoints/step-000000000001" "$work/ck1/"
got=$(hash_of "$work/lm.toml" --resume "$work/ck1" --stages 2 --schedule varuna --out "$work/res")
[[ "$got" == "$ref" ]] || { echo "FAIL: LM resumed from 3 stages on 2 (varuna): $got, uninterrupted: $ref"; exit 1; }
echo "ok: LM: $ref on 1 and 2 workers, 2 (1f1b), 3 (gpipe) and 4 (varuna) stages, 2 stages x 2 replicas," \
  "resumed from 3 stages on 2 (varuna)"

# Parity with PyTorch: 5 steps of the whole set (32 sequences) as one VN,
# float mode, against PyTorch's optimiser on the scripted module.
for opt in sgd adamw; do
  job "$work/ref-$opt.toml" 5 32 1 '[reduce]
mode = "float"
[checkpoint]
every = 5'
  sed -i "s/^lr = .*/lr = 0.01/" "$work/ref-$opt.toml"
  [[ $opt == adamw ]] && sed -i 's/^momentum = .*/name = "adamw"/; s/^weight_decay = .*/weight_decay = 0.01/' "$work/ref-$opt.toml"
  "$MORPH" run "$work/ref-$opt.toml" --quiet --out "$work/ref-$opt" > /dev/null
  "$PY" "$models" reference "$work/lm.pt" "$work/lm_x.npy" "$work/lm_y.npy" $opt 0.01 \
    "$work/ref-$opt/checkpoints/step-000000000005" 5 1e-5
done

# Export: the 3-stage run's model back to PyTorch, ties kept, its test loss Morph's.
"$PY" "$models" exported "$work/exp.pt" "$work/lm_tx.npy" "$work/lm_ty.npy" "$work/exp/summary.json"
# Bad token data exits 2 naming the file: labels that are not one per
# position; a token id the embedding does not have (the model file and layer).
job "$work/bad.toml" 1 16 4
sed -i 's/^train_y = .*/train_y = "lm_y1.npy"/' "$work/bad.toml"
expect_bad "$work/bad.toml" "expected int64 labels of the same shape" "$work/lm_y1.npy"
job "$work/bad.toml" 1 16 4
sed -i 's/^test_x = .*/test_x = "lm_xbig.npy"/' "$work/bad.toml"
expect_bad "$work/bad.toml" "the layer '.*' fails on an input of shape (2, 16) (token ids.*300" "$work/lm.pt"
echo "ok: bad token data exits 2"
echo "PASS: GPT-style LM with tied weights: same hash on 1-2 workers and 2-4 stages; 5 steps match PyTorch's; export"
