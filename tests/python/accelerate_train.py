"""A user's own Accelerate training loop, the kind zeroplan's Accelerate export is a config for:

    accelerate launch --config_file tune/accelerate_fsdp2.yaml accelerate_train.py \
        --model models.py:llama --plan tune/plan.json --steps 3 --record run.json

The model factory of `zeroplan profile --python` (model, make_batch, loss_fn), Accelerator.prepare, gradient
accumulation and clipping as the plan says, the optimizer the plan names, zeroplan.record around the steps.
Rank r trains samples [r x per_rank, (r + 1) x per_rank) of each step's global batch, as zeroplan's executor and
the FSDP2 export do, so the runs compare. Used by python.exports (tests/python/test_exports.py).
"""
import argparse
import contextlib
import importlib.util
import json
import os
import sys

import torch
from accelerate import Accelerator


def load_factory(spec):
    path, _, name = spec.rpartition(":")
    module_spec = importlib.util.spec_from_file_location("user_model", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    module_spec.loader.exec_module(module)
    return getattr(module, name)


def call(model, batch):
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, tuple):
        return model(*batch)
    return model(batch)


def take(batch, first, count, device):
    if isinstance(batch, torch.Tensor):
        return batch[first:first + count].to(device)
    if isinstance(batch, dict):
        return {k: take(v, first, count, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(take(v, first, count, device) for v in batch)
    return batch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--record")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with open(a.plan) as f:
        plan = json.load(f)
    micro, microbatches = plan["micro_batch"], plan["microbatches"]
    acc = Accelerator(gradient_accumulation_steps=microbatches)
    model, make_batch, loss_fn = load_factory(a.model)()
    model = acc.prepare(model)
    o = plan["optimizer"]
    kind = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[o["name"]]
    kw = {"lr": o["lr"], "weight_decay": o["weight_decay"]}
    if o["name"] == "sgd":
        kw["momentum"] = o["momentum"]
    else:
        kw.update(betas=tuple(o["betas"]), eps=o["eps"])
    opt = acc.prepare(kind(model.parameters(), **kw))
    clip = o.get("max_grad_norm", 0)
    recording = contextlib.nullcontext(None)
    if a.record:
        import zeroplan
        recording = zeroplan.record(a.record, model=model, optimizer=opt, plan=plan, name="llama")
    world, rank = acc.num_processes, acc.process_index
    per_rank = micro * microbatches
    with recording as rec:
        for step in range(a.steps):
            batch = make_batch(per_rank * world)
            total = 0.0
            for k in range(microbatches):
                mb = take(batch, rank * per_rank + k * micro, micro, acc.device)
                with acc.accumulate(model):
                    loss = loss_fn(call(model, mb), mb)
                    acc.backward(loss)
                    if acc.sync_gradients and clip > 0:
                        acc.clip_grad_norm_(model.parameters(), clip)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                total += loss.item() / microbatches
            if rec is not None:
                rec.loss(total)
            if acc.is_main_process:
                print(f"step {step} loss {total:.6f}", flush=True)
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
