#!/usr/bin/env python3
"""Writes a small ResNet-style CNN for Fashion-MNIST (1x28x28 -> 10 classes)
as a TorchScript file that `morph run examples/torchscript/cnn.toml` trains.

  /usr/bin/python3 examples/torchscript/make_model.py [OUT.pt]   (default: model.pt next to this script)

Morph cuts the module's forward graph into layers at its cut points
(docs/models.md, "How layers are found"): this nn.Sequential gives one
layer per child. Batch norms may sit at any depth (Morph keeps their
statistics per virtual node). The weights are this file's: Morph's job seed
does not re-initialise them (it still drives data order and dropout).
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Residual(nn.Module):
    """x + conv(relu(conv(x))): (b, C, H, W) -> (b, C, H, W)."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        nn.init.zeros_(self.conv2.weight)  # the block starts as the identity

    def forward(self, x):
        return F.relu(x + self.conv2(F.relu(self.conv1(x))))


def resnet() -> nn.Module:
    torch.manual_seed(1)
    m = nn.Sequential()
    m.add_module("stem", nn.Conv2d(1, 16, 3, padding=1, bias=False))  # (b, 16, 28, 28)
    m.add_module("bn1", nn.BatchNorm2d(16))
    m.add_module("relu1", nn.ReLU())
    m.add_module("block1", Residual(16))
    m.add_module("pool1", nn.MaxPool2d(2))  # (b, 16, 14, 14)
    m.add_module("conv2", nn.Conv2d(16, 32, 3, padding=1, bias=False))  # (b, 32, 14, 14)
    m.add_module("bn2", nn.BatchNorm2d(32))
    m.add_module("relu2", nn.ReLU())
    m.add_module("block2", Residual(32))
    m.add_module("pool2", nn.MaxPool2d(2))  # (b, 32, 7, 7)
    m.add_module("flatten", nn.Flatten())
    m.add_module("dropout", nn.Dropout(0.1))
    m.add_module("head", nn.Linear(32 * 7 * 7, 10))
    return m


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.pt")
    torch.jit.save(torch.jit.script(resnet()), out)
    print(f"wrote {out}")
