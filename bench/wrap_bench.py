#!/usr/bin/env python3
"""zeroplan.wrap against PyTorch's own implementations on a Hugging Face Llama-style model (transformers,
random weights), 2 Gloo ranks on this machine, the same loop for every mode: make the batch, forward,
loss, backward, optimizer step (Adam lr 1e-3, the fused kernel zeroplan steps with), zero_grad.

  zeroplan-s0      zeroplan.wrap, zero_stage 0            ddp          DistributedDataParallel (bucket 25 MB)
  zeroplan-s3      zero_stage 3, reshard_after_forward    fsdp2        fully_shard per decoder layer, then the root
  zeroplan-s3-ckpt zero_stage 3 + checkpointing "all"     fsdp2-ckpt   checkpoint_wrapper per layer, then fully_shard
  zeroplan-s0-off  zero_stage 0, activations_ratio 1     ddp-off      DDP inside torch.autograd.graph.save_on_cpu

Step time: the slowest rank's wall time per step, median over the steps after warm-up. Peak: each rank's
peak CPU bytes counted by the same counting allocator (zeroplan's, installed before the model is built for
the PyTorch modes; the engine's own device for zeroplan's). The offload pair also reports the host side: the
bytes zeroplan's host pool holds (what it sent) beside the device; on a CPU-only machine save_on_cpu keeps
each tensor where it is (it is on the CPU already), so PyTorch's row is its hooks' cost, not a smaller peak.
Prints a table (and JSON with --json).

  .venv/bin/python bench/wrap_bench.py                 # every mode, one after another, 2 ranks each
  .venv/bin/python bench/wrap_bench.py --modes ddp,zeroplan-s0 --steps 8
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ["zeroplan-s0", "ddp", "zeroplan-s3", "fsdp2", "zeroplan-s3-ckpt", "fsdp2-ckpt", "zeroplan-s0-off", "ddp-off"]


def build(args):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      max_position_embeddings=args.seq, tie_word_embeddings=False, use_cache=False,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg)


def batch(args, rank, step):
    import torch
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, args.vocab, (args.micro_batch, args.seq), generator=g)


def lm_loss(logits, ids):
    import torch.nn.functional as F
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), ids[:, 1:].reshape(-1))


def worker(args):
    import torch
    import torch.distributed as dist
    import zeroplan
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    mode = args.mode
    times = []
    if mode.startswith("zeroplan"):
        model = build(args)
        plan = json.loads(zeroplan._C.default_plan(world, world * args.micro_batch))
        if mode.startswith("zeroplan-s3"):
            plan.update(zero_stage=3, reshard_after_forward=True)
        if mode.endswith("off"):
            plan["offload"] = dict(plan.get("offload", {}), activations_ratio=1.0)
        if mode.endswith("ckpt"):
            plan["checkpointing"] = "all"
        engine = zeroplan.wrap(model, plan, optimizer="adam", lr=1e-3)
        for s in range(args.steps):
            t0 = time.perf_counter()
            ids = batch(args, rank, s)
            out = engine(input_ids=ids)
            engine.backward(lm_loss(out.logits, ids))
            engine.step()
            times.append(time.perf_counter() - t0)
        peak, host = engine.peak_bytes(), engine.host_peak_bytes()
    else:
        import contextlib
        host = 0
        meter = zeroplan._C.CpuMeter()
        dist.init_process_group("gloo")
        model = build(args)
        if mode.startswith("ddp"):
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(model, bucket_cap_mb=25)
        else:
            from torch.distributed.fsdp import fully_shard
            layers = model.model.layers
            for i, layer in enumerate(layers):
                if mode.endswith("ckpt"):
                    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
                    layer = checkpoint_wrapper(layer)
                    layers[i] = layer
                fully_shard(layer)
            fully_shard(model)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        for s in range(args.steps):
            t0 = time.perf_counter()
            ids = batch(args, rank, s)
            saving = torch.autograd.graph.save_on_cpu() if mode == "ddp-off" else contextlib.nullcontext()
            with saving:
                out = model(input_ids=ids)
                loss = lm_loss(out.logits, ids)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        peak = meter.peak()
        dist.barrier()
        dist.destroy_process_group()
        meter.stop()
    with open(os.path.join(args.out, f"{mode}-rank{rank}.json"), "w") as f:
        json.dump({"times": times, "peak": peak, "host": host}, f)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", default="")  # a rank (under torchrun)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default="")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=688)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.mode:
        worker(args)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                    "127.0.0.1", "--master-port", str(free_port()), os.path.abspath(__file__), "--mode", mode,
                    "--out", tmp] + [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                                     if k not in ("mode", "modes", "out", "json")]
            r = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
            if r.returncode != 0:
                sys.exit(f"{mode} failed: {r.stderr[-2000:]}")
            ranks = [json.load(open(os.path.join(tmp, f"{mode}-rank{k}.json"))) for k in range(2)]
            slowest = [max(ts) for ts in zip(*(rk["times"] for rk in ranks))][args.warmup:]
            rows.append({"mode": mode, "step_s": statistics.median(slowest), "peaks": [rk["peak"] for rk in ranks],
                         "host": [rk["host"] for rk in ranks]})
    params = sum(p.numel() for p in build(args).parameters())
    print(f"Llama-style model, {params / 1e6:.1f}M parameters, {args.layers} layers, hidden {args.hidden}, seq {args.seq}, "
          f"micro batch {args.micro_batch} per rank, 2 Gloo ranks x 1 thread; median of {args.steps - args.warmup} steps")
    print(f"{'mode':<18} {'step (s)':>9} {'peak rank 0 (MiB)':>18} {'peak rank 1 (MiB)':>18} {'host pool (MiB)':>16}")
    for r in rows:
        print(f"{r['mode']:<18} {r['step_s']:>9.3f} {r['peaks'][0] / 2**20:>18.1f} {r['peaks'][1] / 2**20:>18.1f} "
              f"{max(r['host']) / 2**20:>16.1f}")
    pairs = [("zeroplan-s0", "ddp"), ("zeroplan-s3", "fsdp2"), ("zeroplan-s3-ckpt", "fsdp2-ckpt"), ("zeroplan-s0-off", "ddp-off")]
    by = {r["mode"]: r for r in rows}
    for z, p in pairs:
        if z in by and p in by:
            print(f"{z} / {p}: step {by[z]['step_s'] / by[p]['step_s']:.2f}x, "
                  f"peak {max(by[z]['peaks']) / max(by[p]['peaks']):.2f}x")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
