"""Models nobody on this project wrote (Hugging Face transformers, torchvision), built from configs with
random weights, and one hand-written model with a skip across its blocks and keyword arguments: the
factories `zeroplan profile --python tests/python/models.py:NAME` and the tests use. Each returns
(model, make_batch, loss_fn); make_batch(n) draws n samples from a generator of its own."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SEQ = 32
VOCAB = 256


def _tokens(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(1000 + n + seed)
    return torch.randint(0, VOCAB, (n, SEQ), generator=g)


def _causal_lm_loss(out, batch):
    logits = out.logits if hasattr(out, "logits") else out[0]
    ids = batch["input_ids"]
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


def llama():
    """A Llama-style causal LM (grouped-query attention, SwiGLU, RMSNorm, rotary positions, untied head)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2 * SEQ,
                      tie_word_embeddings=False, use_cache=False, attn_implementation="eager")
    model = LlamaForCausalLM(cfg)
    return model, (lambda n: {"input_ids": _tokens(n)}), _causal_lm_loss


def gpt2():
    """GPT-2 (tied token embedding and LM head)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=2 * SEQ, use_cache=False, bos_token_id=0, eos_token_id=0,
                     attn_implementation="eager")
    model = GPT2LMHeadModel(cfg)
    return model, (lambda n: {"input_ids": _tokens(n, 1)}), _causal_lm_loss


def _images(n: int, size: int, seed: int):
    g = torch.Generator().manual_seed(2000 + n + seed)
    return torch.randn(n, 3, size, size, generator=g), torch.randint(0, 10, (n,), generator=g)


def _classify_loss(out, batch):
    return F.cross_entropy(out, batch[1])


class _ImageModel(nn.Module):
    pass


def resnet():
    """torchvision ResNet-18 (10 classes) on 64 x 64 images."""
    from torchvision.models import resnet18
    torch.manual_seed(0)
    model = resnet18(num_classes=10)

    def make_batch(n):
        x, y = _images(n, 32, 0)
        return (x,), {}, y

    return _Labelled(model), (lambda n: _images(n, 64, 0)), _labelled_loss


def vit():
    """torchvision VisionTransformer (2 layers, 32 x 32 images, patch 8)."""
    from torchvision.models import VisionTransformer
    torch.manual_seed(0)
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=3, num_heads=2, hidden_dim=32, mlp_dim=64,
                              num_classes=10)
    return _Labelled(model), (lambda n: _images(n, 32, 1)), _labelled_loss


class _Labelled(nn.Module):
    """Calls the wrapped model on the image only: make_batch returns (images, labels)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images, labels=None):
        return self.model(images)


def _labelled_loss(out, batch):
    return F.cross_entropy(out, batch[1])


class SkipBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x, *, scale, mask=None):
        h = self.ff(self.norm(x)) * scale
        if mask is not None:
            h = h * mask.unsqueeze(-1)
        return x + h


class SkipNet(nn.Module):
    """A hand-written model: keyword arguments into every block (a scale from a root parameter, a mask),
    and a skip from the embedding across all the blocks into the head."""

    def __init__(self, features: int = 24, width: int = 48, layers: int = 3, classes: int = 5):
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.gate = nn.Parameter(torch.zeros(width))
        self.blocks = nn.ModuleList([SkipBlock(width) for _ in range(layers)])
        self.head = nn.Linear(width, classes)

    def forward(self, x, mask=None):
        h = self.embed(x)
        h0 = h
        scale = torch.sigmoid(self.gate)
        for block in self.blocks:
            h = block(h, scale=scale, mask=mask)
        return self.head(h + h0).mean(dim=1)


def skipnet():
    torch.manual_seed(0)

    def make_batch(n):
        g = torch.Generator().manual_seed(3000 + n)
        x = torch.randn(n, 16, 24, generator=g)
        mask = (torch.rand(n, 16, generator=g) > 0.1).float()
        return {"x": x, "mask": mask, "labels": torch.randint(0, 5, (n,), generator=g)}

    class Net(SkipNet):
        def forward(self, x, mask=None, labels=None):
            return super().forward(x, mask)

    return Net(), make_batch, (lambda out, batch: F.cross_entropy(out, batch["labels"]))


# Bad factories for the CLI's error tests.
def raises():
    raise RuntimeError("no GPU here, and this factory wants one")


def wrong_return():
    return nn.Linear(2, 2)


def bad_forward():
    model, _, loss = skipnet()
    return model, (lambda n: {"x": torch.randn(n, 16, 7)}), loss


def not_scalar():
    model, make_batch, _ = skipnet()
    return model, make_batch, (lambda out, batch: out)


def no_blocks():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return model, (lambda n: torch.randn(n, 4)), (lambda out, batch: out.sum())
