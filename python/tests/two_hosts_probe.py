"""Run by tests/python_two_hosts.sh: one rank of a world spread over two "hosts" (network
namespaces), launched by chorusrun, meeting through torch's env:// store. Checks collectives
and a short DDP run, and says which chorus engine carried them."""
import torch
import torch.distributed as dist

import chorus_torch

dist.init_process_group("chorus")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.arange(1000, dtype=torch.float32) + rank
dist.all_reduce(t)
assert torch.equal(t, torch.arange(1000, dtype=torch.float32) * world + world * (world - 1) / 2), t
outs = [torch.empty(3, dtype=torch.int64) for _ in range(world)]
dist.all_gather(outs, torch.full((3,), rank, dtype=torch.int64))
assert [o[0].item() for o in outs] == list(range(world)), outs

torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                                                      torch.nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(rank)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
every = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(every, flat)
assert all(torch.equal(e, every[0]) for e in every), "DDP replicas differ"
print(f"rank {rank}: engine {chorus_torch.engine()}; collectives and DDP correct", flush=True)
dist.destroy_process_group()
