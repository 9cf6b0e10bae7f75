"""Writes a tiny scripted language model for zoo_test's `--task lm`: token ids [batch, T] -> logits
[batch, T, vocab] through Embedding(vocab, 32) and Linear(32, vocab).
    make_scripted_lm.py OUT.pt [VOCAB=16]
"""
import sys

import torch
from torch import nn

torch.manual_seed(0)
vocab = int(sys.argv[2]) if len(sys.argv) > 2 else 16
model = nn.Sequential()
model.add_module("embed", nn.Embedding(vocab, 32))
model.add_module("head", nn.Linear(32, vocab))
torch.jit.script(model).save(sys.argv[1])
