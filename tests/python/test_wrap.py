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
    # AdaScale (fairscale's gain from the ranks' gradient norms scales the learning rate each step).
    {"id": "gpt2-adascale", "model": "gpt2", "optimizer": "sgd", "lr": 0.05, "sets": {"zero_stage": 0, "adascale": True}},
    {"id": "gpt2-s0-ckpt-mb2", "model": "gpt2", "microbatches": 2, "sets": {"zero_stage": 0, "checkpointing": [1, 2]}},
    {"id": "resnet-s0", "model": "resnet", "sets": {"zero_stage": 0}},
    {"id": "resnet-s3-offload", "model": "resnet", "sets": {"zero_stage": 3, "offload": OFFLOAD_ALL}},
    {"id": "skipnet-s3", "model": "skipnet", "sets": {"zero_stage": 3, "reshard_after_forward": True}},
    # LocalSGD with SlowMo, one rank per node: a DDP warm-up step, then each rank steps its own replica,
    # averaged (and SlowMo's outer step) after every second step. Against two replicas in plain PyTorch.
    {"id": "gpt2-localsgd-slowmo", "model": "gpt2", "ranks_per_node": 1, "replicas": True,
     "sets": {"zero_stage": 0, "localsgd_frequency": 2, "localsgd_warmup_steps": 1, "slowmo_momentum": 0.5,
              "slowmo_frequency": 2, "slowmo_lr": 1.0}},
    {"id": "gpt2-fp16-s2-scaled", "model": "gpt2", "sets": {
        "zero_stage": 2, "precision": {"param_dtype": "fp16", "compute_dtype": "fp16", "reduce_dtype": "fp32",
                                       "master_fp32": True, "loss_scale": "dynamic"}}},
    {"id": "llama-bf16-s3", "model": "llama", "sets": {
        "zero_stage": 3, "precision": {"param_dtype": "bf16", "compute_dtype": "bf16", "reduce_dtype": "fp32",
                                       "master_fp32": True}}},
]


# The cluster the runs ran on (2 Gloo ranks on this machine's CPU): the test.probe fixture's profile, or
# this machine probed now when run by hand. Its collectives decide what is in flight when (the memory of a
# reduce-scatter on Gloo, an all-reduce of a full-size copy, is not NCCL's).
CLUSTER = os.environ.get("ZEROPLAN_TEST_CLUSTER") or "local"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AdaScaleGain:
    """fairscale's AdaScale gain estimator (as exec/src/step/optimizer.cpp has it), in Python floats."""

    def __init__(self, samples):
        self.s, self.f = samples, max(1.0 - samples / 1000.0, 0.0)
        self.sqr_b = self.var_b = self.unbias = 0.0

    def update(self, sum_sample_sqr, mean_sqr):
        s, f = self.s, self.f
        var = sum_sample_sqr / (s - 1) - mean_sqr * s / (s - 1)
        sqr = max(mean_sqr - var / s, 0.0)
        var = max(var, 1e-6)
        self.sqr_b = f * self.sqr_b + (1 - f) * sqr
        self.var_b = f * self.var_b + (1 - f) * var
        self.unbias = f * self.unbias + (1 - f)
        sqr_avg, var_avg = self.sqr_b / self.unbias, self.var_b / self.unbias
        return (var_avg + sqr_avg) / (var_avg / s + sqr_avg)


