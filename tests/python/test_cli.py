"""`zeroplan profile --python FILE:FACTORY`: a model nobody here wrote through the CLI, then `simulate` on
the profile it wrote; every bad input gives one line, exit code 1 and no traceback."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("ZEROPLAN_BUILD_DIR", os.path.join(HERE, "..", "..", "build"))
ZEROPLAN = os.path.join(BUILD, "zeroplan")
MODELS = os.path.join(HERE, "models.py")


def run(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([ZEROPLAN, *args], capture_output=True, text=True, env=env, timeout=600)


class CliTest(unittest.TestCase):
    def test_profile_then_simulate(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "llama.json")
            r = run("profile", "--python", f"{MODELS}:llama", "--batches", "1,2", "--repeats", "1", "--warmup", "0",
                    "--threads", "1", "-o", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("LlamaDecoderLayer", r.stderr)  # the unit table
            doc = json.load(open(out))
            self.assertEqual([u["name"] for u in doc["units"]][1:4], [f"model.layers.{i}" for i in range(3)])
            r = run("simulate", "--model", out, "--cluster", "a100-sxm-80gb", "--world-size", "2",
                    "--global-batch", "4", "--set", "zero_stage=3", "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            pred = json.loads(r.stdout)
            self.assertGreater(pred["device"]["peak_bytes"], 0)

    def test_autopilot_profiles_tunes_and_says_where_it_stops(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "ap")
            r = run("autopilot", "--python", f"{MODELS}:llama", "--cluster", "a100-sxm-80gb", "--global-batch", "4",
                    "-o", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("running a --python model under a plan needs the hook driver", r.stderr)
            self.assertTrue(os.path.getsize(os.path.join(out, "tune", "report.md")) > 0)
            with open(os.path.join(out, "model_profile.json")) as f:
                doc = json.load(f)
            self.assertEqual(doc["concurrent_ranks"], 2)
            r = run("run", "--python", f"{MODELS}:skipnet", "--nproc", "2")
            self.assertEqual(r.returncode, 2)
            self.assertIn("needs the hook driver", r.stderr)

    def test_trace_of_a_python_profile(self):
        with tempfile.TemporaryDirectory() as tmp:
            trace, out = os.path.join(tmp, "trace.json"), os.path.join(tmp, "p.json")
            r = run("profile", "--python", f"{MODELS}:skipnet", "--batches", "1,2", "--repeats", "2", "--trace", trace,
                    "-o", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(trace) as f:
                events = json.load(f)["traceEvents"]
            names = {e["name"] for e in events if e.get("ph") == "X"}
            for unit in ("root:pre", "blocks.0", "blocks.2", "root:post"):
                self.assertIn(f"forward {unit}", names)
                self.assertIn(f"backward {unit}", names)

    def test_bad_inputs_one_line(self):
        cases = [
            ("raises", "raises() failed: RuntimeError: no GPU here"),
            ("wrong_return", "expected (model, make_batch, loss_fn)"),
            ("bad_forward", "the model's forward failed on make_batch's batch: RuntimeError"),
            ("not_scalar", "loss_fn returned [1, 5]; expected a scalar tensor"),
            ("no_blocks", "policy 'auto' found no repeated blocks in Sequential"),
            ("nothing_here", "has no function nothing_here"),
        ]
        for factory, expected in cases:
            with self.subTest(factory):
                r = run("profile", "--python", f"{MODELS}:{factory}", "--batches", "1", "--repeats", "1")
                self.assertEqual(r.returncode, 1, r.stderr)
                lines = [l for l in r.stderr.splitlines() if l.startswith("zeroplan profile:")]
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertIn(expected, lines[0])
                self.assertNotIn("Traceback", r.stderr)
        r = run("profile", "--python", f"{MODELS}:llama", "--units", "NoSuchBlock", "--batches", "1")
        self.assertEqual(r.returncode, 1)
        self.assertIn("no module of class or name 'NoSuchBlock' in LlamaForCausalLM", r.stderr)
        r = run("profile", "--python", "missing.py:f")
        self.assertEqual(r.returncode, 1)
        self.assertIn("no file missing.py", r.stderr)


if __name__ == "__main__":
    unittest.main()
