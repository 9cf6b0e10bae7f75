# fairscale wrapping written by zeroplan tune for: zero_stage 1, world 16, micro_batch 1 x 4 microbatches, fp32, pipeline 2 stages, gpipe, checkpoint except_last
# Launch 8 processes (torchrun), each driving one pipeline of 2 stages on 4 samples per step, in 4 chunks of 1.
import torch
import torch.distributed as dist
from fairscale.nn import Pipe
from fairscale.optim.oss import OSS

# One process per pipeline: its 2 stages on this node's devices; units per stage balanced by time (fairscale.nn.pipe.balance.balance_by_time measures the same on your devices).
first = (dist.get_rank() % (torch.cuda.device_count() // 2)) * 2
model = Pipe(
    torch.nn.Sequential(*units),
    balance=[3, 3],
    devices=[torch.device("cuda", first + i) for i in range(2)],
    chunks=4,
    checkpoint="except_last",
)
optimizer = OSS(model.parameters(), optim=torch.optim.Adam, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, broadcast_fp16=False)
model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)


def train_step(x, y):
    # x, y: 4 samples (micro batch 1 x 4 chunks)
    optimizer.zero_grad(set_to_none=False)
    loss = loss_fn(model(x.to(model.module.devices[0])), y.to(model.module.devices[-1]))
    loss.backward()
    optimizer.step()
