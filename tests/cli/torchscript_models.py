#!/usr/bin/env python3
"""TorchScript models, data and PyTorch's reference step for
tests/cli/torchscript_test.sh (needs python3-torch).

  torchscript_models.py write DIR
      writes the test's modules (*.pt), bad model files and .npy data to DIR.
  torchscript_models.py torchvision DIR
      writes torchvision's resnet18, mobilenet_v2 and squeezenet1_1
      (python3-torchvision, num_classes=10), scripted and unmodified, and
      16 3x32x32 images with labels (tv_x.npy, tv_y.npy) to DIR; each
      model also without dropout (NAME_nodrop.pt, the same weights).
  torchscript_models.py reference MODEL.pt X.npy Y.npy LOSS OPTIM LR CKPT [STEPS [TOL [ARCH]]]
      runs STEPS (default 1) steps of PyTorch's own optimiser (OPTIM "sgd":
      momentum 0.9, weight decay 1e-4; "adamw": weight decay 0.01) on the
      whole data set as one batch, in training mode, and compares every
      parameter and buffer (batch norms' running statistics included) with
      Morph's checkpoint of that step in CKPT (a step-... folder); exit 1
      when one differs by more than TOL (default 1e-6) relative (with ARCH:
      and by more than 4x as much as that tensor differs between PyTorch's
      own trainings on the batch and on the batch permuted, a measure of how
      fast the network amplifies rounding). PyTorch
      runs the scripted module with the graph executor's optimisations off
      (no fusion, no autodiff subgraphs: eager's arithmetic), or, with ARCH
      (a torchvision model name), torchvision's eager module itself, loaded
      with the file's weights.
  torchscript_models.py gradient MODEL.pt X.npy Y.npy SEED VNS LR CKPT ARCH
      Morph's first step of plain SGD (no momentum, no weight decay, at
      learning rate LR) on the whole data set as one global batch of VNS
      VNs, read back as a gradient, (before - after) / LR, against PyTorch's
      gradient accumulated over the same VNS micro-batches (the samples
      Morph's sampler gives each VN: docs/job_file.md, "Which samples a
      step sees") of torchvision's eager module ARCH; and every batch norm's
      running statistics against (1 - momentum) * running + momentum * the
      mean over the micro-batches of each one's batch statistics, as
      PyTorch computes them. Exit 1 when a tensor differs by more than 1e-5
      relative to its largest value.
  torchscript_models.py exported FILE X.npy Y.npy SUMMARY
      loads an exported TorchScript model (morph run --export) with
      torch.jit.load and checks its test loss and accuracy on X, Y (one
      batch, evaluation mode) against Morph's summary.json.
  torchscript_models.py exported-dict FILE CKPT
      loads an exported built-in model with torch.load and checks that its
      tensors are the checkpoint's (a step-... folder), named LAYER.NAME.
  torchscript_models.py same FILE FILE
      checks that two exported TorchScript models hold equal tensors.
  torchscript_models.py each 'COMMAND ARGS' ...
      runs several of the above in one process (torch imported once);
      exit 1 when any failed.
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


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x, y):
        return self.fc(x.flatten(1)) + y


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
    for name, bn in [("nomomentum", nn.BatchNorm2d(4, momentum=None)),
                     ("notrack", nn.BatchNorm2d(4, track_running_stats=False))]:
        torch.manual_seed(5)
        nested = nn.Sequential()
        nested.add_module("stem", nn.Conv2d(1, 4, 3, padding=1))
        nested.add_module("layer3", nn.Sequential())
        nested.layer3.add_module("conv", nn.Conv2d(4, 4, 3, padding=1))
        nested.layer3.add_module("bn", bn)
        nested.add_module("flatten", nn.Flatten())
        nested.add_module("head", nn.Linear(4 * 28 * 28, 10))
        save(nested, f"{d}/{name}.pt")
    save(TwoInputs(), f"{d}/twoin.pt")
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


def write_torchvision(d):
    import torchvision

    os.makedirs(d, exist_ok=True)
    for i, name in enumerate(["resnet18", "mobilenet_v2", "squeezenet1_1"]):
        torch.manual_seed(10 + i)
        m = getattr(torchvision.models, name)(num_classes=10)
        save(m, f"{d}/{name}.pt")
        # The same weights without dropout, for the parity with PyTorch
        # (Morph draws its own dropout masks: docs/models.md).
        for sub in m.modules():
            if isinstance(sub, nn.Dropout):
                sub.p = 0.0
        save(m, f"{d}/{name}_nodrop.pt")
    g = torch.Generator().manual_seed(7)
    np.save(f"{d}/tv_x.npy", torch.rand(16, 3, 32, 32, generator=g).numpy().astype(np.float32))
    np.save(f"{d}/tv_y.npy", (np.arange(16) % 10).astype(np.int64))



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
                state[key] = torch.from_numpy(t.copy())  # state_dict() names (docs/models.md)
    return state


def pytorch_training(model_path, x, y, loss, optim, lr, steps, arch):
    """The state after STEPS steps of PyTorch's own training (reference())."""
    model = torch.jit.load(model_path)
    if arch:
        import torchvision

        eager = getattr(torchvision.models, arch)(num_classes=10)
        eager.load_state_dict(model.state_dict())
        for sub in eager.modules():
            if isinstance(sub, nn.Dropout):
                sub.p = 0.0  # the _nodrop files
        model = eager
    else:
        # After two runs the profiling executor would fuse and differentiate
        # the graph itself, with other rounding than eager autograd.
        torch._C._set_graph_executor_optimize(False)
    model.train()
    params = list(model.parameters())
    if optim == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    for _ in range(steps):
        out = model(x)
        if loss == "mse":
            value = F.mse_loss(out, y)
        else:
            value = F.cross_entropy(out, y)
        opt.zero_grad()
        value.backward()
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}


