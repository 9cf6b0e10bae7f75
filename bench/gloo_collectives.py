#!/usr/bin/env python3
"""Gloo collectives of the pinned wheel on this machine, each against the alternative built from other
collectives: what zeroplan's stages 1-3 and FSDP2 call (all_gather_into_tensor, reduce_scatter_tensor)
against N broadcasts / N reduces into the chunks (what ZeroRedundancyOptimizer does for its all-gather).
Median of 5 after one untimed call, rank 0 prints.

  OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo .venv/bin/torchrun --nproc-per-node 2 --master-addr 127.0.0.1 \\
      bench/gloo_collectives.py --mib 28 100
"""

import argparse
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, nargs="+", default=[28, 100], help="full-buffer sizes (28: one gpt2-small block)")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    for mib in a.mib:
        n = mib * 1024 * 1024 // 4 // world * world
        full_in, full_out, shard = torch.randn(n), torch.empty(n), torch.empty(n // world)
        out_chunks, in_chunks = list(full_out.chunk(world)), list(full_in.chunk(world))

        def timed(name, f):
            f()
            dist.barrier()
            ts = []
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
            if rank == 0:
                print(f"{mib:5d} MiB  {name:40s} {sorted(ts)[len(ts) // 2] * 1e3:8.1f} ms", flush=True)

        timed("all_reduce", lambda: dist.all_reduce(full_in))
        timed("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(shard, full_in))
        timed(f"{world} x reduce (one per chunk root)", lambda: [dist.reduce(c, r) for r, c in enumerate(in_chunks)])
        timed("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(full_out, shard))
        timed("all_gather (list of chunks)", lambda: dist.all_gather(out_chunks, shard))
        timed(f"{world} x broadcast (one per chunk root)", lambda: [dist.broadcast(c, r) for r, c in enumerate(out_chunks)])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
