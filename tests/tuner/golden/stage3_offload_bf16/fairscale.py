# fairscale wrapping written by zeroplan tune for: zero_stage 3, reshard_after_forward, world 16, micro_batch 2 x 4 microbatches, bf16, offload params+grads+optimizer, checkpointing units [1], flat params
# Launch 16 ranks (torchrun); each rank trains on micro batches of 2 samples, 4 per optimizer step.
import torch
import torch.distributed as dist
from fairscale.nn import checkpoint_wrapper
from fairscale.nn import auto_wrap, enable_wrap
from fairscale.nn.data_parallel import FullyShardedDataParallel as FSDP

# Checkpoint these profile units (every repetition of each): units [1].
for i in [1]:
    units[i] = checkpoint_wrapper(units[i])
# Each TransformerBlock unit becomes its own FSDP instance; the root keeps the rest.
fsdp_args = dict(reshard_after_forward=True, move_params_to_cpu=True, move_grads_to_cpu=True, mixed_precision=True, compute_dtype=torch.bfloat16, fp32_reduce_scatter=False, flatten_parameters=True)
with enable_wrap(wrapper_cls=FSDP, **fsdp_args):
    for i, unit in enumerate(units):
        units[i] = auto_wrap(unit)
model = FSDP(model, **fsdp_args)
optimizer = torch.optim.Adam(model.parameters(), lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0)


def train_step(batches):
    # batches: 4 micro batches of 2 samples
    optimizer.zero_grad(set_to_none=False)
    for k, (x, y) in enumerate(batches):
        loss = loss_fn(model(x), y)
        loss.backward()
    model.clip_grad_norm_(1)
    optimizer.step()
