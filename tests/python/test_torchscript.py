"""The deprecated TorchScript door stays, and stops training another model than the user's: a scripted
module whose forward() is not the chain of its children is refused; a tied embedding and head stay one
parameter (counted once by profile, trained as one by run)."""
import json
import os
import subprocess
import tempfile
import unittest
import warnings

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("ZEROPLAN_BUILD_DIR", os.path.join(HERE, "..", "..", "build"))
ZEROPLAN = os.path.join(BUILD, "zeroplan")
V, H, T = 64, 32, 8


class SkipAcross(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.b = nn.Linear(H, H)

    def forward(self, x):
        return self.b(self.a(x)) + x  # the skip the chain of children would drop


def tied_lm():
    torch.manual_seed(0)
    m = nn.Sequential()
    m.add_module("embed", nn.Embedding(V, H))
    m.add_module("body", nn.Sequential(nn.Linear(H, H), nn.GELU()))
    m.add_module("head", nn.Linear(H, V, bias=False))
    m.head.weight = m.embed.weight
    return m


def script(module, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(module).save(path)


def run(*args):
    return subprocess.run([ZEROPLAN, *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


class TorchScriptTest(unittest.TestCase):
    def test_forward_that_is_not_the_chain_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "skip.pt")
            script(SkipAcross(), path)
            r = run("profile", "--torchscript", path, "--input-shape", str(H), "--batches", "1")
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("forward() is not the chain of its children", r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_tied_weight_stays_one_parameter(self):
        model = tied_lm()
        n = sum(p.numel() for p in model.parameters())  # the tied matrix once
        self.assertEqual(n, V * H + H * H + H)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "lm.pt")
            script(model, path)
            m = ["--torchscript", path, "--input-shape", str(T), "--task", "lm", "--vocab", str(V)]
            out = os.path.join(tmp, "lm.json")
            r = run("profile", *m, "--batches", "1,2", "--repeats", "1", "-o", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                doc = json.load(f)
            self.assertEqual(sum(u["params"] for u in doc["units"]), n)
            self.assertEqual(doc["units"][2]["borrowed"], [{"unit": 0, "params": V * H}])
            record = os.path.join(tmp, "run.json")
            ckpt = os.path.join(tmp, "ckpt")
            r = run("run", "--nproc", "2", *m, "--set", "zero_stage=3", "--global-batch", "4", "--steps", "4",
                    "--set", "optimizer.lr=0.01", "--checkpoint-dir", ckpt, "--checkpoint-every", "2", "-o", record)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(record) as f:
                losses = json.load(f)["losses"]
            self.assertLess(losses[-1], losses[0])
            # the checkpoint holds the parameters once: resuming from it continues the same run
            r = run("run", "--nproc", "2", *m, "--set", "zero_stage=3", "--global-batch", "4", "--steps", "6",
                    "--set", "optimizer.lr=0.01", "--checkpoint-dir", ckpt, "--resume", ckpt, "-o", record)
            self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
