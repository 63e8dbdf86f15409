#!/usr/bin/env python3
"""torch DDP step time of the reference MLP: Linear(2048,2048)-ReLU x3 then Linear(2048,10), 12.6M
f32 parameters; per-rank batch 64, SGD lr 0.01, synthetic data seeded by rank; 5 warm-up steps,
then 30 timed. chorus's C++ DDP runs the same model in chorus-ddp-bench (bench/mlp_model.h).

  OMP_NUM_THREADS=1 bench/peers/torch_ddp.py [WORLD] [--backend gloo|chorus]

Prints rank 0's median and 90th-percentile step time in ms."""
import statistics
import time

import torch
import torch.nn as nn

import common


def body(rank, world, backend, args):
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(common.reference_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 2048, generator=gen), torch.randint(0, 10, (64,), generator=gen)
    times = []
    for step in range(35):
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step >= 5:
            times.append(time.perf_counter() - start)
    if rank == 0:
        times.sort()
        params = sum(p.numel() for p in model.parameters())
        print(f"torch_ddp_{backend} world={world} params={params} median_ms={statistics.median(times) * 1e3:.2f} "
              f"p90_ms={times[int(0.9 * len(times))] * 1e3:.2f}")


if __name__ == "__main__":
    common.spawn(body, common.arguments(__doc__))
