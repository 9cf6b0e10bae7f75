# fairscale wrapping written by zeroplan tune for: zero_stage 2, world 8, micro_batch 4 x 1 microbatches, fp16 +fp32-rs
# Launch 8 ranks (torchrun); each rank trains on micro batches of 4 samples, 1 per optimizer step.
import torch
import torch.distributed as dist
from fairscale.optim.oss import OSS
from fairscale.nn.data_parallel import ShardedDataParallel

optimizer = OSS(model.parameters(), optim=torch.optim.Adam, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, broadcast_fp16=False)
model = ShardedDataParallel(model, optimizer, reduce_buffer_size=8388608)
from fairscale.optim.grad_scaler import ShardedGradScaler
scaler = ShardedGradScaler(init_scale=2.0**16, growth_interval=2000)


def train_step(batches):
    # batches: 1 micro batches of 4 samples
    optimizer.zero_grad(set_to_none=False)
    for k, (x, y) in enumerate(batches):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    optimizer.clip_grad_norm(0.5)
    scaler.step(optimizer)
    scaler.update()
