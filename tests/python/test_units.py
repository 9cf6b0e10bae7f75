"""zeroplan.units on models nobody here wrote: the repeated blocks as FSDP's transformer wrap policy picks
them, the rest in the root, shared parameters counted once."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import models  # noqa: E402
import zeroplan  # noqa: E402


def total(model):
    return sum(p.numel() for p in model.parameters())


class UnitsTest(unittest.TestCase):
    def check(self, factory, block_class, blocks):
        model, _, _ = factory()
        chosen = zeroplan.units(model)
        self.assertTrue(chosen[0].is_root)
        self.assertEqual([u.type for u in chosen[1:]], [block_class] * blocks)
        self.assertEqual(sum(u.params for u in chosen), total(model))
        table = zeroplan.format_units(chosen)
        self.assertIn(block_class, table)
        self.assertIn(f"{total(model):,}", table.splitlines()[-1])
        return model, chosen

    def test_llama(self):
        _, chosen = self.check(models.llama, "LlamaDecoderLayer", 3)
        self.assertEqual(chosen[1].name, "model.layers.0")

    def test_gpt2_tied_counted_once(self):
        model, chosen = self.check(models.gpt2, "GPT2Block", 3)
        self.assertIs(model.lm_head.weight, model.transformer.wte.weight)
        # the tied matrix is in the root once: the model's own count (named_parameters dedups) matches
        self.assertEqual(chosen[0].params, total(model) - sum(u.params for u in chosen[1:]))

    def test_resnet_blocks_across_stages(self):
        self.check(models.resnet, "BasicBlock", 8)

    def test_vit(self):
        self.check(models.vit, "EncoderBlock", 3)

    def test_custom(self):
        self.check(models.skipnet, "SkipBlock", 3)

    def test_policy_by_class_name_and_module_name(self):
        model, _, _ = models.llama()
        by_class = zeroplan.units(model, policy=["LlamaMLP"])
        self.assertEqual([u.type for u in by_class[1:]], ["LlamaMLP"] * 3)
        by_name = zeroplan.units(model, policy=["model.layers.1", "lm_head"])
        self.assertEqual([u.name for u in by_name[1:]], ["model.layers.1", "lm_head"])
        self.assertEqual(sum(u.params for u in by_name), total(model))

    def test_bad_policies(self):
        model, _, _ = models.no_blocks()
        with self.assertRaises(zeroplan.ZeroplanError) as e:
            zeroplan.units(model)
        self.assertIn("found no repeated blocks", str(e.exception))
        self.assertEqual(e.exception.exit_code, 1)
        model, _, _ = models.llama()
        with self.assertRaises(zeroplan.ZeroplanError) as e:
            zeroplan.units(model, policy=["GPT2Block"])
        self.assertIn("no module of class or name 'GPT2Block' in LlamaForCausalLM", str(e.exception))


if __name__ == "__main__":
    unittest.main()