def differences(got, want):
    """Per tensor, the largest difference relative to the tensor's magnitude
    (an element near zero has no meaningful relative error of its own), or
    to 0.01 for a tensor whose values are all smaller: one that is zero but
    for rounding (the running mean of a batch norm behind a zero-mean
    projection, a bias whose gradient cancels) holds nothing but rounding
    noise."""
    return {k: ((got[k] - w).abs().max() / w.abs().max().clamp_min(1e-2)).item() for k, w in want.items()}


def within_spread(errs, spread, tol):
    """0 when no tensor is off by more than max(TOL, 4 x PyTorch's own
    spread), the difference between PyTorch runs on the batch in another
    order; else 1, naming the worst."""
    over = {k: e for k, e in errs.items() if e > max(tol, 4 * spread[k])}
    print(f"  PyTorch against itself with the batch permuted: max {max(spread.values()):.3g}; "
          f"{sum(e > tol for e in errs.values())} tensors above {tol:g}, {len(over)} of them above 4x "
          f"PyTorch's own spread")
    for k in sorted(over, key=over.get, reverse=True)[:5]:
        print(f"FAIL: {k}: {over[k]:.3g}, PyTorch's own spread {spread[k]:.3g}")
    return 1 if over else 0


def reference(model_path, x_path, y_path, loss, optim, lr, ckpt, steps=1, tol=1e-6, arch=None):
    torch.set_num_threads(1)
    x = torch.from_numpy(np.load(x_path))
    if x.dim() == 3:
        x = x.unsqueeze(1)  # (H, W) samples are one-channel images
    y = torch.from_numpy(np.load(y_path))
    want = pytorch_training(model_path, x, y, loss, optim, lr, steps, arch)
    got = morph_state(ckpt)
    if sorted(want) != sorted(got):
        print(f"FAIL: tensors differ: PyTorch {sorted(want)}, Morph {sorted(got)}")
        return 1
    for k, w in want.items():
        if tuple(got[k].shape) != tuple(w.shape):
            print(f"FAIL: {k}: shape {tuple(got[k].shape)} vs PyTorch {tuple(w.shape)}")
            return 1
    initial = torch.jit.load(model_path).state_dict()
    if all(torch.equal(got[k], initial[k]) for k in want):
        print("FAIL: Morph's checkpoint holds the initial weights")
        return 1
    errs = differences(got, want)
    worst_name = max(errs, key=errs.get)
    worst = errs[worst_name]
    print(f"{model_path} {optim} {loss}, {steps} steps: max relative difference {worst:.3g} ({worst_name}) "
          f"over {len(want)} tensors")
    if worst <= tol:
        return 0
    if arch:
        # Some networks amplify rounding so fast that PyTorch does not match
        # itself either: per tensor, the same training with the batch in
        # another order (other summation orders, the same mathematics) sets
        # the bar where it is above TOL.
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1))
        spread = differences(pytorch_training(model_path, x[perm], y[perm], loss, optim, lr, steps, arch), want)
        return within_spread(errs, spread, tol)
    print(f"FAIL: more than {tol:g}")
    return 1


