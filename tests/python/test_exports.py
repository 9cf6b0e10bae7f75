"""Exports that run as they are: `tune --for fsdp2` on a Hugging Face Llama-style model's profile writes
train_fsdp2.py (fully_shard per LlamaDecoderLayer, checkpoint_wrapper, the plan's optimizer and batch), which
trains the model for 3 steps on 2 Gloo ranks under torchrun (the loss falls), recorded by zeroplan.record, and
`compare` finds each rank's device peak near zeroplan's prediction for the plan (see the test for how near); the
same for `tune --for deepspeed`'s ds_config.json through deepspeed.initialize in a user's DeepSpeed loop.
`tune --for accelerate` refuses a CPU cluster (Accelerate's FSDP needs accelerators)."""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("ZEROPLAN_BUILD_DIR", os.path.join(ROOT, "build"))
ZEROPLAN = os.path.join(BUILD, "zeroplan")
CLUSTER = os.environ.get("ZEROPLAN_TEST_CLUSTER") or "local"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def largest_layer_bytes(profile):
    """The largest unit's parameter bytes in a profile: the one layer a stage-3 prediction holds or not as the
    prefetch's timing falls."""
    with open(profile) as f:
        return max(u["bytes_param"] for u in json.load(f)["units"])


def run(*args, **kw):
    return subprocess.run([ZEROPLAN, *args], capture_output=True, text=True, timeout=600, **kw)


ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(ROOT, "python"), ZEROPLAN_BUILD_DIR=BUILD)
LLAMA = os.path.join(HERE, "models.py") + ":llama"


