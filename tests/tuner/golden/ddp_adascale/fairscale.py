# fairscale wrapping written by zeroplan tune for: zero_stage 0, world 8, micro_batch 2 x 2 microbatches, fp32, AdaScale
# Launch 8 ranks (torchrun); each rank trains on micro batches of 2 samples, 2 per optimizer step.
import contextlib
import torch
import torch.distributed as dist
from fairscale.optim import AdaScale

model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0)
optimizer = AdaScale(optimizer, world_size=8, num_gradients_to_accumulate=2)


def train_step(batches):
    # batches: 2 micro batches of 2 samples
    optimizer.zero_grad(set_to_none=False)
    for k, (x, y) in enumerate(batches):
        ctx = model.no_sync() if k < 1 else contextlib.nullcontext()
        with ctx:
            loss = loss_fn(model(x), y)
            loss.backward()
    gain = optimizer.gain()  # add it to the scale-invariant step count the lr schedule follows
    optimizer.step()
    return gain
