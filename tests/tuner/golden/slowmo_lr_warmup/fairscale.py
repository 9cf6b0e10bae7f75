# fairscale wrapping written by zeroplan tune for: zero_stage 0, world 16, micro_batch 2 x 1 microbatches, fp32, localsgd every 3 after 100 synchronous steps, slowmo every 6 (momentum 0.2, lr 0.7)
# Launch 16 ranks (torchrun); each rank trains on micro batches of 2 samples, 1 per optimizer step.
import torch
import torch.distributed as dist
from fairscale.experimental.nn.data_parallel import SlowMoBaseAlgorithm, SlowMoDistributedDataParallel

model = SlowMoDistributedDataParallel(
    model,
    nprocs_per_node=8,
    slowmo_base_algorithm=SlowMoBaseAlgorithm.LOCALSGD,
    localsgd_frequency=3,
    slowmo_momentum=0.2,
    slowmo_lr=0.7,
    slowmo_frequency=6,
    slowmo_memory_efficient=False,
    broadcast_buffers=False,
)
optimizer = torch.optim.Adam(model.parameters(), lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0)


def train_step(batches):
    # batches: 1 micro batches of 2 samples
    optimizer.zero_grad(set_to_none=False)
    for k, (x, y) in enumerate(batches):
        loss = loss_fn(model(x), y)
        loss.backward()
    optimizer.step()
    model.perform_slowmo(optimizer)
