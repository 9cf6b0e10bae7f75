# fairscale wrapping written by zeroplan tune for: zero_stage 0, world 1, micro_batch 8 x 1 microbatches, fp32, OffloadModel 2 slices
# Launch 1 ranks (torchrun); each rank trains on micro batches of 8 samples, 1 per optimizer step.
import torch
import torch.distributed as dist
from fairscale.experimental.nn.offload import OffloadModel

# `units` is the model as a list of its 6 units (an nn.Sequential of them is what OffloadModel slices).
model = OffloadModel(
    model=torch.nn.Sequential(*units),
    device=torch.device("cuda"),
    offload_device=torch.device("cpu"),
    num_slices=2,
    checkpoint_activation=True,
    num_microbatches=4,
)
model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
optimizer = torch.optim.Adam(model.parameters(), lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0)


def train_step(batches):
    # batches: 1 micro batches of 8 samples
    optimizer.zero_grad(set_to_none=False)
    for k, (x, y) in enumerate(batches):
        loss = loss_fn(model(x), y)
        loss.backward()
    optimizer.step()
