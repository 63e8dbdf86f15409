"""The main job's model (examples/train_ddp: 64 -> 512 -> 512 -> 10, SGD with momentum, batch 64
per rank, a synthetic 10-class dataset) as a torch DDP script for torchrun's elastic launch: it
checkpoints every N steps (torch.save by rank 0) and, restarted at any size, resumes from the
checkpoint where the epoch was. Rank 0 stamps every step ("step S done at unix ms T") and the
first one after a resume, for bench/elastic_recovery.sh.

    torchrun --nnodes 2:3 --rdzv-backend c10d ... elastic_train.py CHECKPOINT [--backend gloo]
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("checkpoint")
ap.add_argument("--backend", default="gloo")
ap.add_argument("--train-size", type=int, default=24000)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--checkpoint-every", type=int, default=10)
args = ap.parse_args()
if args.backend == "chorus":
    import chorus_torch  # noqa: F401

torch.set_num_threads(1)
dist.init_process_group(args.backend)
rank, world = dist.get_rank(), dist.get_world_size()
gen = torch.Generator().manual_seed(2026)
centers = torch.randn(10, 64, generator=gen) * 0.8
y = torch.randint(0, 10, (args.train_size,), generator=gen)
x = centers[y] + torch.randn(args.train_size, 64, generator=gen) * 2.5
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
step, epoch, position = 0, 1, 0  # position: samples of the epoch consumed by all ranks
if os.path.exists(args.checkpoint):
    s = torch.load(args.checkpoint)
    model.load_state_dict(s["model"])
    opt.load_state_dict(s["opt"])
    step, epoch, position = s["step"], s["epoch"], s["position"]
    if rank == 0:
        print(f"resumed from step {step} at {world} ranks", flush=True)
first = True
order = torch.randperm(args.train_size, generator=torch.Generator().manual_seed(epoch))[position:]
usable = len(order) // world * world
mine = order[:usable][rank::world]
for s in range(len(mine) // args.batch):
    idx = mine[s * args.batch:(s + 1) * args.batch]
    opt.zero_grad()
    F.cross_entropy(ddp(x[idx]), y[idx]).backward()
    opt.step()
    step += 1
    position += args.batch * world
    if rank == 0:
        now = int(time.time() * 1000)
        print(f"step {step} done at unix ms {now}" + (" (first after resuming)" if first else ""), flush=True)
    first = False
    if step % args.checkpoint_every == 0 and rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "epoch": epoch,
                    "position": position}, args.checkpoint + ".tmp")
        os.replace(args.checkpoint + ".tmp", args.checkpoint)
dist.barrier()
if rank == 0:
    print(f"done: {step} steps", flush=True)
dist.destroy_process_group()
