"""A user's own training loop under torchrun, recorded with zeroplan.record: PyTorch DDP or FSDP2
(fully_shard per block, then the root) of the GPT-2 model on Gloo ranks.

    torchrun --nproc-per-node 2 tests/python/record_loop.py --mode ddp --out run.json
"""
import argparse
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import zeroplan  # noqa: E402
from zeroplan import _C  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["ddp", "fsdp2"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2, help="per rank")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    world, rank = dist.get_world_size(), dist.get_rank()
    model, make_batch, loss_fn = models.gpt2()
    plan = json.loads(_C.default_plan(world, a.batch * world))
    if a.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        wrapped = DDP(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        wrapped = model
        plan["zero_stage"] = 3
        plan["reshard_after_forward"] = True
    opt = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    batch = {"input_ids": models._tokens(a.batch, 10 + rank)}
    with zeroplan.record(a.out, model=model, optimizer=opt, plan=plan) as rec:
        for _ in range(a.steps):
            loss = loss_fn(wrapped(**batch), batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            rec.loss(loss)
    # Both ranks leave together and drop DDP's reducer before the process group goes (a Gloo rank torn
    # down while its peer still sent aborted once with "terminate called without an active exception").
    dist.barrier()
    del wrapped, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