MASK64 = (1 << 64) - 1


class SplitMix64:
    """src/data/sampler.h's generator (a fully specified PRNG)."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n):
        limit = MASK64 - MASK64 % n
        while True:
            v = self.next()
            if v < limit:
                return v % n


def mix_seed(a, b, c, d):
    h = SplitMix64(a).next()
    for v in (b, c, d):
        h = SplitMix64(h ^ ((v * 0xD6E8FEB86659FD93) & MASK64)).next()
    return h


def epoch_permutation(seed, n, epoch):
    """The training stream's permutation of epoch `epoch` (docs/job_file.md)."""
    p = list(range(n))
    rng = SplitMix64(mix_seed(seed, 0x5A3B1E, epoch, 0))
    for i in range(n - 1, 0, -1):  # Fisher-Yates
        j = rng.below(i + 1)
        p[i], p[j] = p[j], p[i]
    return p


def gradient(model_path, x_path, y_path, seed, vns, lr, ckpt, arch):
    """Morph's 4-VN step read back as a gradient against PyTorch's
    accumulation over the same micro-batches (see the module's doc)."""
    import torchvision

    torch.set_num_threads(1)
    x = torch.from_numpy(np.load(x_path))
    y = torch.from_numpy(np.load(y_path))
    n = x.shape[0]
    order = epoch_permutation(seed, n, 0)  # step 0 is the whole first epoch
    model = getattr(torchvision.models, arch)(num_classes=10)
    initial = torch.jit.load(model_path).state_dict()
    model.load_state_dict(initial)
    for sub in model.modules():
        if isinstance(sub, nn.Dropout):
            sub.p = 0.0  # the _nodrop files
    model.train()
    bns = {name: m for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    momentum = {name: m.momentum for name, m in bns.items()}
    stats = {name: [] for name in bns}
    for m in bns.values():
        m.momentum = 1.0  # running statistics := the micro-batch's own (mean, unbiased variance)
    b = n // vns
    for v in range(vns):
        idx = torch.tensor(order[v * b : (v + 1) * b])
        loss = F.cross_entropy(model(x[idx]), y[idx], reduction="sum") / n  # the global batch's mean
        loss.backward()
        for name, m in bns.items():
            stats[name].append((m.running_mean.clone(), m.running_var.clone()))
    want, got = {}, {}
    after = morph_state(ckpt)
    for name, p in model.named_parameters():
        want[name] = p.grad.double()
        got[name] = (initial[name].double() - after[name].double()) / lr
    for name, m in bns.items():
        k = momentum[name]
        for i, buf in enumerate(("running_mean", "running_var")):
            mean = torch.stack([s[i].double() for s in stats[name]]).mean(0)
            want[f"{name}.{buf}"] = (1 - k) * initial[f"{name}.{buf}"].double() + k * mean
            got[f"{name}.{buf}"] = after[f"{name}.{buf}"].double()
    errs = {k: ((got[k] - w).abs().max() / w.abs().max().clamp_min(1e-12)).item() for k, w in want.items()}
    worst = max(errs, key=errs.get)
    print(f"{model_path}: {vns} VNs, gradient and running statistics over {len(want)} tensors: "
          f"max relative difference {errs[worst]:.3g} ({worst})")
    if errs[worst] > 1e-5:
        for k in sorted(errs, key=errs.get, reverse=True)[:5]:
            print(f"FAIL: {k}: {errs[k]:.3g}")
        return 1
    return 0


def exported(path, x_path, y_path, summary_path):
    torch.set_num_threads(1)
    model = torch.jit.load(path)
    model.eval()
    x = torch.from_numpy(np.load(x_path))
    if x.dim() == 3:
        x = x.unsqueeze(1)
    y = torch.from_numpy(np.load(y_path))
    with torch.no_grad():
        out = model(x)
    loss = F.cross_entropy(out, y).item()
    acc = (out.argmax(1) == y).double().mean().item()
    s = json.load(open(summary_path))
    print(f"{path}: test loss {loss:.9g} (Morph {s['test_loss']:.9g}), accuracy {acc} (Morph {s['test_accuracy']})")
    # Up to the summation order of the evaluation (Morph sums per sample).
    if abs(loss - s["test_loss"]) > 1e-5 * abs(s["test_loss"]) or abs(acc - s["test_accuracy"]) > 1e-12:
        print("FAIL: the exported model does not evaluate as Morph's did")
        return 1
    return 0


def exported_dict(path, ckpt):
    got = torch.load(path)
    manifest = open(f"{ckpt}/MANIFEST").read()
    m = json.loads(manifest[: manifest.rindex("xxh64 ")])
    want = {}
    for layer in m["layers"]:
        for name, t in read_tensor_file(f"{ckpt}/{layer['file']}").items():
            kind, _, key = name.partition("/")
            if kind in ("param", "buffer"):
                want[layer["name"] + "." + key] = torch.from_numpy(t.copy())
    if sorted(got) != sorted(want):
        print(f"FAIL: {path} holds {sorted(got)}, the checkpoint {sorted(want)}")
        return 1
    for k, w in want.items():
        if not torch.equal(got[k], w):
            print(f"FAIL: {path}: {k} differs from the checkpoint's")
            return 1
    print(f"{path}: {len(got)} tensors, equal to the checkpoint's")
    return 0


def same(a_path, b_path):
    a, b = torch.jit.load(a_path).state_dict(), torch.jit.load(b_path).state_dict()
    if sorted(a) != sorted(b) or any(not torch.equal(a[k], b[k]) for k in a):
        print(f"FAIL: {a_path} and {b_path} hold different tensors")
        return 1
    return 0


def command(argv):
    """One subcommand (see the module's doc); its exit code."""
    if argv[0] == "write":
        return write(argv[1])
    if argv[0] == "torchvision":
        return write_torchvision(argv[1])
    if argv[0] == "reference":
        a = argv[1:]
        steps = int(a[7]) if len(a) > 7 else 1
        tol = float(a[8]) if len(a) > 8 else 1e-6
        arch = a[9] if len(a) > 9 else None
        return reference(a[0], a[1], a[2], a[3], a[4], float(a[5]), a[6], steps, tol, arch)
    if argv[0] == "gradient":
        a = argv[1:]
        return gradient(a[0], a[1], a[2], int(a[3]), int(a[4]), float(a[5]), a[6], a[7])
    if argv[0] == "exported":
        return exported(*argv[1:5])
    if argv[0] == "exported-dict":
        return exported_dict(*argv[1:3])
    if argv[0] == "same":
        return same(*argv[1:3])
    if argv[0] == "each":
        # Several subcommands in one process (one import of torch): each
        # argument is one command line; all run, the exit code is 1 if any
        # failed.
        import shlex

        return 1 if any([command(shlex.split(c)) for c in argv[1:]]) else 0
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(command(sys.argv[1:]))
