"""Capture and replay: one real training step records what each unit is called with; each unit is then
run alone on those inputs, so the C++ profiler measures it like a built-in unit.

The profile's units are the root's two segments and the blocks between them, in execution order:
  root:pre    the model's own forward from its batch up to the first block's input (embeddings,
              position tables, masks), replayed by running the model and stopping at the first block;
  blocks      each block on its captured inputs (positional and keyword: the attention mask, position
              embeddings, ...), its first tensor input replaced by the previous unit's output;
  root:post   the rest of the forward and the user's loss, replayed by running the model with every
              block (and every root module that only ran before the first block) returning what it
              returned in the captured step, the last block returning the previous unit's output.
A root parameter belongs to the segment whose modules use it (pre first): a tied embedding is owned by
root:pre and borrowed by root:post, counted once. Parameters held directly by the root or by a container
of the blocks (a position embedding, a class token) belong to root:pre.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable

import torch
from torch import nn

from ._errors import ZeroplanError, first_line
from ._units import Unit


class _Stop(Exception):
    def __init__(self, value):
        super().__init__("zeroplan: stop at the first unit")
        self.value = value


def split_batch(batch) -> tuple[tuple, dict]:
    """make_batch's result as (args, kwargs): a tensor, a tuple/list of args, a dict of kwargs, or
    (tuple, dict)."""
    if isinstance(batch, torch.Tensor):
        return (batch,), {}
    if isinstance(batch, dict):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)):
        if len(batch) == 2 and isinstance(batch[0], (tuple, list)) and isinstance(batch[1], dict):
            return tuple(batch[0]), dict(batch[1])
        return tuple(batch), {}
    raise ZeroplanError("bad_input", f"make_batch returned a {type(batch).__name__}; expected a tensor, a tuple of "
                        "arguments, a dict of keyword arguments, or (tuple, dict)")


def first_tensor(value) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, (tuple, list)):
        for v in value:
            t = first_tensor(v)
            if t is not None:
                return t
    return None


def map_tensors(value, fn):
    """A copy of `value` (tensor, tuple, namedtuple, list, dict, ModelOutput) with fn applied to each
    tensor in order; other leaves kept."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):  # ModelOutput is an OrderedDict subclass: keep its class
        items = {k: map_tensors(x, fn) for k, x in value.items()}
        try:
            return type(value)(**items)
        except TypeError:
            return items
    if isinstance(value, tuple):
        out = [map_tensors(x, fn) for x in value]
        return type(value)(*out) if hasattr(value, "_fields") else tuple(out)
    if isinstance(value, list):
        return [map_tensors(x, fn) for x in value]
    return value


def replace_first_tensor(value, new: torch.Tensor):
    """A copy of `value` with its first tensor replaced by `new`."""
    done = [False]

    def swap(t):
        if done[0]:
            return t
        done[0] = True
        return new

    return map_tensors(value, swap)


def detach_all(value):
    return map_tensors(value, lambda t: t.detach())


def primary_position(args: tuple, kwargs: dict) -> tuple[str, Any]:
    """Where a unit's first tensor input is: ("arg", index) or ("kw", name)."""
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            return "arg", i
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return "kw", k
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            return "kw", k
    raise ZeroplanError("bad_input", "a unit was called with no tensor argument")


@dataclasses.dataclass
class BlockCall:
    args: tuple
    kwargs: dict
    where: tuple[str, Any]
    output: Any

    def primary_input(self) -> torch.Tensor:
        kind, key = self.where
        return self.args[key] if kind == "arg" else self.kwargs[key]

    def with_input(self, x: torch.Tensor) -> tuple[tuple, dict]:
        kind, key = self.where
        if kind == "arg":
            args = list(self.args)
            args[key] = x
            return tuple(args), self.kwargs
        kwargs = dict(self.kwargs)
        kwargs[key] = x
        return self.args, kwargs


@dataclasses.dataclass
class Captured:
    """One batch size's captured step."""
    args: tuple
    kwargs: dict
    batch: Any
    blocks: list[BlockCall]
    pre_outputs: dict[str, Any]       # root modules that ran only before the first block -> output


