#!/usr/bin/env python3
"""FSDP2 training script written by zeroplan tune for: zero_stage 3, reshard_after_forward, world 16, micro_batch 2 x 4 microbatches, bf16, offload params+grads+optimizer, checkpointing units [1], flat params.

Plain PyTorch: fully_shard on each unit, then on the root. Run it under torchrun with the model factory you profiled:

    torchrun --nproc-per-node 16 train_fsdp2.py --model FILE.py:FACTORY --steps 10 [--record run.json]

FACTORY() returns (model, make_batch, loss_fn) as for `zeroplan profile --python`: make_batch(n) gives n samples
(a dict of keyword arguments, a tuple of arguments or a tensor), loss_fn(output, batch) the loss. --record
writes a RunRecord (zeroplan.record) that `zeroplan compare` judges against the plan's prediction.
"""
import argparse
import contextlib
import importlib.util
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

# The plan (zeroplan's Plan document below, for the record).
WORLD_SIZE = 16
MICRO_BATCH = 2
MICROBATCHES = 4
ZERO_STAGE = 3
RESHARD_AFTER_FORWARD = True
PREFETCH_DEPTH = 1
PARAM_DTYPE = torch.bfloat16
REDUCE_DTYPE = torch.bfloat16
OFFLOAD = True
CHECKPOINT = True
UNIT_CLASSES = ("TransformerBlock",)
OPTIMIZER = {"name": "adam", "lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0}
MAX_GRAD_NORM = 1
MODEL_NAME = "gpt-small"
PLAN = json.loads(r'''{
  "schema": "zeroplan.plan/1",
  "world_size": 16,
  "global_batch": 128,
  "micro_batch": 2,
  "microbatches": 4,
  "pipeline_stages": 1,
  "pipeline": {
    "balance": "time",
    "schedule": "gpipe",
    "checkpoint": "never"
  },
  "zero_stage": 3,
  "reshard_after_forward": true,
  "offload": {
    "params": true,
    "grads": true,
    "optimizer": true,
    "activations_ratio": 0.0,
    "activations_prefetch_bytes": -1
  },
  "offload_model": {
    "enabled": false,
    "slices": 1,
    "checkpoint_activation": false,
    "microbatches": 1
  },
  "checkpointing": [
    1
  ],
  "checkpoint_offload": false,
  "localsgd_frequency": 0,
  "localsgd_warmup_steps": 0,
  "slowmo_momentum": 0.0,
  "slowmo_frequency": 0,
  "slowmo_lr": 1.0,
  "adascale": false,
  "precision": {
    "param_dtype": "bf16",
    "compute_dtype": "bf16",
    "reduce_dtype": "bf16",
    "master_fp32": true,
    "broadcast_fp16": false,
    "fp32_reduce_scatter": false,
    "loss_scale": "none"
  },
  "buckets": {
    "all_reduce_bucket_bytes": 26214400,
    "reduce_buffer_elems": 8388608,
    "allgather_bucket_bytes": 26214400,
    "prefetch": true,
    "prefetch_depth": 1
  },
  "flat_params": true,
  "optimizer": {
    "name": "adam",
    "lr": 0.001,
    "momentum": 0.0,
    "betas": [
      0.9,
      0.999
    ],
    "eps": 1e-08,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0
  },
  "seed": 0
}
''')


def load_factory(spec):
    """FILE.py:FACTORY -> the factory function (zeroplan profile --python's contract)."""
    path, _, name = spec.rpartition(":")
    if not path or not name:
        sys.exit(f"train_fsdp2.py: --model {spec}: expected FILE.py:FACTORY")
    module_spec = importlib.util.spec_from_file_location("user_model", path)
    if module_spec is None:
        sys.exit(f"train_fsdp2.py: --model {spec}: cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    module_spec.loader.exec_module(module)
    return getattr(module, name)


def call(model, batch):
    """model(batch) as make_batch means it: keyword arguments, (args, kwargs), a tuple of arguments, a tensor."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, tuple) and len(batch) >= 2 and isinstance(batch[0], tuple) and isinstance(batch[1], dict):
        return model(*batch[0], **batch[1])
    if isinstance(batch, tuple):
        return model(*batch)
    return model(batch)


def take(batch, first, count, device):
    """Samples [first, first + count) of every tensor of the batch, on the device."""
    if isinstance(batch, torch.Tensor):
        return batch[first:first + count].to(device)
    if isinstance(batch, dict):
        return {k: take(v, first, count, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(take(v, first, count, device) for v in batch)
    return batch


def optimizer_for(params):
    kind = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[OPTIMIZER["name"]]
    kw = {k: v for k, v in OPTIMIZER.items() if k != "name"}
    if ZERO_STAGE == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(params, optimizer_class=kind, **kw)
    return kind(params, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="FILE.py:FACTORY returning (model, make_batch, loss_fn)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: torch's default)")
    ap.add_argument("--record", help="write a zeroplan RunRecord of the run (zeroplan.record), for zeroplan compare")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=5))
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != WORLD_SIZE:
        sys.exit(f"train_fsdp2.py: the plan is for {WORLD_SIZE} ranks; torchrun started {world}")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    model, make_batch, loss_fn = load_factory(a.model)()
    model.to(device)
    is_unit = lambda m: type(m).__name__ in UNIT_CLASSES
    if not any(is_unit(m) for m in model.modules()):
        sys.exit(f"train_fsdp2.py: the model has no module of class {', '.join(UNIT_CLASSES)} (the profile's units)")
    if CHECKPOINT:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
        apply_activation_checkpointing(
            model, checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=is_unit)
        units = [m for m in model.modules() if is_unit(getattr(m, "_checkpoint_wrapped_module", None))]
    else:
        units = [m for m in model.modules() if is_unit(m)]
    if ZERO_STAGE >= 2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        kw = {"mesh": init_device_mesh(device.type, (world,)), "reshard_after_forward": RESHARD_AFTER_FORWARD}
        if PARAM_DTYPE is not None:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=PARAM_DTYPE, reduce_dtype=REDUCE_DTYPE)
        if OFFLOAD:
            kw["offload_policy"] = CPUOffloadPolicy()
        for m in units:
            fully_shard(m, **kw)
        fully_shard(model, **kw)
        if ZERO_STAGE == 3 and PREFETCH_DEPTH > 1:  # the plan gathers more than the next unit ahead
            for i, m in enumerate(units):
                m.set_modules_to_forward_prefetch(units[i + 1:i + 1 + PREFETCH_DEPTH])
                m.set_modules_to_backward_prefetch(units[max(0, i - PREFETCH_DEPTH):i][::-1])
        wrapped = model
    else:
        from torch.nn.parallel import DistributedDataParallel
        wrapped = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = optimizer_for(wrapped.parameters())
    recording = contextlib.nullcontext(None)
    if a.record:
        import zeroplan
        recording = zeroplan.record(a.record, model=model, optimizer=opt, plan=PLAN, name=MODEL_NAME)
    per_rank = MICRO_BATCH * MICROBATCHES
    with recording as rec:
        for step in range(a.steps):
            # The step's global batch; rank r trains samples [r x per_rank, (r + 1) x per_rank), in microbatches.
            batch = make_batch(per_rank * world)
            total = 0.0
            for k in range(MICROBATCHES):
                mb = take(batch, rank * per_rank + k * MICRO_BATCH, MICRO_BATCH, device)
                last = k == MICROBATCHES - 1
                sync = contextlib.nullcontext() if last or ZERO_STAGE >= 2 else wrapped.no_sync()
                with sync:
                    loss = loss_fn(call(wrapped, mb), mb) / MICROBATCHES
                    loss.backward()
                total += loss.item()
            if MAX_GRAD_NORM > 0:  # the global norm over every shard (DTensor gradients under fully_shard)
                torch.nn.utils.clip_grad_norm_(wrapped.parameters(), MAX_GRAD_NORM)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if rec is not None:
                rec.loss(total)
            if rank == 0:
                print(f"step {step} loss {total:.6f}", flush=True)
    dist.barrier()
    del wrapped, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