def reference(case, world=2):
    """Plain PyTorch in one process: the global batch in the same chunks, gradients averaged, Adam (with
    adascale, its learning rate times the gain from the chunks' gradient norms)."""
    torch.set_num_threads(1)  # the ranks' threads: the same reduction order in every kernel
    model, make_batch, loss_fn = wrap_worker.build(case["model"])
    model.train()
    lr = case.get("lr", 1e-3)
    if case.get("optimizer") == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=lr, fused=True)  # the kernel zeroplan steps with
    mb, m = case.get("micro_batch", 2), case.get("microbatches", 1)
    stage = case["sets"].get("zero_stage", 0)
    losses = {r: [] for r in range(world)}
    gain = AdaScaleGain(world * m) if case["sets"].get("adascale") else None
    gains = []
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
        if gain is not None:
            n = world * m  # each chunk's own gradient is n x its scaled share
            local = sum(float(torch.dot(t.reshape(-1), t.reshape(-1))) for t in (x for v in g.values() for x in v))
            final = sum(float(torch.dot(p.grad.reshape(-1), p.grad.reshape(-1))) for p in model.parameters())
            gains.append(gain.update(local * n * n, final))
            opt.param_groups[0]["lr"] = lr * gains[-1]
        opt.step()
        opt.zero_grad()
    if gain is not None:
        return losses, model.state_dict(), gains
    return losses, model.state_dict()