class ExportsTest(unittest.TestCase):
    # ---- the steps every export's test takes ----

    def tune_for(self, tmp, tool, *fixes):
        """Profiles the Llama-style model and tunes it for `tool` on 2 ranks (fp32, stage 3, clipping at 1.0, micro
        batch 2 and the default buckets, and `fixes`): the profile's and the export folder's paths. The micro batch
        and buckets are fixed because the plans that differ only in them are predicted within the probe's noise of
        each other on this machine: under load the tuner picked micro batch 1 x 2 microbatches once, and the
        peaks compared below then belonged to another plan than the margins were set for (a -15% and a +26%)."""
        profile = os.path.join(tmp, "llama.json")
        r = run("-q", "profile", "--python", LLAMA, "--batches", "2,4", "--batch", "2", "--threads", "1", "-o", profile,
                env=ENV)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = os.path.join(tmp, "tune")
        args = ["tune", "--model", profile, "--cluster", CLUSTER, "--world-size", "2", "--global-batch", "4",
                "--for", tool, "--fix", "precision=fp32", "--fix", "zero_stage=3", "--fix", "optimizer.max_grad_norm=1.0",
                "--fix", "micro_batch=2", "--fix", "buckets=default"]
        for f in fixes:
            args += ["--fix", f]
        r = run(*args, "--top-k", "1", "-o", out, env=ENV)
        self.assertEqual(r.returncode, 0, r.stderr)
        return profile, out

    def train(self, command, plan=None):
        """Runs an export's training (3 steps on 2 ranks); the losses fall (the plan is named when they do not).
        A launch that fails is said and run once more on a fresh port: once in about twenty runs of the exports
        beside each other a torchrun of them failed (its output was not kept; python.record retries the same way
        for Gloo's abort at teardown)."""
        for attempt in (1, 2):
            r = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600)
            if r.returncode == 0:
                break
            print(f"attempt {attempt} failed (exit {r.returncode}): {r.stderr[-1500:]}", file=sys.stderr)
            command[command.index("--master-port") + 1] = str(free_port())
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        steps = re.findall(r"^step (\d+) loss", r.stdout, re.M)
        # Only rank 0 prints: a step printed twice is two undistributed processes (as Accelerate's FSDP on CPUs).
        self.assertEqual(len(steps), len(set(steps)), f"a step printed by more than one rank:\n{r.stdout}")
        losses = [float(x) for x in re.findall(r"^step \d+ loss ([0-9.]+)$", r.stdout, re.M)][:3]
        self.assertEqual(len(losses), 3, r.stdout)
        tuned = open(plan).read() if plan else ""
        self.assertLess(losses[-1], losses[0], f"{r.stdout}\n{r.stderr[-2000:]}\nplan: {tuned}")

    def device_peaks(self, tmp, profile, out, record, what, *simulate_args):
        """zeroplan's prediction for the exported plan against the recorded run: each rank's device peak metric."""
        with open(record) as f:
            self.assertEqual(len(json.load(f)["peaks"]), 2)
        pred = os.path.join(tmp, "prediction.json")
        r = run("-q", "simulate", "--model", profile, "--cluster", CLUSTER, "--plan", os.path.join(out, "plan.json"),
                *simulate_args, "-o", pred, env=ENV)
        self.assertEqual(r.returncode, 0, r.stderr)
        cmp = os.path.join(tmp, "comparison.json")
        r = run("compare", "--predicted", pred, "--measured", record, "--model", profile, "-o", cmp, env=ENV)
        self.assertNotIn("warning: the prediction is of model", r.stderr)
        with open(cmp) as f:
            metrics = {m["name"]: m for m in json.load(f)["metrics"]}
        peaks = [metrics[f"device_peak_bytes.rank{rank}"] for rank in (0, 1)]
        for rank, peak in enumerate(peaks):
            print(f"{what} rank {rank}: device peak predicted {peak['predicted']:,.0f} B, measured "
                  f"{peak['measured']:,.0f} B ({peak['rel_error']:+.1%})", file=sys.stderr)
        return peaks

    # ---- the exports ----

    def test_fsdp2_script_trains_the_llama_model_and_compares(self):
        with tempfile.TemporaryDirectory() as tmp:
            profile, out = self.tune_for(tmp, "fsdp2", "reshard_after_forward=true", "checkpointing=all")
            script = os.path.join(out, "train_fsdp2.py")
            self.assertTrue(os.path.exists(script), os.listdir(out))
            with open(script) as f:
                text = f.read()
            self.assertIn('UNIT_CLASSES = ("LlamaDecoderLayer",)', text)
            self.assertIn("ZERO_STAGE = 3", text)
            self.assertIn("CHECKPOINT = True", text)
            self.assertIn("MAX_GRAD_NORM = 1\n", text)  # clip_grad_norm_ over the DTensor shards, before each step
            record = os.path.join(tmp, "run.json")
            self.train([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                        "127.0.0.1", "--master-port", str(free_port()), script, "--model", LLAMA, "--steps", "3",
                        "--threads", "1", "--record", record])
            with open(record) as f:
                self.assertEqual(json.load(f)["plan"]["zero_stage"], 3)
            # zeroplan predicts its own executor, whose stage 3 may hold the next layer's gathered parameters
            # beside the current one's when the prefetch is issued early (how early follows the probe's
            # timings); FSDP2 held one layer fewer here (+12.6%: 2,748,872 B predicted, 2,441,936 measured, 7 B
            # past one layer plus 5% once the model's buffers, the rotary embeddings' inv_freq, were counted on
            # 2026-11-28). So: never under by more than 10%, never over by more than one layer's parameters plus
            # 10%, the other exports' tolerance (docs/2-subcommands.md, tune --for).
            layer = largest_layer_bytes(profile)
            for peak in self.device_peaks(tmp, profile, out, record, f"FSDP2 script (one layer {layer:,} B)"):
                self.assertGreater(peak["rel_error"], -0.10)
                self.assertLess(peak["predicted"] - peak["measured"], layer + 0.10 * peak["measured"])

    def test_accelerate_is_refused_on_cpus(self):
        """Accelerate's FSDP runs on accelerators only: `accelerate launch` of its FSDP config on this CPU machine
        starts each process undistributed (until 2026-11-28 this test "trained" the config so, every rank an
        unsharded copy), so `tune --for accelerate` on a CPU cluster refuses in one line (exit 2); the config it
        writes for GPU clusters is checked by tuner_test's Export.* golden files."""
        with tempfile.TemporaryDirectory() as tmp:
            profile = os.path.join(tmp, "llama.json")
            r = run("-q", "profile", "--python", LLAMA, "--batch", "2", "--threads", "1", "-o", profile, env=ENV)
            self.assertEqual(r.returncode, 0, r.stderr)
            r = run("tune", "--model", profile, "--cluster", CLUSTER, "--world-size", "2",
                    "--global-batch", "4", "--for", "accelerate", "-o", os.path.join(tmp, "tune"), env=ENV)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn("Accelerate runs FSDP on accelerators only", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(tmp, "tune", "accelerate_fsdp2.yaml")))

    def test_deepspeed_config_trains_the_llama_model_and_compares(self):
        """`tune --for deepspeed` writes ds_config.json; a user's own DeepSpeed loop (deepspeed_train.py) passes it to
        deepspeed.initialize as it is (DeepSpeed's own config parser; its CPU accelerator) and trains ZeRO-3 with
        gradient clipping for 3 steps on 2 ranks under torchrun, in fp32 and in bf16, recorded and compared."""
        for precision in ("fp32", "bf16"):
            with self.subTest(precision), tempfile.TemporaryDirectory() as tmp:
                self.deepspeed_trains(tmp, precision)

    def deepspeed_trains(self, tmp, precision):
        # On a CPU "device" DeepSpeed's offloaded states are ordinary CPU memory, which zeroplan.record counts as
        # the device's: no offload, so both sides count the same bytes. Prefetch and flat parameters are fixed:
        # the tuner predicts the same peak with or without them and picked either as the probe fell (the CI
        # failure of 2026-11-29), while DeepSpeed holds a gradient bucket more with contiguous_gradients
        # (flat_params, counted by tune --for deepspeed) and 476,416 B more in fp32 with
        # stage3_prefetch_bucket_size (prefetch: 2.6 layers, not counted; the export's notes say so).
        profile, out = self.tune_for(tmp, "deepspeed", "checkpointing=none", "offload_optimizer=false",
                                     "offload_params=false", "offload_grads=false", "offload_activations=0",
                                     f"precision={precision}", "prefetch=false", "flat_params=true")
        config = os.path.join(out, "ds_config.json")
        with open(config) as f:
            ds = json.load(f)
        self.assertEqual(ds["zero_optimization"]["stage"], 3)
        self.assertEqual(ds["gradient_clipping"], 1.0)
        self.assertEqual(ds["bf16"]["enabled"], precision == "bf16")
        record = os.path.join(tmp, "run.json")
        self.train([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                    "127.0.0.1", "--master-port", str(free_port()), os.path.join(HERE, "deepspeed_train.py"),
                    "--model", LLAMA, "--config", config, "--plan", os.path.join(out, "plan.json"), "--steps", "3",
                    "--record", record])
        # zeroplan predicts its own executor; DeepSpeed's ZeRO-3 keeps its flat gradient partition all step (and in
        # fp32 a second parameter partition for its optimizer, with contiguous_gradients a gradient bucket): the
        # export's notes give their bytes, and tune --for deepspeed's prediction (tune.json) and simulate --for
        # deepspeed's count them. DeepSpeed measured 3,664,865 B in fp32 against 3,087,072 +
        # 870,656 B, and 2,527,341 B in bf16 against 2,229,360 + 263,872 B (2026-11-29, the same in every run of
        # this configuration). So: never over tune's prediction by more than 10% (a plan that would not fit), never
        # under by more than one layer plus 10%.
        with open(os.path.join(out, "export_notes.md")) as f:
            extra = int(re.search(r"DeepSpeed's ZeRO-3 holds [^(]*\((\d+) B\) per rank", f.read()).group(1))
        with open(os.path.join(out, "tune.json")) as f:
            tuned = json.load(f)["ranking"][0]["metrics"]["device_peak_bytes"]
        layer = largest_layer_bytes(profile)
        own = self.device_peaks(tmp, profile, out, record, "zeroplan's executor")[0]["predicted"]
        self.assertEqual(tuned, own + extra)
        for peak in self.device_peaks(tmp, profile, out, record, f"DeepSpeed ZeRO-3 {precision} (+{extra:,} B of its own)",
                                      "--for", "deepspeed"):
            self.assertEqual(peak["predicted"], tuned)
            self.assertLess(peak["measured"], tuned * 1.10)
            self.assertGreater(peak["measured"], tuned - layer - 0.10 * tuned)

    def test_tune_for_refuses_an_unknown_tool(self):
        r = run("tune", "--model", "x.json", "--for", "megatron", "--global-batch", "4")
        self.assertEqual(r.returncode, 1)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == "__main__":
    unittest.main()
