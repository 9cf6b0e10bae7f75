"""zeroplan.wrap: any nn.Module trained under a plan inside its own forward, in the user's own loop.

    engine = zeroplan.wrap(model, plan, optimizer="adam", lr=1e-3)   # under torchrun, or one process
    for batch in loader:
        out = engine(**batch)                # the model's forward: parameters gathered per unit
        engine.backward(loss_fn(out, batch)) # gradients reduced as each unit's backward completes
        engine.step()                        # the optimizer step, once every plan.microbatches calls

The plan's pieces (zeroplan's C++ executor: parameter residency, gradient sync, activation offload,
precision, optimizer on the flat shards, LocalSGD/SlowMo/AdaScale, checkpoints) are driven by hooks at the
unit boundaries (exec/include/zeroplan/exec/hook_driver.h): the same pieces `zeroplan run` drives unit by
unit for the built-in models. Units are chosen as zeroplan.units chooses them (the repeated blocks);
everything else is the root, split into root:pre (the modules registered before the first block, and
parameters held directly by the root) and root:post (those registered after it), as zeroplan.profile
names them. A weight the root's post part shares with its pre part (a tied embedding and head) is owned
by root:pre and borrowed by root:post.
"""
from __future__ import annotations

import contextlib
import json
from typing import Any, Iterable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as _torch_checkpoint

from . import _C
from ._capture import first_tensor, map_tensors
from ._errors import ZeroplanError
from ._session import LocalShard, _plan_json, session
from ._profile import _training_mode
from ._units import Unit, units as choose_units

_DTYPES = {"Float": torch.float32, "BFloat16": torch.bfloat16, "Half": torch.float16}