def root_modules(model: nn.Module, blocks: list[Unit]) -> list[tuple[str, nn.Module]]:
    """The root's outermost modules outside the blocks: children of the root or of a container of the blocks."""
    block_names = [u.name for u in blocks]
    ancestors = {""}
    for name in block_names:
        parts = name.split(".")
        for i in range(1, len(parts)):
            ancestors.add(".".join(parts[:i]))
    out = []
    for name, module in model.named_modules():
        if name in ancestors or name in block_names:
            continue
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        if parent in ancestors:
            out.append((name, module))
    return out


def loss_of(loss_fn, output, batch) -> torch.Tensor:
    try:
        loss = loss_fn(output, batch)
    except Exception as e:  # noqa: BLE001 - the user's code: its own message, one line
        raise ZeroplanError("bad_input", f"loss_fn failed: {first_line(e)}") from e
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ZeroplanError("bad_input", f"loss_fn returned {shape}; expected a scalar tensor")
    return loss.float().reshape(())


def capture(model: nn.Module, chosen: list[Unit], batch, loss_fn) -> Captured:
    """Runs one real training step (forward, loss, backward) with hooks on the units; gradients are reset."""
    blocks = [u for u in chosen if not u.is_root]
    args, kwargs = split_batch(batch)
    calls: list[BlockCall | None] = [None] * len(blocks)
    order: list[tuple[str, int]] = []   # ("block", i) and ("root", j) in call order
    roots = root_modules(model, blocks)
    root_out: dict[str, Any] = {}
    handles = []

    def block_pre(i):
        def hook(module, a, k):
            calls[i] = BlockCall(detach_all(a), detach_all(k), primary_position(a, k), None)
            order.append(("block", i))
        return hook

    def block_post(i):
        def hook(module, a, k, out):
            if calls[i] is not None:
                calls[i].output = detach_all(out)
        return hook

    def root_post(j, name):
        def hook(module, a, out):
            order.append(("root", j))
            root_out.setdefault(name, detach_all(out))
        return hook

    try:
        for i, u in enumerate(blocks):
            handles.append(u.module.register_forward_pre_hook(block_pre(i), with_kwargs=True))
            handles.append(u.module.register_forward_hook(block_post(i), with_kwargs=True))
        for j, (name, m) in enumerate(roots):
            handles.append(m.register_forward_hook(root_post(j, name)))
        try:
            out = model(*args, **kwargs)
        except ZeroplanError:
            raise
        except Exception as e:  # noqa: BLE001
            raise ZeroplanError("bad_input", f"the model's forward failed on make_batch's batch: {first_line(e)}") from e
        loss = loss_of(loss_fn, out, batch)
        loss.backward()
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    missing = [blocks[i].name for i, c in enumerate(calls) if c is None]
    if missing:
        raise ZeroplanError("bad_input", f"units {', '.join(missing)} did not run in the model's forward")
    first_block = next(k for k, (kind, _) in enumerate(order) if kind == "block")
    last_block = max(k for k, (kind, _) in enumerate(order) if kind == "block")
    before = {roots[j][0] for k, (kind, j) in enumerate(order) if kind == "root" and k < first_block}
    after = {roots[j][0] for k, (kind, j) in enumerate(order) if kind == "root" and k > last_block}
    between = {roots[j][0] for k, (kind, j) in enumerate(order)
               if kind == "root" and first_block < k < last_block}
    pre_only = {n: root_out[n] for n in before if n not in after and n not in between}
    cap = Captured(args, kwargs, batch, calls, pre_only)  # type: ignore[arg-type]
    cap.before, cap.after = before, after  # type: ignore[attr-defined]
    return cap


@contextlib.contextmanager
def patched_forwards(stubs: dict[nn.Module, Callable]):
    """Each module's forward replaced by its stub for the duration (hooks still run)."""
    try:
        for m, f in stubs.items():
            m.forward = f
        yield
    finally:
        for m in stubs:
            try:
                del m.forward
            except AttributeError:
                pass


