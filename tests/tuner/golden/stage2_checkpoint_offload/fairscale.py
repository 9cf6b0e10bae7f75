# fairscale wrapping written by zeroplan tune for: zero_stage 2, world 8, micro_batch 2 x 1 microbatches, fp32, checkpointing all (inputs on the host)
# Launch 8 ranks (torchrun); each rank trains on micro batches of 2 samples, 1 per optimizer step.
import torch
import torch.distributed as dist
from fairscale.nn import checkpoint_wrapper
from fairscale.optim.oss import OSS
from fairscale.nn.data_parallel import ShardedDataParallel

# Checkpoint every unit (recomputed in backward, its input kept on the host until then).
units = [checkpoint_wrapper(u, offload_to_cpu=True) for u in units]
optimizer = OSS(model.parameters(), optim=torch.optim.Adam, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, broadcast_fp16=False)
model = ShardedDataParallel(model, optimizer, reduce_buffer_size=8388608)


def train_step(batches):
    # batches: 1 micro batches of 2 samples
    optimizer.zero_grad(set_to_none=False)
    for k, (x, y) in enumerate(batches):
        loss = loss_fn(model(x), y)
        loss.backward()
    optimizer.step()
