"""Writes a small CNN as a scripted nn.Sequential of its stages: the user's own model for the
torchscript loop test. Convolutions, BatchNorm, pooling, an in-place ReLU as a top-level child (as
torchvision writes it), and a classifier head.
    make_scripted_cnn.py OUT.pt [CLASSES=10]
"""
import sys

import torch
from torch import nn


def block(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout))


def main():
    out, classes = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("stem", nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)))
    model.add_module("relu", nn.ReLU(inplace=True))  # writes its input in place, at the top level
    model.add_module("pool", nn.MaxPool2d(2))
    model.add_module("stage1", block(16, 32, 1))
    model.add_module("stage2", block(32, 64, 2))
    model.add_module("head", nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes)))
    torch.jit.script(model).save(out)


if __name__ == "__main__":
    main()
