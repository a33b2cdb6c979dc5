#!/usr/bin/env python3
"""A GPT-style language model, its token data and PyTorch's reference
training for tests/cli/lm_test.sh (needs python3-torch).

  lm_models.py write DIR
      writes lm.pt: a character-level LM from nn.Embedding, three
      nn.TransformerEncoderLayer blocks (batch_first, dropout 0, a causal
      mask) and a head tied to the embedding, as GPT-2 does; block 2's
      feed-forward input weight is also tied to block 0's (cross-layer
      sharing, as ALBERT does), so that on 3 or 4 pipeline stages one
      weight is shared by two middle stages. Scripted with torch.jit.script.
      Token data from Debian's fortunes text (the files the fortunes-gpt
      example reads): lm_x.npy / lm_y.npy (32 windows of 16 bytes and the
      byte after each) and lm_tx.npy / lm_ty.npy (16 more); bad data:
      lm_y1.npy (one label per sequence), lm_xbig.npy (a token id 300).
  lm_models.py reference MODEL.pt X.npy Y.npy OPTIM LR CKPT STEPS TOL
      runs STEPS steps of PyTorch's own optimiser (OPTIM "sgd": momentum
      0.9, weight decay 1e-4; "adamw": weight decay 0.01) on the whole of
      X, Y as one batch (cross-entropy, the mean over every position), with
      the graph executor's optimisations off (eager's arithmetic), and
      compares every parameter with Morph's checkpoint of that step (CKPT,
      a step-... folder), each shared weight once; exit 1 when one differs
      by more than TOL relative and by more than 4x PyTorch's own spread
      (the same training on the batch permuted): AdamW's normalised step
      turns the rounding noise of a gradient that is zero in exact
      arithmetic (an attention's key bias: softmax ignores a shift of
      every key by the same vector) into steps of +-lr, in PyTorch as in
      Morph.
  lm_models.py exported FILE X.npy Y.npy SUMMARY
      loads an exported model (morph run --export) with torch.jit.load,
      checks that its ties survived, and that its test loss on X, Y
      (evaluation mode) is the test_loss in Morph's summary.json.
"""
import glob
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchscript_models import differences, morph_state, within_spread  # noqa: E402

VOCAB, DIM, HEADS, FF, SEQ = 256, 32, 4, 64, 16


class Block(nn.Module):
    """An nn.TransformerEncoderLayer under a causal mask made from its input."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(DIM, HEADS, FF, dropout=0.0, batch_first=True)

    def forward(self, x):
        t = x.size(1)
        mask = torch.triu(torch.full([t, t], float("-inf")), diagonal=1)
        return self.layer(x, src_mask=mask)


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied, as GPT-2's
        self.blocks[2].layer.linear1.weight = self.blocks[0].layer.linear1.weight  # cross-layer sharing

    def forward(self, x):
        h = self.embed(x) + self.pos[: x.size(1)]
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def fortunes_bytes():
    files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*")
                   if os.path.isfile(f) and not f.endswith((".dat", ".u8")))
    if not files:
        sys.exit("FAIL: no fortunes text in /usr/share/games/fortunes (apt-get install fortunes)")
    text = b"".join(open(f, "rb").read() for f in files)
    return np.frombuffer(text, dtype=np.uint8).astype(np.int64)


def windows(data, first, n):
    x = np.stack([data[(first + i) * SEQ: (first + i + 1) * SEQ] for i in range(n)])
    y = np.stack([data[(first + i) * SEQ + 1: (first + i + 1) * SEQ + 1] for i in range(n)])
    return x, y


def write(d):
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(27)
    torch.jit.save(torch.jit.script(LM()), f"{d}/lm.pt")
    data = fortunes_bytes()
    x, y = windows(data, 0, 32)
    tx, ty = windows(data, 32, 16)
    big = tx.copy()
    big[3, 5] = 300  # beyond the embedding's 256 ids
    for name, a in [("lm_x", x), ("lm_y", y), ("lm_tx", tx), ("lm_ty", ty), ("lm_y1", y[:, 0].copy()),
                    ("lm_xbig", big)]:
        np.save(f"{d}/{name}.npy", a)


def unique_state(model):
    """state_dict() with each shared tensor under its first name only (as
    Morph's checkpoint holds it)."""
    seen, out = set(), {}
    for k, v in model.state_dict(keep_vars=True).items():
        if id(v) in seen:
            continue
        seen.add(id(v))
        out[k] = v.detach()
    return out


def pytorch_training(model_path, x, y, optim, lr, steps):
    """The state after STEPS steps of PyTorch's optimiser on X, Y as one batch."""
    model = torch.jit.load(model_path)
    model.train()
    params = list(model.parameters())  # each shared weight once
    if optim == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    for _ in range(steps):
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return unique_state(model)


def reference(model_path, x_path, y_path, optim, lr, ckpt, steps, tol):
    torch.set_num_threads(1)
    torch._C._set_graph_executor_optimize(False)
    x = torch.from_numpy(np.load(x_path))
    y = torch.from_numpy(np.load(y_path))
    want = pytorch_training(model_path, x, y, optim, lr, steps)
    got = morph_state(ckpt)
    if sorted(want) != sorted(got):
        print(f"FAIL: tensors differ: PyTorch {sorted(want)}, Morph {sorted(got)}")
        return 1
    initial = unique_state(torch.jit.load(model_path))
    if all(torch.equal(got[k], initial[k]) for k in want):
        print("FAIL: Morph's checkpoint holds the initial weights")
        return 1
    errs = differences(got, want)
    worst = max(errs, key=errs.get)
    print(f"{model_path} {optim}, {steps} steps: max relative difference {errs[worst]:.3g} ({worst}) over "
          f"{len(want)} tensors")
    if errs[worst] <= tol:
        return 0
    # Per tensor, PyTorch against itself with the batch in another order
    # (other summation orders, the same mathematics) sets the bar where it
    # is above TOL.
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1))
    spread = differences(pytorch_training(model_path, x[perm], y[perm], optim, lr, steps), want)
    return within_spread(errs, spread, tol)


def exported(path, x_path, y_path, summary_path):
    torch.set_num_threads(1)
    model = torch.jit.load(path)
    model.eval()
    sd = model.state_dict(keep_vars=True)
    if any(sd[a].data_ptr() != sd[b].data_ptr() for a, b in
           [("head.weight", "embed.weight"), ("blocks.2.layer.linear1.weight", "blocks.0.layer.linear1.weight")]):
        print(f"FAIL: {path}: the shared weights are no longer one tensor")
        return 1
    x = torch.from_numpy(np.load(x_path))
    y = torch.from_numpy(np.load(y_path))
    with torch.no_grad():
        out = model(x)
    loss = F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1)).item()
    s = json.load(open(summary_path))
    print(f"{path}: test loss {loss:.9g} (Morph {s['test_loss']:.9g})")
    if abs(loss - s["test_loss"]) > 1e-5 * abs(s["test_loss"]):
        print("FAIL: the exported model does not evaluate as Morph's did")
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    elif sys.argv[1] == "reference":
        a = sys.argv[2:]
        sys.exit(reference(a[0], a[1], a[2], a[3], float(a[4]), a[5], int(a[6]), float(a[7])))
    elif sys.argv[1] == "exported":
        sys.exit(exported(*sys.argv[2:6]))
    else:
        sys.exit(__doc__)
