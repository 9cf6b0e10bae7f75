"""Analytic families from Hugging Face configs: `zeroplan profile --analytic-config config.json` (and
`--analytic llama|mpt`) count exactly the parameters of the transformers models built from the same
configs (on the meta device: no memory, no weights); an --opt key a family does not know is refused."""
import json
import os
import re
import subprocess
import tempfile
import unittest

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, MptConfig, Qwen2Config

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("ZEROPLAN_BUILD_DIR", os.path.join(HERE, "..", "..", "build"))
ZEROPLAN = os.path.join(BUILD, "zeroplan")

CONFIGS = {
    "llama-3-8b": LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                              num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                              tie_word_embeddings=False),
    "mistral-7b": MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768),
    "qwen2-0.5b": Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                              num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                              tie_word_embeddings=True),
    "gpt2": GPT2Config(),
    "mpt-7b": MptConfig(d_model=4096, n_heads=32, n_layers=32, expansion_ratio=4, vocab_size=50432,
                        max_seq_len=2048),
}


def count(config):
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())  # a tied matrix once


def run(*args):
    return subprocess.run([ZEROPLAN, *args], capture_output=True, text=True, timeout=120)


def params(path):
    with open(path) as f:
        return sum(u["params"] * u.get("count", 1) for u in json.load(f)["units"])


class AnalyticTest(unittest.TestCase):
    def test_hf_configs_count_the_models_parameters(self):
        with tempfile.TemporaryDirectory() as tmp:
            for name, config in CONFIGS.items():
                with self.subTest(name):
                    path = os.path.join(tmp, f"{name}.config.json")
                    with open(path, "w") as f:
                        f.write(config.to_json_string())
                    out = os.path.join(tmp, f"{name}.json")
                    r = run("profile", "--analytic-config", path, "--seq", "256", "-o", out)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertEqual(params(out), count(config))
                    # each layer as its attention and MLP units: the same parameters, two units per layer
                    split = os.path.join(tmp, f"{name}.sub.json")
                    r = run("profile", "--analytic-config", path, "--seq", "256", "--opt", "units=sub-block", "-o", split)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertEqual(params(split), count(config))
                    with open(split) as f:
                        names = [u["name"] for u in json.load(f)["units"]]
                    self.assertEqual(names[1:3], ["block0.attn", "block0.mlp"])
                    # the simulator takes it: one step of stage 3 on 8 H100s
                    r = run("simulate", "--model", out, "--cluster", "h100-sxm-80gb", "--world-size", "8",
                            "--global-batch", "8", "--set", "zero_stage=3", "--json")
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertGreater(json.loads(r.stdout)["step_time_s"], 0)

    def test_analytic_llama_flags_and_refused_opts(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "l3.json")
            r = run("profile", "--analytic", "llama", "--layers", "32", "--hidden", "4096", "--heads", "32",
                    "--intermediate", "14336", "--vocab", "128256", "--seq", "512", "--opt", "kv_heads=8", "-o", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(params(out), count(CONFIGS["llama-3-8b"]))  # 8,030,261,248
            # the user who tuned a "Llama-3-8B" as --analytic gpt with --opt kv_heads=8,ffn=14336 got 7.51B
            r = run("profile", "--analytic", "gpt", "--layers", "32", "--hidden", "4096", "--heads", "32",
                    "--opt", "kv_heads=8,ffn=14336")
            self.assertEqual(r.returncode, 1)
            self.assertIn("not an option of --analytic gpt (options: tied, units, attention; a Llama-style model is "
                          "--analytic llama", r.stderr)
            r = run("profile", "--analytic", "gpt", "--opt", "kv_heads=8")
            self.assertIn("--opt kv_heads: not an option of --analytic gpt", r.stderr)
            r = run("profile", "--analytic", "llama", "--opt", "ffn=14336")
            self.assertEqual(r.returncode, 1)
            self.assertIn("--opt ffn: not an option of --analytic llama (options: kv_heads, head_dim, tied, qkv_bias, "
                          "attention", r.stderr)
            bad = os.path.join(tmp, "bert.json")
            with open(bad, "w") as f:
                json.dump({"model_type": "bert", "hidden_size": 768}, f)
            r = run("profile", "--analytic-config", bad)
            self.assertEqual(r.returncode, 1)
            self.assertIn('model_type "bert" is not read (read: gpt2, llama, mistral, qwen2, mpt)', r.stderr)

    def test_tune_llama3_8b_on_8_h100_prints_a_labelled_throughput(self):
        # The user: a Llama-3-8B config.json at sequence 4096 on 8 H100s. tune prints the plan, its
        # predicted tokens/s per GPU and MFU, and the calibration its time model used.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "config.json")
            with open(path, "w") as f:
                f.write(CONFIGS["llama-3-8b"].to_json_string())
            out = os.path.join(tmp, "l3.json")
            r = run("profile", "--analytic-config", path, "--seq", "4096", "--opt", "attention=flash", "-o", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            r = run("tune", "--model", out, "--cluster", "h100-sxm-80gb", "--global-batch", "64", "--top-k", "2")
            self.assertEqual(r.returncode, 0, r.stderr)
            m = re.search(r"best plan, predicted: ([0-9.]+) s per step, ([0-9]+) tokens/s per GPU, MFU ([0-9.]+)%",
                          r.stderr)
            self.assertIsNotNone(m, r.stderr)
            step, tokens, mfu = float(m.group(1)), int(m.group(2)), float(m.group(3))
            self.assertAlmostEqual(tokens, 64 * 4096 / step / 8, delta=1)
            self.assertTrue(20 < mfu < 70, mfu)  # published FSDP runs of such models: 35-57%
            self.assertRegex(r.stderr, r"time model: h100-sxm-80gb calibrated \(gemm_efficiency_scale [0-9.]+, "
                                       r"gemm_half_dim [0-9]+, attention_efficiency_scale [0-9.]+\): fitted by "
                                       r"`zeroplan calibrate` to [0-9]+ rows on h100_80gb of MosaicML llm-foundry")


if __name__ == "__main__":
    unittest.main()
