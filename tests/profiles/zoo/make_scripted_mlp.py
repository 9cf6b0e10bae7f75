"""Writes the TorchScript fixture of zoo_test: an nn.Sequential whose children are the units of
`mlp` with depth 2, width 32, in 16, out 8 (layer0 = Linear+ReLU, head = Linear)."""
import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Sequential(nn.Linear(16, 32), nn.ReLU()), nn.Linear(32, 8))
torch.jit.script(model).save(sys.argv[1])
