"""zeroplan.record: a RunRecord of any training loop (plain PyTorch, DDP, FSDP2), so `zeroplan compare`
judges a prediction against a run zeroplan did not execute.

    with zeroplan.record("run.json", model=model, optimizer=opt, global_batch=8) as rec:
        for batch in loader:
            loss = loss_fn(model(batch), batch); loss.backward(); opt.step(); opt.zero_grad()
            rec.loss(loss)

A step ends at each optimizer.step() (a post-step hook); its time is from the previous step's end (the
first: from entering the block). Peak memory per rank: on CUDA the caching allocator's peak of allocated
bytes; on the CPU a counting allocator installed for the block (zeroplan._C.CpuMeter) plus the CPU tensors
the model and optimizer held when the block was entered (their parameters, gradients and state, and what a
library keeps beside them: pass DeepSpeed's engine as the model), as CUDA's peak counts what was live.
Under torch.distributed every rank measures its own; rank 0 gathers them and writes the file.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time
import types

import torch
import torch.distributed as dist

from . import _C
from ._errors import ZeroplanError


_LEAVES = (str, bytes, int, float, complex, bool, type(None), type, types.ModuleType, types.FunctionType,
           types.BuiltinFunctionType, types.MethodType, torch.dtype, torch.device)


def _held_cpu_bytes(*roots, limit: int = 200_000) -> int:
    """The CPU tensor bytes held by the training objects handed to the record when its block is entered, as
    CUDA's allocated bytes count everything live at reset_peak_memory_stats: every tensor reachable from them
    through attributes, lists, tuples, sets and dicts (keys too) - the model's parameters, buffers and
    gradients, the optimizer's state, and what a library keeps beside them (DeepSpeed's engine holds ZeRO-3's
    parameter and gradient partitions and flat buffers in its optimizer, which the model's parameters do not
    show). A storage shared by views is counted once; an FSDP2 DTensor by its local shard. Modules, classes and
    functions are not entered; the walk stops after `limit` objects."""
    seen_storage, seen = set(), set()
    stack, n = list(roots), 0
    while stack and len(seen) < limit:
        obj = stack.pop()
        if obj is None or isinstance(obj, _LEAVES) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.is_leaf and obj.grad is not None:  # (a non-leaf's .grad is None, and warns)
                stack.append(obj.grad)
            t = obj.to_local() if hasattr(obj, "to_local") else obj  # an FSDP2 DTensor: this rank's shard
            stack.extend(vars(obj).values())  # a library's attributes on a parameter (DeepSpeed's ds_tensor)
            try:
                if t.device.type != "cpu" or t.layout != torch.strided:
                    continue
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError):  # tensors without storage (meta, functional wrappers)
                continue
            key = (storage.data_ptr(), storage.nbytes())
            if storage.nbytes() and key not in seen_storage:
                seen_storage.add(key)
                n += storage.nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return n


def _model_name(model) -> str:
    """The model's class name, as zeroplan.profile names it; FSDP2's fully_shard makes a subclass named
    "FSDP" + the class's name, DDP and torch.compile wrap it: the user's class is named."""
    model = getattr(model, "module", getattr(model, "_orig_mod", model))
    name = type(model).__name__
    if name.startswith("FSDP") and any(c.__name__ == name[4:] for c in type(model).__mro__[1:]):
        name = name[4:]
    return name


class record:  # noqa: N801 - used as a context manager, like torch.no_grad
    def __init__(self, path, *, model=None, optimizer=None, plan=None, global_batch: int | None = None,
                 warmup_steps: int = 1, name: str | None = None, device: str | None = None):
        if plan is None and global_batch is None:
            raise ZeroplanError("bad_input", "record: give plan= (a Plan dict) or global_batch=")
        self.path = os.fspath(path)
        # A wrapper that holds the torch optimizer in .optimizer (Accelerate's AcceleratedOptimizer, which skips
        # the inner step while accumulating; DeepSpeed's): the hook goes on the inner one, which steps once per
        # real step, and its state is what the optimizer holds.
        self._given_optimizer = optimizer  # its wrapper's own buffers count in the base
        while optimizer is not None and isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
            optimizer = optimizer.optimizer
        self.model, self.optimizer, self.plan = model, optimizer, plan
        self.global_batch, self.warmup_steps = global_batch, warmup_steps
        self.name = name or (_model_name(model) if model is not None else "python")
        if device is None and model is not None:
            p = next(model.parameters(), None)
            device = p.device.type if p is not None else "cpu"
        self.device = device or "cpu"
        self.step_times: list[float] = []
        self.losses: list[float] = []
        self._meter = None
        self._hook = None

    # -- the loop's events --
    def step(self) -> None:
        """Ends a step (called by the optimizer's post-step hook, or by hand without an optimizer)."""
        if self.device == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.step_times.append(now - self._last)
        self._last = now

    def loss(self, loss) -> None:
        self.losses.append(float(loss.detach().float().item() if isinstance(loss, torch.Tensor) else loss))

    def __enter__(self):
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = 0
        else:
            self._base = _held_cpu_bytes(self.model, self._given_optimizer)
            self._meter = _C.CpuMeter()
        if self.optimizer is not None:
            self._hook = self.optimizer.register_step_post_hook(lambda *_: self.step())
        self._last = time.perf_counter()
        return self

    def peak_bytes(self) -> int:
        if self.device == "cuda":
            return int(torch.cuda.max_memory_allocated())
        return self._base + (self._meter.peak() if self._meter is not None else 0)

    def __exit__(self, exc_type, exc, tb):
        peak = self.peak_bytes()
        if self._meter is not None:
            self._meter.stop()
        if self._hook is not None:
            self._hook.remove()
        if exc_type is not None:
            return False
        self._write(peak)
        return False

    def _write(self, peak: int) -> None:
        ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        rank = dist.get_rank() if ranks > 1 else 0
        mine = {"rank": rank, "peak": peak, "times": self.step_times, "losses": self.losses}
        if ranks > 1:
            everyone = [None] * ranks
            dist.all_gather_object(everyone, mine)
        else:
            everyone = [mine]
        if rank != 0:
            return
        n = min(len(r["times"]) for r in everyone)
        if n <= self.warmup_steps:
            raise ZeroplanError("bad_input", f"record: {n} steps recorded with warmup_steps {self.warmup_steps}: "
                                "nothing measured (was optimizer= given, or step() called?)")
        times = [max(r["times"][i] for r in everyone) for i in range(n)]
        plan = self.plan if self.plan is not None else json.loads(_C.default_plan(ranks, int(self.global_batch)))
        backend = dist.get_backend() if ranks > 1 else ("nccl" if self.device == "cuda" else "gloo")
        if backend not in ("gloo", "nccl"):
            # "undefined" for a group made without a backend name (Accelerate's on a CPU): the device's default.
            backend = "nccl" if self.device == "cuda" else "gloo"
        device = torch.cuda.get_device_name() if self.device == "cuda" else "cpu"
        doc = {
            "schema": "zeroplan.run_record/1", "model": self.name, "plan": plan,
            "environment": {"hostname": socket.gethostname(), "backend": backend, "device": device,
                            "threads_per_rank": torch.get_num_threads(), "torch_version": torch.__version__.split("+")[0],
                            "zeroplan_version": _C.__version__, "ranks": ranks, "cores": os.cpu_count() or 0},
            "warmup_steps": self.warmup_steps, "step_times_s": times,
            "step_time_median_s": 0, "step_time_p10_s": 0, "step_time_p90_s": 0,
            "phase_times_s": {},
            "peaks": [{"rank": r["rank"], "device_peak_bytes": r["peak"], "host_peak_bytes": 0}
                      for r in sorted(everyone, key=lambda r: r["rank"])],
            "losses": self.losses[:n], "fallbacks": [], "trace_paths": [],
        }
        try:
            text = _C.finish_run_record(json.dumps(doc))
        except _C.BadInput as e:
            raise ZeroplanError("bad_input", f"record: {e}") from None
        folder = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".run-record-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.path)