def _root_split(model: nn.Module, blocks: list[Unit]):
    """root:pre and root:post by registration order around the blocks: (kind, name, tensor) lists."""
    in_blocks = {id(t) for u in blocks for t in list(u.module.parameters()) + list(u.module.buffers())}
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    last_block = max(blocks, key=lambda u: order[u.name])
    # Everything registered inside the last block's subtree counts as before its end.
    last_end = max(i for name, i in order.items() if name == last_block.name or name.startswith(last_block.name + "."))
    pre, post = [], []
    for kind, named in (("param", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in named:
            if id(t) in in_blocks:
                continue
            owner = name.rsplit(".", 1)[0] if "." in name else ""
            # Registered after the last block, and not held directly by the root or a container of the
            # blocks: root:post; everything else root:pre.
            container = owner == "" or any(u.name.startswith(owner + ".") for u in blocks)
            after = order.get(owner, 0) > last_end and not container
            (post if after else pre).append((kind, name, t))
    return pre, post


class Engine:
    """A model wrapped under a plan (see the module's docstring). Use zeroplan.wrap to make one."""

    def __init__(self, model: nn.Module, plan, *, optimizer: str | None = None, lr: float | None = None,
                 weight_decay: float | None = None, policy: str | Iterable = "auto", device: str = "cpu",
                 state_dict: dict | None = None, ranks_per_node: int = 0, timeout_s: float = 0.0,
                 trace: bool = False, memory_limit: int = 0):
        if not isinstance(model, nn.Module):
            raise ZeroplanError("bad_input", f"wrap: expected an nn.Module, got {type(model).__name__}")
        plan_json = _plan_json(plan, optimizer, lr, weight_decay)
        self.plan = json.loads(plan_json)
        self.model = model
        self.device = device
        if state_dict is not None:
            model.load_state_dict(state_dict)
        if device != "cpu":
            model.to(device)
        _training_mode(model)
        chosen = choose_units(model, policy)
        self.blocks = [u for u in chosen if not u.is_root]
        if not self.blocks:
            raise ZeroplanError("bad_input", "wrap: no units besides the root (policy found no repeated blocks)")
        specs = self._specs(model)
        self.session = session(device, timeout_s)
        try:
            self.driver = _C.Driver(self.session, specs, plan_json, device, ranks_per_node, trace, memory_limit)
        except _C.OutOfDeviceMemory as e:
            raise ZeroplanError("run_failed", f"wrap: {e}") from None
        except _C.ExecError as e:
            raise ZeroplanError("not_possible", f"wrap: {e}") from None
        except _C.CommError as e:
            raise ZeroplanError("run_failed", f"wrap: {e}") from None
        self.microbatches = self.driver.microbatches
        self.compute_dtype = _DTYPES[self.driver.compute_dtype]
        self.param_dtype = _DTYPES[self.driver.param_dtype]
        self._micro = 0
        self._step = 0
        self._in_backward = False
        self._capture = None
        self._handles: list = []
        self._forwards: dict[nn.Module, Any] = {}
        self._install()

    # --- units ---------------------------------------------------------------------------------------
    def _specs(self, model: nn.Module) -> list[dict]:
        pre, post = _root_split(model, self.blocks)
        n = len(self.blocks) + 2
        self.unit_names = ["root:pre"] + [u.name for u in self.blocks] + ["root:post"]
        members: list[list[tuple[str, torch.Tensor]]] = [[] for _ in range(n)]
        buffers: list[list[tuple[str, torch.Tensor]]] = [[] for _ in range(n)]
        for kind, name, t in pre:
            (members if kind == "param" else buffers)[0].append((name, t))
        for i, u in enumerate(self.blocks):
            members[i + 1] = list(u.module.named_parameters(remove_duplicate=False))
            buffers[i + 1] = list(u.module.named_buffers())
        for kind, name, t in post:
            (members if kind == "param" else buffers)[n - 1].append((name, t))
        # A parameter of root:pre that a module registered after the blocks uses too (a tied embedding
        # and head) is borrowed by root:post.
        order = {m: i for i, (m, _) in enumerate(model.named_modules())}
        last = max(order[b.name] for b in self.blocks)
        later_ids = {id(p) for name, p in model.named_parameters(remove_duplicate=False)
                     if order.get(name.rsplit(".", 1)[0] if "." in name else "", 0) > last}
        owner_of: dict[int, tuple[int, str]] = {}
        specs = []
        self._own: list[dict[str, torch.Tensor]] = []
        for u in range(n):
            own, borrowed = [], []
            for name, p in members[u]:
                if id(p) in owner_of:
                    o, oname = owner_of[id(p)]
                    if o != u and (o, oname) not in borrowed:
                        borrowed.append((o, oname))
                    continue
                owner_of[id(p)] = (u, name)
                own.append((name, p))
            if u == n - 1:
                for name, p in self._own[0].items():
                    if id(p) in later_ids and (0, name) not in borrowed:
                        borrowed.append((0, name))
            kind = type(model).__name__ if u in (0, n - 1) else self.blocks[u - 1].type
            specs.append({"name": self.unit_names[u], "type": kind, "params": own, "buffers": buffers[u],
                          "borrowed": borrowed})
            self._own.append(dict(own))
        return specs

    def _install(self) -> None:
        d = self.driver
        n = d.unit_count
        self._expected = [0] * n
        for u in range(n):
            for slot, name in enumerate(d.param_names(u)):
                p = self._own[u][name]
                if p.requires_grad:
                    self._expected[u] += 1
                    self._handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(u, slot)))
        self._remaining = list(self._expected)
        self._seen = [0] * n
        self._stash: list[list] = [[] for _ in range(n)]
        self._in_place = self.driver.grads_in_place
        self._handles.append(self.model.register_forward_pre_hook(self._root_pre, with_kwargs=True))
        self._handles.append(self.model.register_forward_hook(self._root_post, with_kwargs=True))
        for i, b in enumerate(self.blocks):
            u = i + 1
            self._handles.append(b.module.register_forward_pre_hook(self._block_pre(u), with_kwargs=True))
            self._handles.append(b.module.register_forward_hook(self._block_post(u), with_kwargs=True))
            if d.checkpointed(u):
                orig = b.module.forward
                self._forwards[b.module] = orig

                def recomputed(*a, __orig=orig, **k):
                    return _torch_checkpoint(__orig, *a, use_reentrant=False, preserve_rng_state=True, **k)
                b.module.forward = recomputed

    # --- hooks ---------------------------------------------------------------------------------------
    def _grad_hook(self, u: int, slot: int):
        # Under Plan::grads_in_place (stages 0-1, no AdaScale) each gradient goes into the unit's region, which lives all step, as soon
        # as autograd has made it, and is freed: the step driver's in-place accumulation, one parameter's
        # gradient at a time (the profile's bytes_peak_bwd_in_place). Otherwise a unit's gradients are held
        # as autograd made them until its backward is done, then added into its gradient region together
        # (allocated then, at stages 2-3), as the step driver adds what autograd.grad returns at the end of a
        # unit's backward. The same memory at every point as the step driver's, which the simulator predicts.
        def hook(p: torch.Tensor) -> None:
            g = p.grad
            p.grad = None
            if g is None:
                return
            if self._in_place:
                self.driver.accumulate(u, slot, g)
                del g
            else:
                self._stash[u].append((slot, g))
            self._seen[u] += 1
            self._remaining[u] -= 1
            if self._remaining[u] == 0:
                self._finish_unit(u)
        return hook

    def _finish_unit(self, u: int) -> None:
        stash, self._stash[u] = self._stash[u], []
        for slot, g in stash:
            self.driver.accumulate(u, slot, g)
        stash = g = None  # the gradients go before the unit's reduction
        self.driver.backward_done(u)

    def _backward_starts(self) -> None:
        if self._in_backward:
            return
        self._in_backward = True
        self._remaining = list(self._expected)
        self._seen = [0] * len(self._expected)
        torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _end_backward(self) -> None:
        for u in reversed(range(len(self._stash))):  # units with a parameter that got no gradient
            if 0 < self._seen[u] and self._remaining[u] > 0:
                self._finish_unit(u)
        self.driver.end_backward()
        # Parameters that got no gradient this time (unused in the forward) are not waited for again.
        self._expected = [min(e, s) if s > 0 else e for e, s in zip(self._expected, self._seen)]
        self._in_backward = False

    def _pre_backward(self, u: int, outputs) -> None:
        tensors = []
        map_tensors(outputs, lambda t: tensors.append(t) if t.requires_grad else None)
        if not tensors:
            return

        def fn(_grads):
            self._backward_starts()
            self.driver.before_backward(u)
        torch.autograd.graph.register_multi_grad_hook(tensors, fn, mode="any")

    def _root_pre(self, module, args, kwargs):
        if self._micro >= self.microbatches:
            raise ZeroplanError("bad_input", f"engine: microbatch {self._micro + 1} of a plan with "
                                f"{self.microbatches}: call engine.step() after every backward")
        self.driver.begin_forward(self._micro, self._step)
        self.driver.before_forward(0)
        if self.driver.offload_on:
            self.driver.begin_capture(0)
        if self.param_dtype != torch.float32 or self.driver.autocast:
            cast = lambda t: t.to(self.compute_dtype) if t.is_floating_point() else t  # noqa: E731
            return map_tensors(args, cast), map_tensors(kwargs, cast)
        return None

    def _block_pre(self, u: int):
        def hook(module, args, kwargs):
            if u == 1:
                if self.driver.offload_on:
                    empty = torch.empty(0)
                    self.driver.end_capture(0, empty, empty)
                self.driver.after_forward(0)
            self.driver.before_forward(u)
            x = first_tensor(tuple(args) + tuple(kwargs.values())) if self.driver.offload_on else None
            if self.driver.offload_on and torch.is_grad_enabled() and \
                    self.driver.begin_capture(u, x):
                ctx = torch.autograd.graph.saved_tensors_hooks(self.driver.pack, lambda packed: packed.unpack())
                ctx.__enter__()
                self._capture = (u, ctx, x)
        return hook

    def _block_post(self, u: int):
        def hook(module, args, kwargs, out):
            if self._capture is not None and self._capture[0] == u:
                _, ctx, x = self._capture
                ctx.__exit__(None, None, None)
                self._capture = None
                y = first_tensor(out)
                self.driver.end_capture(u, x if x is not None else torch.empty(0),
                                        y if y is not None else torch.empty(0))
            self.driver.after_forward(u)
            if torch.is_grad_enabled():
                self._pre_backward(u, out)
            if u == len(self.blocks):
                self.driver.before_forward(u + 1)
        return hook

    def _root_post(self, module, args, kwargs, out):
        last = self.driver.unit_count - 1
        self.driver.after_forward(last)
        if torch.is_grad_enabled():
            self._pre_backward(last, out)
        else:
            self.driver.end_eval()
        return None

    # --- the loop ------------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        ctx = (torch.autocast(self.device.split(":")[0], dtype=self.compute_dtype) if self.driver.autocast
               else contextlib.nullcontext())
        with ctx:
            return self.model(*args, **kwargs)

    forward = __call__

    def backward(self, loss: torch.Tensor) -> None:
        """loss: this microbatch's mean loss. Its gradient, scaled for the ranks and microbatches."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ZeroplanError("bad_input", "engine.backward: expected the scalar loss")
        (loss.float().reshape(()) * self.driver.backward_scale()).backward()
        self._micro += 1

    def step(self) -> dict | None:
        """The optimizer step once plan.microbatches backwards ran (else nothing): its stats."""
        if self._micro < self.microbatches:
            return None
        try:
            stats = self.driver.step()
        except (_C.ExecError, _C.CommError) as e:
            raise ZeroplanError("run_failed", f"engine.step: {e}") from None
        self._micro = 0
        self._step += 1
        self.session.set_step(self._step)
        return stats

    @property
    def global_step(self) -> int:
        return self._step

    # --- states --------------------------------------------------------------------------------------
    def state_dict(self, sharded: bool = False) -> dict[str, Any]:
        """Parameters and buffers in the model's own names, on the CPU, parameters in fp32 (the master).
        Full (default): every parameter whole (collective at stage 3: every rank calls). sharded=True: no
        communication; each parameter a LocalShard, the elements of this rank's shard (FSDP's sharded state
        dict, flat-sharded as zeroplan shards a unit); the ranks' shards by offset make the whole."""
        by_id: dict[int, Any] = {}
        if sharded:
            local = {name: LocalShard(values, offset, torch.Size(shape))
                     for name, shape, offset, values in self.driver.local_shards()}
        else:
            local = {name: t.float() for name, t in self.driver.full_parameters()}
        for u, name in enumerate(self.unit_names):
            for pname, p in self._own[u].items():
                by_id[id(p)] = local[f"{name}.{pname}"]
        return {key: by_id[id(t)] if id(t) in by_id else t.detach().clone()
                for key, t in self.model.state_dict(keep_vars=True).items()}

    def save_checkpoint(self, path: str) -> None:
        """This rank's shards of parameters, master and optimizer state into path/step-<N>/ (collective)."""
        self.driver.save_checkpoint(str(path), self._step)

    def load_checkpoint(self, path: str, other_run: bool = False) -> int:
        """The newest checkpoint under path, resharded for this plan; returns (and resumes at) its step.
        A checkpoint of another run (model, seed or global batch) is refused unless other_run."""
        try:
            self._step = int(self.driver.load_checkpoint(str(path), bool(other_run)))
        except _C.ExecError as e:
            raise ZeroplanError("bad_input", f"engine.load_checkpoint: {e}") from None
        return self._step

    def peak_bytes(self) -> int:
        return self.driver.peak_bytes()

    def host_peak_bytes(self) -> int:
        return self.driver.host_peak_bytes()

    def reset_peak(self) -> None:
        self.driver.reset_peak()

    def close(self) -> None:
        """Hooks removed and forwards restored (the parameters stay views of the engine's buffers)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for m, f in self._forwards.items():
            m.forward = f
        self._forwards.clear()
        self.driver = None  # the pieces and their device go now, not when the engine is collected


def wrap(model: nn.Module, plan, **kwargs) -> Engine:
    """Trains `model` under `plan` in its own forward: see Engine and the module's docstring."""
    return Engine(model, plan, **kwargs)
