"""A synthetic-data training run of FILE.py:FACTORY's model under a plan: one rank of
`zeroplan run --python FILE:FACTORY` (python -m zeroplan train). The rank wraps the model (zeroplan.wrap),
trains on its share of make_batch(global_batch) every step, the same samples in the same chunks as
`zeroplan run` splits the built-in tasks (rank r's microbatch k: samples (r * microbatches + k) * micro_batch
on), and writes its RunResult (the executor's per-rank result) where the launcher gathers it."""
from __future__ import annotations

import json
import math
import os
import socket
import time

import torch

from . import _C
from ._capture import map_tensors
from ._engine import wrap
from ._errors import ZeroplanError
from ._factory import load_factory


def call(model, batch):
    """model(batch) the way make_batch's batch is meant: a dict of keyword arguments, (args, kwargs, ...) or
    a tuple of arguments (whose trailing labels the model accepts and ignores, as tests/python/models.py)."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, tuple) and len(batch) >= 2 and isinstance(batch[0], tuple) and isinstance(batch[1], dict):
        return model(*batch[0], **batch[1])
    if isinstance(batch, tuple):
        return model(*batch)
    return model(batch)


def chunk(batch, first: int, count: int):
    """Samples [first, first + count) of every tensor in the batch (along its first dimension)."""
    return map_tensors(batch, lambda t: t[first:first + count])


def _cpu_times():
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)
        return busy / os.sysconf("SC_CLK_TCK"), time.process_time()
    except OSError:
        return -1.0, time.process_time()


def train(spec: str, plan_path: str, steps: int, warmup: int, *, device: str = "cpu", threads: int = 0,
          checkpoint_dir: str = "", checkpoint_every: int = 0, resume: str = "", memory_limit: int = 0, resume_other_run: bool = False,
          checkpoint_keep: int = 0) -> dict:
    if threads > 0:
        torch.set_num_threads(threads)
    model, make_batch, loss_fn = load_factory(spec)
    with open(plan_path) as f:
        plan = json.load(f)
    engine = wrap(model, plan, device=device, memory_limit=memory_limit)
    rank, world = engine.session.rank, engine.session.world_size
    mb, m = engine.plan["micro_batch"], engine.plan["microbatches"]
    first = engine.load_checkpoint(resume, other_run=resume_other_run) if resume else 0
    if checkpoint_dir and rank == 0:  # what an interrupted save left goes before this run saves
        _C.prune_checkpoints(checkpoint_dir, -1, 0)
    # The steps' random streams (Dropout) seeded as `run` seeds them: the plan's seed, the rank, the first step.
    torch.manual_seed((int(engine.plan.get("seed", 0)) * 0x9E3779B97F4A7C15 + rank * 0x100000001B3 + first) % 2**64)
    result = {"rank": rank, "backend": "gloo" if device == "cpu" else "nccl", "device": device,
              "threads": torch.get_num_threads(), "step_times_s": [], "phase_times_s": [], "units": [],
              "losses": [], "loss_scales": [], "skipped_steps": [], "lr_gains": [], "fallbacks": [],
              "trace_path": "", "host": socket.gethostname(), "cores": os.cpu_count() or 0,
              "offloaded_activations": []}
    ls = engine.plan.get("precision", {}).get("loss_scale", "none")  # "none", or the scaler's settings
    scaled = ls != "none" and not (isinstance(ls, dict) and ls.get("mode", "none") == "none")
    cpu0 = None
    for s in range(steps):
        if s == warmup:
            cpu0 = (_cpu_times(), time.perf_counter())
        t0 = time.perf_counter()
        batch = make_batch(world * mb * m)
        local = 0.0
        for k in range(m):
            part = chunk(batch, (rank * m + k) * mb, mb)
            loss = loss_fn(call(engine, part), part)
            engine.backward(loss)
            local += loss.item() / m
        stats = engine.step()
        result["step_times_s"].append(time.perf_counter() - t0)
        result["phase_times_s"].append(stats["phase_s"])
        result["losses"].append(local)  # this rank's; the launcher averages the ranks'
        if scaled:
            result["loss_scales"].append(stats["loss_scale"])
        if stats["skipped"]:
            result["skipped_steps"].append(s)
        elif not math.isfinite(local):  # a diverged run is not a success (as `run` on the built-in models)
            raise ZeroplanError("run_failed", f"the run diverged at step {first + s}: loss {local} on rank {rank} "
                                "(lower the learning rate, or use loss scaling with 16-bit compute)")
        if engine.plan.get("adascale"):
            result["lr_gains"].append(stats["lr_gain"])
        done = first + s + 1
        if checkpoint_dir and ((checkpoint_every > 0 and done % checkpoint_every == 0) or s + 1 == steps):
            engine.save_checkpoint(checkpoint_dir)
            if rank == 0:
                _C.prune_checkpoints(checkpoint_dir, engine._step, checkpoint_keep)
    (machine0, own0), wall0 = cpu0 if cpu0 else (_cpu_times(), time.perf_counter())
    machine1, own1 = _cpu_times()
    result["cpu_wall_s"] = time.perf_counter() - wall0
    result["cpu_machine_busy_s"] = machine1 - machine0 if machine0 >= 0 else -1.0
    result["cpu_own_s"] = own1 - own0
    result["device_peak_bytes"] = engine.peak_bytes()
    result["host_peak_bytes"] = engine.host_peak_bytes()
    result["host_reserved_bytes"] = 0
    result["device_peak_at"] = ""
    engine.close()
    return result
