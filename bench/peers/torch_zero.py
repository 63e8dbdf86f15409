#!/usr/bin/env python3
"""Sharded data parallel in torch, on the CPU: DDP with Adam (ddp_adam), DDP with torch's
ZeroRedundancyOptimizer (zero1: Adam's state sharded), and FSDP2 (fsdp2: fully_shard on every
Linear and on the root, ZeRO-3). Model: Linear(4096,4096)-ReLU x6 then Linear(4096,10), 100.7M f32
parameters, Adam lr 1e-4; per-rank batch 16, synthetic data seeded by rank; 2 warm-up steps, then
8 timed. chorus's C++ ShardedDataParallel runs the same model in chorus-sharded-bench.

  OMP_NUM_THREADS=1 bench/peers/torch_zero.py [WORLD] [--backend gloo|chorus] [--modes ddp_adam,zero1,fsdp2]

Prints per mode rank 0's median step in ms, its peak RSS and its model state (parameters,
gradients and optimizer state this rank holds), in MiB."""
import resource
import statistics
import time

import torch
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer

import common

MODES = ("ddp_adam", "zero1", "fsdp2")


def local(t):
    """This rank's part of a DTensor (FSDP2's parameters, gradients and Adam state), else t."""
    return t.to_local() if hasattr(t, "to_local") else t


def state_mib(model, opt):
    held = sum(local(p).numel() * p.element_size() for p in model.parameters())
    held += sum(local(p.grad).numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    inner = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt
    for state in inner.state.values():
        held += sum(local(t).numel() * t.element_size() for t in state.values() if torch.is_tensor(t) and t.dim() > 0)
    return held / 2**20


def body(rank, world, backend, args):
    torch.manual_seed(0)
    if args.mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        model = common.wide_mlp()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        inner = model
    else:
        model = nn.parallel.DistributedDataParallel(common.wide_mlp())
        inner = model.module
    if args.mode == "zero1":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, 4096, generator=gen), torch.randint(0, 10, (16,), generator=gen)
    times = []
    for step in range(10):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step >= 2:
            times.append(time.perf_counter() - start)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"torch_{args.mode}_{backend} world={world} params={params} median_ms={statistics.median(times) * 1e3:.1f} "
              f"peak_rss_mib={rss:.0f} model_state_mib={state_mib(inner, opt):.0f}", flush=True)


def main():
    args = common.arguments(__doc__, lambda ap: ap.add_argument("--modes", default=",".join(MODES)))
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"torch_zero.py: unknown mode {mode!r}; modes: {', '.join(MODES)}")
        args.mode = mode
        common.spawn(body, args)  # a fresh world per mode: peak RSS is per process


if __name__ == "__main__":
    main()