class Replays:
    """The replay callables of every profile unit, each choosing the captured batch by its input's shape.
    Replays run one at a time (a lock): root:post swaps the blocks' forwards for the duration, and the
    profiler's concurrent ranks (threads) would otherwise run a block's stub for the block."""

    def __init__(self, model: nn.Module, chosen: list[Unit], loss_fn, captured: dict[int, Captured],
                 autocast: torch.dtype | None = None, device_type: str = "cpu"):
        # autocast: the units compute in this dtype on their fp32 parameters (torch.autocast), as a
        # mixed-precision step runs them; None: in the parameters' dtype
        self.autocast, self.device_type = autocast, device_type
        self.lock = threading.RLock()
        self.model = model
        self.blocks = [u for u in chosen if not u.is_root]
        self.loss_fn = loss_fn
        self.captured = captured
        self.root_by_name = dict(model.named_modules())
        first = next(iter(captured.values()))
        self._by_input = {tuple(first_tensor(c.args + tuple(c.kwargs.values())).shape): c for c in captured.values()}
        self._by_block = [{tuple(c.blocks[i].primary_input().shape): c for c in captured.values()}
                          for i in range(len(self.blocks))]
        self._by_last = {tuple(first_tensor(c.blocks[-1].output).shape): c for c in captured.values()}
        del first

    def make_input(self, batch: int) -> torch.Tensor:
        c = self.captured[batch]
        return first_tensor(c.args + tuple(c.kwargs.values()))

    def _context(self):
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast)

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        with self.lock, self._context():
            return self._pre(x)

    def _pre(self, x: torch.Tensor) -> torch.Tensor:
        c = self._by_input[tuple(x.shape)]

        def stop(module, a, k):
            kind, key = primary_position(a, k)
            raise _Stop(a[key] if kind == "arg" else k[key])

        args, kwargs = replace_first_tensor((c.args, c.kwargs), x)  # the unit's input is the profiler's copy
        h = self.blocks[0].module.register_forward_pre_hook(stop, with_kwargs=True)
        try:
            self.model(*args, **kwargs)
        except _Stop as s:
            return s.value
        finally:
            h.remove()
        raise ZeroplanError("bad_input", f"unit {self.blocks[0].name} did not run in the model's forward")

    def block(self, i: int) -> Callable[[torch.Tensor], torch.Tensor]:
        module = self.blocks[i].module
        table = self._by_block[i]

        def run(x: torch.Tensor) -> torch.Tensor:
            c = table[tuple(x.shape)]
            a, k = c.blocks[i].with_input(x)
            with self.lock, self._context():
                return first_tensor(module(*a, **k))
        return run

    def post(self, x: torch.Tensor) -> torch.Tensor:
        with self.lock, self._context():
            return self._post(x)

    def _post(self, x: torch.Tensor) -> torch.Tensor:
        c = self._by_last[tuple(x.shape)]
        stubs: dict[nn.Module, Callable] = {}
        for i, u in enumerate(self.blocks):
            out = c.blocks[i].output
            if i == len(self.blocks) - 1:
                out = replace_first_tensor(out, x)
            stubs[u.module] = (lambda o: (lambda *a, **k: o))(out)
        for name, out in c.pre_outputs.items():
            stubs[self.root_by_name[name]] = (lambda o: (lambda *a, **k: o))(out)
        with patched_forwards(stubs):
            out = self.model(*c.args, **c.kwargs)
        return loss_of(self.loss_fn, out, c.batch)


def root_split(model: nn.Module, chosen: list[Unit], cap: Captured):
    """The root's parameters and buffers for root:pre and root:post, and the names root:post borrows."""
    blocks = [u for u in chosen if not u.is_root]
    in_blocks = {id(t) for u in blocks for t in list(u.module.parameters()) + list(u.module.buffers())}
    modules = dict(model.named_modules())

    def ids(names):
        return {id(t) for n in names for t in list(modules[n].parameters()) + list(modules[n].buffers())}

    used_before, used_after = ids(cap.before), ids(cap.after)  # type: ignore[attr-defined]
    pre, post, borrowed = [], [], []
    for kind, named in (("param", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in named:
            if id(t) in in_blocks:
                continue
            owner_mod = name.rsplit(".", 1)[0] if "." in name else ""
            direct_on_container = owner_mod not in modules or not any(
                owner_mod == n or owner_mod.startswith(n + ".") for n in cap.before | cap.after)  # type: ignore[attr-defined]
            if id(t) in used_before or (direct_on_container and id(t) not in used_after):
                pre.append((kind, name, t))
                if id(t) in used_after and kind == "param":
                    borrowed.append(name)
            else:
                post.append((kind, name, t))
    return pre, post, borrowed
