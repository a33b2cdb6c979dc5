#!/usr/bin/env python3
"""TorchScript models, data and PyTorch's reference step for
tests/cli/torchscript_test.sh (needs python3-torch).

  torchscript_models.py write DIR
      writes the test's modules (*.pt), bad model files and .npy data to DIR.
  torchscript_models.py reference MODEL.pt X.npy Y.npy LOSS OPTIM LR CKPT
      runs one step of PyTorch's own optimiser (OPTIM "sgd": momentum 0.9,
      weight decay 1e-4; "adamw": weight decay 0.01) on the whole data set
      as one batch, and compares every parameter and buffer with Morph's
      checkpoint of step 1 in CKPT (a step-000000000001 folder); exit 1 when
      one differs by more than 1e-6 relative.
"""
import json
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class ReluPool(nn.Module):
    def forward(self, x):
        return F.max_pool2d(F.relu(x), 2)


class Residual(nn.Module):
    """A residual block as one child: x + conv(relu(conv(x)))."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return x + self.conv2(F.relu(self.conv1(x)))


def mlp(p):
    torch.manual_seed(1)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Dropout(p), nn.Linear(32, 10))


def cnn():
    """Top-level batch norms and a residual block (the cut points of a pipeline)."""
    torch.manual_seed(2)
    m = nn.Sequential()
    m.add_module("conv1", nn.Conv2d(1, 4, 3, padding=1, bias=False))
    m.add_module("bn1", nn.BatchNorm2d(4))
    m.add_module("act1", ReluPool())
    m.add_module("res", Residual(4))
    m.add_module("conv2", nn.Conv2d(4, 8, 3, padding=1, bias=False))
    m.add_module("bn2", nn.BatchNorm2d(8))
    m.add_module("act2", ReluPool())
    m.add_module("flatten", nn.Flatten())
    m.add_module("head", nn.Linear(8 * 7 * 7, 10))
    return m


def regression():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))


class Empty(nn.Module):
    def forward(self, x):
        return x


def save(module, path):
    torch.jit.save(torch.jit.script(module), path)


def write(d):
    os.makedirs(d, exist_ok=True)
    save(mlp(0.5), f"{d}/mlp.pt")
    save(mlp(0.0), f"{d}/mlp_nodrop.pt")  # the same weights without dropout
    save(cnn(), f"{d}/cnn.pt")
    save(regression(), f"{d}/reg.pt")
    # Bad model files.
    with open(f"{d}/notscript.pt", "w") as f:
        f.write("not a TorchScript file\n")
    torch.save(mlp(0.0).state_dict(), f"{d}/statedict.pt")  # a pickle, not TorchScript
    save(Empty(), f"{d}/empty.pt")
    torch.manual_seed(4)
    save(nn.Sequential(nn.Flatten(), nn.Linear(784, 5)), f"{d}/wrongout.pt")  # 5 < 10 classes
    torch.manual_seed(5)
    nested = nn.Sequential()
    nested.add_module("stem", nn.Conv2d(1, 4, 3, padding=1))
    nested.add_module("layer3", nn.Sequential())
    nested.layer3.add_module("conv", nn.Conv2d(4, 4, 3, padding=1))
    nested.layer3.add_module("bn", nn.BatchNorm2d(4))
    nested.add_module("flatten", nn.Flatten())
    nested.add_module("head", nn.Linear(4 * 28 * 28, 10))
    save(nested, f"{d}/nested.pt")
    torch.manual_seed(6)
    shared = nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 10))
    shared[3].weight = shared[2].weight  # tied
    save(shared, f"{d}/shared.pt")
    # Data: 32 samples, so that one step of a 32-sample global batch is the
    # whole set (any order: the mean is the same up to rounding).
    g = torch.Generator().manual_seed(6)
    x = torch.rand(32, 28, 28, generator=g).numpy().astype(np.float32)
    y = (np.arange(32) % 10).astype(np.int64)
    np.save(f"{d}/img_x.npy", x)
    np.save(f"{d}/img_y.npy", y)
    rx = torch.randn(32, 8, generator=g).numpy().astype(np.float32)
    ry = torch.randn(32, 3, generator=g).numpy().astype(np.float32)
    np.save(f"{d}/reg_x.npy", rx)
    np.save(f"{d}/reg_y.npy", ry)
    np.save(f"{d}/reg_y2.npy", ry[:, :2].copy())  # targets of the wrong width


DTYPES = {1: np.float32, 2: np.float64, 3: np.int64, 4: np.int32, 5: np.uint8}


def read_tensor_file(path):
    """docs/checkpoint_format.md, "Tensor file"."""
    b = open(path, "rb").read()
    assert b[:8] == b"MRPHTNS1", path
    (count,) = struct.unpack_from("<I", b, 12)
    off, out = 16, {}
    for _ in range(count):
        (n,) = struct.unpack_from("<I", b, off)
        name = b[off + 4 : off + 4 + n].decode()
        off += 4 + n
        dtype = b[off]
        (ndim,) = struct.unpack_from("<I", b, off + 1)
        dims = struct.unpack_from("<%dq" % ndim, b, off + 5)
        off += 5 + 8 * ndim
        (nbytes,) = struct.unpack_from("<Q", b, off)
        off += 8
        out[name] = np.frombuffer(b[off : off + nbytes], dtype=DTYPES[dtype]).reshape(dims)
        off += nbytes
    return out


def morph_state(ckpt):
    manifest = open(f"{ckpt}/MANIFEST").read()
    m = json.loads(manifest[: manifest.rindex("xxh64 ")])
    state = {}
    for layer in m["layers"]:
        for name, t in read_tensor_file(f"{ckpt}/{layer['file']}").items():
            kind, _, key = name.partition("/")
            if kind in ("param", "buffer"):
                state[layer["name"] + "." + key] = torch.from_numpy(t.copy())
    return state


def reference(model_path, x_path, y_path, loss, optim, lr, ckpt):
    torch.set_num_threads(1)
    model = torch.jit.load(model_path)
    model.train()
    x = torch.from_numpy(np.load(x_path))
    if x.dim() == 3:
        x = x.unsqueeze(1)  # (H, W) samples are one-channel images
    y = torch.from_numpy(np.load(y_path))
    params = list(model.parameters())
    if optim == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    out = model(x)
    if loss == "mse":
        value = F.mse_loss(out, y)
    else:
        value = F.cross_entropy(out, y)
    opt.zero_grad()
    value.backward()
    opt.step()
    want = {k: v.detach() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    got = morph_state(ckpt)
    if sorted(want) != sorted(got):
        print(f"FAIL: tensors differ: PyTorch {sorted(want)}, Morph {sorted(got)}")
        return 1
    worst, worst_name = 0.0, ""
    for k, w in want.items():
        g = got[k]
        if tuple(g.shape) != tuple(w.shape):
            print(f"FAIL: {k}: shape {tuple(g.shape)} vs PyTorch {tuple(w.shape)}")
            return 1
        # Relative to the tensor's magnitude (an element near zero has no
        # meaningful relative error of its own).
        err = ((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item()
        if err > worst:
            worst, worst_name = err, k
    initial = torch.jit.load(model_path).state_dict()
    if all(torch.equal(got[k], initial[k]) for k in want):
        print("FAIL: Morph's checkpoint holds the initial weights")
        return 1
    print(f"{model_path} {optim} {loss}: max relative difference {worst:.3g} ({worst_name}) over {len(want)} tensors")
    if worst > 1e-6:
        print("FAIL: more than 1e-6")
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    elif sys.argv[1] == "reference":
        a = sys.argv[2:]
        sys.exit(reference(a[0], a[1], a[2], a[3], a[4], float(a[5]), a[6]))
    else:
        sys.exit(__doc__)
