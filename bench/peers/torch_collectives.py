#!/usr/bin/env python3
"""torch.distributed collectives on one machine: barrier, then all_reduce, all_gather and
broadcast of f32 over 8 B to 64 MiB per rank. What PyTorch users get on CPU with gloo, and the same
calls on chorus's backend (--backend chorus).

  bench/peers/torch_collectives.py [WORLD] [--backend gloo|chorus]

Prints, on rank 0: op bytes median_us algbw_GBps busbw_GBps (nccl-tests' conventions: all_reduce
busbw = algbw * 2(n-1)/n; all_gather counts the whole gathered size and (n-1)/n; broadcast
busbw = algbw). Times are rank 0's median."""
import torch
import torch.distributed as dist

import common

SIZES = [8, 1024, 65536, 1 << 20, 16 << 20, 64 << 20]


def body(rank, n, backend, args):
    rows = [("barrier", 0, common.median_seconds(dist.barrier, 200), 0.0, 0.0)]
    for size in SIZES:
        x = torch.ones(max(1, size // 4))
        gathered = [torch.empty_like(x) for _ in range(n)]
        iters = 50 if size <= 65536 else 20 if size <= 1 << 20 else 5
        t = common.median_seconds(lambda: dist.all_reduce(x), iters)
        rows.append(("all_reduce", size, t, size / t / 1e9, size / t / 1e9 * 2 * (n - 1) / n))
        t = common.median_seconds(lambda: dist.all_gather(gathered, x), iters)
        rows.append(("all_gather", size, t, size * n / t / 1e9, size * n / t / 1e9 * (n - 1) / n))
        t = common.median_seconds(lambda: dist.broadcast(x, 0), iters)
        rows.append(("broadcast", size, t, size / t / 1e9, size / t / 1e9))
    if rank == 0:
        print(f"# torch {torch.__version__}, backend {backend}, {n} ranks")
        for op, size, t, alg, bus in rows:
            print(f"{op:11s} {size:>10d} {t * 1e6:12.1f} {alg:8.3f} {bus:8.3f}")


if __name__ == "__main__":
    common.spawn(body, common.arguments(__doc__))
