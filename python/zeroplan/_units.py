"""Units of any nn.Module, chosen the way FSDP users choose wrap units.

policy="auto" picks the repeated blocks: the children of an nn.ModuleList / nn.Sequential that share one
class (at least two of them), as FSDP's transformer auto-wrap policy wraps the decoder layers; the
container with the most parameters in such blocks wins (a model's decoder layers, not its two-layer MLP
inside each block). A list policy names classes (types or class names) or module names. Everything not
inside a block belongs to the root unit (embeddings, final norm, head). A parameter shared by several
modules (a tied embedding and head) is counted once, by the first unit that holds it.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Iterable, Sequence

import torch
from torch import nn

from ._errors import ZeroplanError


@dataclasses.dataclass
class Unit:
    name: str                    # the module's name in the model ("model.layers.3"); "" for the root
    type: str                    # its class name
    module: nn.Module
    params: int                  # parameters it owns (a shared one counted in its first unit only)

    @property
    def is_root(self) -> bool:
        return self.name == ""


def _repeated_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    # Candidates: children of a ModuleList / Sequential that holds at least two of their class. Grouped
    # by class over the whole model (ResNet's BasicBlocks sit in four Sequentials); the class with the
    # most parameters wins, and a block inside another chosen block is left to its outer block.
    by_class: dict[type, list[tuple[str, nn.Module]]] = {}
    for prefix, container in model.named_modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        counts: dict[type, int] = {}
        for _, child in container.named_children():
            counts[type(child)] = counts.get(type(child), 0) + 1
        for name, child in container.named_children():
            cls = type(child)
            # a block is made of modules (a decoder layer, a ResNet block), not a single layer
            leaf = next(child.children(), None) is None
            if counts[cls] >= 2 and not leaf and cls not in (nn.ModuleList, nn.Sequential):
                by_class.setdefault(cls, []).append((f"{prefix}.{name}" if prefix else name, child))
    best: list[tuple[str, nn.Module]] = []
    best_params = 0
    for cls, blocks in by_class.items():
        n = sum(p.numel() for _, b in blocks for p in b.parameters())
        if n > best_params:
            best, best_params = blocks, n
    return best


def _by_policy(model: nn.Module, policy: Sequence) -> list[tuple[str, nn.Module]]:
    classes = [p for p in policy if isinstance(p, type)]
    class_names = {p for p in policy if isinstance(p, str)}
    modules = dict(model.named_modules())
    found: list[tuple[str, nn.Module]] = []
    matched: set = set()
    for name, module in model.named_modules():
        if name == "":
            continue
        hit = None
        if any(isinstance(module, c) for c in classes):
            hit = type(module)
        elif type(module).__name__ in class_names:
            hit = type(module).__name__
        elif name in class_names:
            hit = name
        if hit is None:
            continue
        if any(name.startswith(outer + ".") for outer, _ in found):
            continue  # inside a unit already chosen: FSDP's nesting keeps the outer unit
        matched.add(hit)
        found.append((name, module))
    for p in policy:
        if p not in matched and not (isinstance(p, str) and p in modules):
            what = p.__name__ if isinstance(p, type) else p
            raise ZeroplanError(
                "bad_input",
                f"units: no module of class or name {what!r} in {type(model).__name__} "
                f"(classes with parameters: {', '.join(sorted(_classes_with_params(model)))})")
    return found


def _classes_with_params(model: nn.Module) -> set[str]:
    return {type(m).__name__ for m in model.modules() if any(True for _ in m.parameters(recurse=False))}


def units(model: nn.Module, policy: str | Iterable = "auto") -> list[Unit]:
    """The model's units: the root first (everything outside the blocks), then the blocks in module
    order. policy: "auto" (repeated blocks), or classes / class names / module names."""
    if not isinstance(model, nn.Module):
        raise ZeroplanError("bad_input", f"units: expected an nn.Module, got {type(model).__name__}")
    if isinstance(policy, str) and policy == "auto":
        blocks = _repeated_blocks(model)
        if not blocks:
            raise ZeroplanError(
                "bad_input",
                f"units: policy 'auto' found no repeated blocks in {type(model).__name__} (no ModuleList or "
                f"Sequential holds two composite children of one class with parameters); name the unit classes, e.g. "
                f"policy=[{', '.join(repr(c) for c in sorted(_classes_with_params(model))[:3])}]")
    else:
        if isinstance(policy, (str, type)):
            policy = [policy]
        blocks = _by_policy(model, list(policy))
    seen: set[int] = set()
    out: list[Unit] = []

    def owned(module: nn.Module) -> int:
        n = 0
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        return n

    block_out = [Unit(name, type(m).__name__, m, owned(m)) for name, m in blocks]
    root_params = owned(model)  # what is left: not in any block
    return [Unit("", type(model).__name__, model, root_params)] + block_out


def format_units(chosen: list[Unit]) -> str:
    """The choice as a table: unit, class, parameters."""
    rows = [("unit", "class", "parameters")]
    for u in chosen:
        rows.append((u.name or "(root)", u.type, f"{u.params:,}"))
    rows.append(("total", "", f"{sum(u.params for u in chosen):,}"))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}" for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def print_units(chosen: list[Unit], file=None) -> None:
    print(format_units(chosen), file=file or sys.stderr)


def root_parameters(model: nn.Module, chosen: list[Unit]) -> list[tuple[str, torch.nn.Parameter]]:
    """The root unit's parameters by name: those of the model that no block holds."""
    in_blocks = {id(p) for u in chosen if not u.is_root for p in u.module.parameters()}
    return [(n, p) for n, p in model.named_parameters() if id(p) not in in_blocks]
