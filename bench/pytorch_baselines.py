#!/usr/bin/env python3
"""PyTorch's own data-parallel implementations on the model zeroplan's `gpt` builds, for the executor
benchmark (bench/executor_bench.py). Same wheel, same machine, same shape, same optimizer.

The model is profiles/src/torch/zoo/gpt.cpp in Python: GPT-2 pre-LayerNorm decoder (wte + wpe, L
blocks of x + attn(ln_1(x)), x + mlp(ln_2(x)) with causal SDPA and tanh GELU, ln_f, logits against the
tied wte.weight), GPT-2 initialisation (N(0, 0.02), residual projections 0.02 / sqrt(2L), zero biases),
dropout 0, and its task: next token of a fixed random Markov chain (4 successors per token skewed to
small ids, probabilities 0.5/0.25/0.15/0.1), mean cross-entropy per rank, gradients averaged over ranks
(= mean over the global batch, as zeroplan scales by 1/(world x microbatches)). The chain is drawn with
torch's generator, not zeroplan's Rng: the samples differ, the work per step does not.
Optimizer: zeroplan's Plan default, Adam lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay.

Modes (one process: `single`; under torchrun, Gloo on CPU: the others):
  single  plain model, torch.optim.Adam
  ddp     DistributedDataParallel (bucket_cap_mb 25, as zeroplan's all_reduce_bucket_bytes)
  zero1   DDP + ZeroRedundancyOptimizer(Adam)          (zeroplan stage 1's counterpart)
  fsdp2   fully_shard per block, then the root (embeddings, ln_f, tied head)   (stage 3's)

A step is what zeroplan times: make the batch, forward, loss, backward, optimizer step, zero_grad.
Per-step wall time is the slowest rank's; the median is over the steps after warm-up. Writes JSON.

  .venv/bin/python bench/pytorch_baselines.py --mode single --seq 128 -o single.json
  OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc-per-node 2 bench/pytorch_baselines.py --mode fsdp2 -o f.json
  .venv/bin/python bench/pytorch_baselines.py --count-only --seq 1024   # 124,439,808 for gpt2-small
  .venv/bin/python bench/pytorch_baselines.py --precision fp16 ...      # autocast + GradScaler
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- the model: zeroplan's gpt ----


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(hidden)
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.attn_proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden)
        self.c_fc = nn.Linear(hidden, 4 * hidden)
        self.mlp_proj = nn.Linear(4 * hidden, hidden)

    def attn(self, x):
        b, t, h = x.shape
        q, k, v = self.c_attn(x).split(h, dim=2)
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, h))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab):
        super().__init__()
        assert hidden % heads == 0, "hidden must be divisible by heads"
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.h = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)

    def init_gpt2(self, generator):
        std, proj_std = 0.02, 0.02 / math.sqrt(2.0 * len(self.h))
        with torch.no_grad():
            self.wte.weight.normal_(0.0, std, generator=generator)
            self.wpe.weight.normal_(0.0, std, generator=generator)
            for blk in self.h:
                for lin, s in ((blk.c_attn, std), (blk.attn_proj, proj_std), (blk.c_fc, std), (blk.mlp_proj, proj_std)):
                    lin.weight.normal_(0.0, s, generator=generator)
                    lin.bias.zero_()

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for blk in self.h:
            x = blk(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied LM head


def parameter_count(model):
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# ---- the task: next token of a fixed random Markov chain ----


class MarkovLanguage:
    SUCCESSORS = 4
    CUMULATIVE = torch.tensor([0.5, 0.75, 0.9])

    def __init__(self, seed, vocab, seq):
        self.seed, self.vocab, self.seq = seed, vocab, seq
        g = torch.Generator().manual_seed(seed * 7919 + 1)
        u = torch.rand(vocab * self.SUCCESSORS, generator=g, dtype=torch.float64)
        self.successors = (u * u * vocab).long().clamp_(max=vocab - 1).view(vocab, self.SUCCESSORS)

    def batch(self, step, first_sample, count):
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + step) * 65_537 + first_sample)
        tokens = torch.empty(count, self.seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(self.vocab, (count,), generator=g)
        choice = torch.bucketize(torch.rand(count, self.seq, generator=g), self.CUMULATIVE, right=True)
        for t in range(1, self.seq + 1):
            tokens[:, t] = self.successors[tokens[:, t - 1], choice[:, t - 1]]
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


# ---- one run ----


def adam_kwargs(args):
    kw = dict(lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    if args.adam == "foreach":
        kw["foreach"] = True
    elif args.adam == "fused":
        kw["fused"] = True
    return kw


def build(args, rank, world):
    torch.manual_seed(args.seed)
    model = Gpt(args.layers, args.hidden, args.heads, args.seq, args.vocab)
    model.init_gpt2(torch.Generator().manual_seed(args.seed))
    params = parameter_count(model)
    if args.mode == "single":
        return model, model, torch.optim.Adam(model.parameters(), **adam_kwargs(args)), params
    if args.mode in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
        if args.mode == "ddp":
            return model, ddp, torch.optim.Adam(ddp.parameters(), **adam_kwargs(args)), params
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, **adam_kwargs(args))
        return model, ddp, opt, params
    if args.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for blk in model.h:
            fully_shard(blk, mesh=mesh, reshard_after_forward=args.reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=args.reshard_after_forward)
        return model, model, torch.optim.Adam(model.parameters(), **adam_kwargs(args)), params
    raise SystemExit(f"unknown mode {args.mode}")


def run(args):
    distributed = args.mode != "single"
    rank, world = 0, 1
    if distributed:
        import torch.distributed as dist
        from datetime import timedelta

        dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads)
    _, model, opt, params = build(args, rank, world)
    task = MarkovLanguage(args.seed, args.vocab, args.seq)
    mb = args.micro_batch

    # Mixed precision PyTorch's way: fp32 parameters and optimizer, torch.autocast for the forward (the
    # loss in fp32 from the 16-bit logits), and for fp16 GradScaler's dynamic loss scale (2^16, x2 after
    # 2000 clean steps, x0.5 and skip on inf/nan).
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    scaler = torch.amp.GradScaler("cpu") if args.precision == "fp16" else None
    times, phases, losses, scales = [], [], [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        inp, tgt = task.batch(step, rank * mb, mb)
        t1 = time.perf_counter()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            logits = model(inp)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))
        losses.append(loss.item())
        t2 = time.perf_counter()
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        t3 = time.perf_counter()
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        del logits, loss
        times.append(t4 - t0)
        phases.append({"data": t1 - t0, "forward": t2 - t1, "backward": t3 - t2, "optimizer": t4 - t3})
        if args.progress and rank == 0:
            print(f"{args.mode} step {step + 1}/{args.steps}  loss {losses[-1]:.4f}  {t4 - t0:.3f} s",
                  file=sys.stderr, flush=True)

    if distributed:
        import torch.distributed as dist

        gathered = [None] * world
        dist.all_gather_object(gathered, {"times": times, "phases": phases, "losses": losses})
        times = [max(g["times"][s] for g in gathered) for s in range(args.steps)]
        phases = [{k: max(g["phases"][s][k] for g in gathered) for k in phases[s]} for s in range(args.steps)]
        losses = [statistics.fmean(g["losses"][s] for g in gathered) for s in range(args.steps)]
        dist.destroy_process_group()
    if rank != 0:
        return
    timed = times[args.warmup:]
    record = {
        "schema": "zeroplan.pytorch_baseline/1",
        "mode": args.mode,
        "world_size": world,
        "threads_per_rank": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "parameters": params,
        "shape": {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq", "vocab", "micro_batch")},
        "global_batch": mb * world,
        "optimizer": {"name": "adam", "lr": args.lr, "impl": args.adam},
        "reshard_after_forward": args.reshard_after_forward if args.mode == "fsdp2" else None,
        "warmup_steps": args.warmup,
        "step_times_s": times,
        "step_time_median_s": statistics.median(timed),
        "phase_times_s": {k: statistics.median(p[k] for p in phases[args.warmup:]) for k in phases[0]},
        "losses": losses,
        "precision": args.precision,
        "loss_scales": scales,
    }
    text = json.dumps(record, indent=2)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    print(f"{args.mode}: {params:,} parameters, {world} rank(s), median step {record['step_time_median_s']:.3f} s, "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["single", "ddp", "zero1", "fsdp2"], default="single")
    ap.add_argument("--layers", type=int, default=12)   # gpt2-small
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128)      # gpt2-small has 1024; wpe has `seq` rows
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--micro-batch", type=int, default=1, help="samples per rank per step")
    ap.add_argument("--steps", type=int, default=6, help="steps, warm-up included")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--adam", choices=["default", "foreach", "fused"], default="default",
                    help="torch.optim.Adam implementation (default: torch's choice, the for-loop on CPU)")
    ap.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True,
                    help="fsdp2 only (fully_shard's default: on)")
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                    help="torch.autocast to this dtype (fp16 with GradScaler); parameters stay fp32")
    ap.add_argument("--timeout", type=float, default=300, help="process-group timeout, seconds")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--count-only", action="store_true", help="print the parameter count and exit")
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    if args.warmup < 0 or args.warmup >= args.steps:
        ap.error(f"--warmup {args.warmup} must be in [0, --steps {args.steps})")

    if args.count_only:
        with torch.device("meta"):
            model = Gpt(args.layers, args.hidden, args.heads, args.seq, args.vocab)
        print(parameter_count(model))
        return
    try:
        run(args)
    except Exception as e:  # the driver reports what failed, exactly
        rank = int(os.environ.get("RANK", "0"))
        msg = f"{type(e).__name__}: {e}"
        traceback.print_exc()
        if args.output and rank == 0:
            with open(args.output, "w") as f:
                json.dump({"schema": "zeroplan.pytorch_baseline/1", "mode": args.mode, "error": msg,
                           "traceback": traceback.format_exc()}, f, indent=2)
        sys.exit(1)


if __name__ == "__main__":
    main()
