"""A torch DDP job on backend "chorus" that checkpoints every step and resumes at whatever size
an elastic launcher restarts it with (torchrun --nnodes 1:2, chorusrun --nnodes 1:2).

    elastic_ddp.py CHECKPOINT STEPS
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import chorus_torch  # noqa: F401  registers the backend

ckpt, steps = sys.argv[1], int(sys.argv[2])
dist.init_process_group("chorus")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
step = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    step = state["step"]
    print(f"rank {rank}: resumed from step {step} at world {world} (round {os.environ.get('TORCHELASTIC_RESTART_COUNT')})",
          flush=True)
else:
    print(f"rank {rank}: started at world {world}", flush=True)
while step < steps:
    loss = ddp(torch.full((4, 8), 0.01 * (step % 7))).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    dist.barrier()
    time.sleep(0.05)
print(f"rank {rank}: done, {step} steps, at world {world}", flush=True)
dist.destroy_process_group()