def replicas_reference(case, world=2):
    """LocalSGD + SlowMo in plain PyTorch: one model and fused Adam per rank, each on its own chunk (the DDP
    warm-up steps on the gradients averaged); after step s with (s + 1) % frequency == 0 the parameters
    averaged (each divided by the ranks, then summed), then SlowMo's outer step on the average
    (u = beta u + (x_old - x) / lr; x_old -= lr alpha u; x = x_old)."""
    import copy
    torch.set_num_threads(1)
    sets, lr = case["sets"], 1e-3
    base, make_batch, loss_fn = wrap_worker.build(case["model"])
    base.train()
    models = [copy.deepcopy(base) for _ in range(world)]
    opts = [torch.optim.Adam(m.parameters(), lr=lr, fused=True) for m in models]
    x_old = [p.detach().clone() for p in base.parameters()]
    u = [torch.zeros_like(p) for p in x_old]
    mb = case.get("micro_batch", 2)
    losses = {r: [] for r in range(world)}
    for step in range(wrap_worker.STEPS):
        batch = make_batch(world * mb + step)
        warm = step < sets["localsgd_warmup_steps"]
        grads = []
        for r, m in enumerate(models):
            part = wrap_worker.chunk(batch, r * mb, mb)
            loss = loss_fn(wrap_worker.call(m, part), part)
            (loss / (world if warm else 1)).backward()
            losses[r].append(loss.item())
            grads.append([p.grad for p in m.parameters()])
        if warm:
            for i in range(len(x_old)):
                total = grads[0][i] + grads[1][i]
                for m in models:
                    list(m.parameters())[i].grad = total.clone()
        for opt in opts:
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            if (step + 1) % sets["localsgd_frequency"] == 0:
                for ps in zip(*(m.parameters() for m in models)):
                    avg = ps[0] / world + ps[1] / world
                    for p in ps:
                        p.copy_(avg)
            if (step + 1) % sets["slowmo_frequency"] == 0:
                beta, alpha = sets["slowmo_momentum"], sets["slowmo_lr"]
                for i, ps in enumerate(zip(*(m.parameters() for m in models))):
                    # in fairscale's order of operations (rounding moves an element whose gradient is noise)
                    u[i].mul_(beta).sub_(ps[0], alpha=1.0 / lr).add_(x_old[i], alpha=1.0 / lr)
                    x_old[i].add_(u[i], alpha=-lr * alpha)
                    for p in ps:
                        p.copy_(x_old[i])
    return losses, [dict(m.named_parameters()) for m in models]


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
            if "precision" in case["sets"] or case.get("replicas"):
                continue
            with self.subTest(case["id"]):
                r0, r1 = self.result(case, 0), self.result(case, 1)
                self.assertTrue(r0["views_valid"] and r1["views_valid"])
                losses, state, *gains = reference(case)
                if gains:  # AdaScale: the same gain each step, and a gain the test can see (above 1)
                    torch.testing.assert_close(torch.tensor(r0["gains"]), torch.tensor(gains[0]), rtol=1e-4, atol=0)
                    self.assertGreater(min(gains[0]), 1.0)
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

    def test_localsgd_slowmo_matches_replicas(self):
        for case in (c for c in CASES if c.get("replicas")):
            with self.subTest(case["id"]):
                losses, params = replicas_reference(case)
                for rank in (0, 1):
                    r = self.result(case, rank)
                    torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(losses[rank]), rtol=1e-5, atol=0)
                    for name, ref in params[rank].items():  # each rank's own replica (stage 0: all of it)
                        got = zeroplan.LocalShard(*r["sharded"][name])
                        torch.testing.assert_close(got.local.view(got.shape), ref.detach(), rtol=1e-5, atol=1e-7,
                                                   msg=f"rank {rank} {name}")
                # the last step was local: the ranks' replicas differ (LocalSGD, not DDP)
                name = "transformer.wte.weight"
                r0, r1 = (zeroplan.LocalShard(*self.result(case, r)["sharded"][name]).local for r in (0, 1))
                self.assertFalse(torch.equal(r0, r1))

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
            if "resume_at" in case:  # its peak holds the checkpoint's save and load besides the steps
                continue
            # A plan with 16-bit parameters from the model profiled in that dtype (as wrap runs it).
            dtype = case["sets"].get("precision", {}).get("param_dtype", "fp32")
            key = (case["model"], dtype)
            if key not in profiles:
                model, make_batch, loss_fn = wrap_worker.build(case["model"])
                mb = case.get("micro_batch", 2)
                profiles[key] = zeroplan.profile(model, make_batch, loss_fn, batches=[mb, 2 * mb], batch=mb,
                                                 repeats=1, warmup=0, threads=1, dtype=dtype)
            plan = wrap_worker.plan_for(case, 2)
            pred = zeroplan.simulate(profiles[key], cluster=CLUSTER, plan=plan)
            for rank in (0, 1):
                r = self.result(case, rank)
                for pool, measured, predicted in (("device", r["peak"], pred["device"]["peak_bytes"]),
                                                  ("host", r["host_peak"], pred["host"]["peak_bytes"])):
                    if pool == "host" and measured == 0 and predicted == 0:
                        continue
                    err = (predicted - measured) / measured
                    rows.append(f"{case['id']:<20} rank {rank} {pool:<6} predicted {predicted:>11,} measured "
                                f"{measured:>11,} {100 * err:+6.2f}%")
                    if abs(err) > 0.05:
                        bad.append(rows[-1])
        print("\n" + "\n".join(rows), file=sys.stderr)
        self.assertEqual(bad, [], "peaks off by more than 5%")

    def test_sharded_state_dict_joins_to_the_full_one(self):
        """state_dict(sharded=True): each rank's elements of every parameter, no communication; the two
        ranks' shards by offset are the full state dict (fp32: the master where the plan keeps one)."""
        for case in CASES:
            with self.subTest(case["id"]):
                r0, r1 = self.result(case, 0), self.result(case, 1)
                self.assertEqual(set(r0["sharded"]), set(r1["sharded"]))
                stage = case["sets"]["zero_stage"]
                for name, full in r0["state"].items():
                    if name not in r0["sharded"]:
                        continue  # a buffer
                    parts = [zeroplan.LocalShard(*r["sharded"][name]) for r in (r0, r1)]
                    n0, n1 = (p.local.numel() for p in parts)
                    if stage == 0:  # not sharded: each rank holds the whole (LocalSGD: its own replica)
                        self.assertEqual((n0, n1), (full.numel(), full.numel()), name)
                        self.assertTrue(torch.equal(parts[0].local.view(full.shape), full), name)
                        continue
                    else:
                        self.assertEqual(n0 + n1, full.numel(), name)
                    self.assertTrue(torch.equal(zeroplan.LocalShard.join(parts), full), name)
                    self.assertEqual(parts[0].local.dtype, torch.float32)

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
