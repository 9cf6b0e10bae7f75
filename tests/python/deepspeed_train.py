"""A user's own DeepSpeed training loop, the kind zeroplan's ds_config.json export is for:

    torchrun --nproc-per-node 2 deepspeed_train.py --model models.py:llama --config tune/ds_config.json \
        --plan tune/plan.json --steps 3 --record run.json

The model factory of `zeroplan profile --python` (model, make_batch, loss_fn), deepspeed.initialize with the
exported config as it is (DeepSpeed's own parser and its CPU accelerator here), one engine.backward and
engine.step per micro batch (DeepSpeed accumulates to the config's gradient_accumulation_steps), zeroplan.record
around the steps, a step ended by hand at each accumulation boundary. Rank r trains samples
[r x per_rank, (r + 1) x per_rank) of each step's global batch, as zeroplan's executor does. Used by
python.exports (tests/python/test_exports.py).
"""
import argparse
import contextlib
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import importlib  # noqa: E402
import importlib.util  # noqa: E402

import deepspeed  # noqa: E402
import torch  # noqa: E402

# DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce op at its first initialize (about 150 s of
# this 2-core machine's test time, every fresh machine): without it DeepSpeed's collectives are torch.distributed's
# (Gloo here), as on a machine where the op cannot build.
# (The module by its name: the attribute deepspeed.comm.torch is the torch package.)
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


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
    ap.add_argument("--config", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--record")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with open(a.config) as f:
        config = json.load(f)
    # DeepSpeed's FusedAdam is JIT-compiled at the first initialize on every fresh machine (60-100 s of this
    # 2-core machine's test time): DeepSpeed's documented "torch_adam" switch takes torch.optim's Adam(W)
    # instead, the same update. The rest of the exported config is used as written.
    optimizer = config.get("optimizer")
    if optimizer and optimizer.get("type", "").lower() in ("adam", "adamw"):
        optimizer.setdefault("params", {})["torch_adam"] = True
    with open(a.plan) as f:
        plan = json.load(f)
    model, make_batch, loss_fn = load_factory(a.model)()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    micro, microbatches = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    world, rank = engine.world_size, engine.global_rank
    recording = contextlib.nullcontext(None)
    if a.record:
        import zeroplan
        # The engine as the model: its ZeRO-3 optimizer's partitions and flat buffers count (the model's
        # parameters are empty placeholders under ZeRO-3).
        recording = zeroplan.record(a.record, model=engine, plan=plan, name="llama")
    per_rank = micro * microbatches
    with recording as rec:
        for step in range(a.steps):
            batch = make_batch(per_rank * world)
            total = 0.0
            for k in range(microbatches):
                mb = take(batch, rank * per_rank + k * micro, micro, engine.device)
                loss = loss_fn(call(engine, mb), mb)
                engine.backward(loss)
                engine.step()
                total += loss.item() / microbatches
            if rec is not None:
                rec.step()
                rec.loss(total)
            if rank == 0:
                print(f"step {step} loss {total:.6f}", flush=True)


if __name__ == "__main__":
    main()
