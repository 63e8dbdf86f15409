"""First checks of backend "chorus" from Python: collectives, futures, DDP, a subgroup.
Usage: PYTHONPATH=<build>/python/site .venv/bin/python python/tests/smoke.py [world]"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def body(rank, world, init):
    import chorus_torch  # noqa: F401  registers "chorus"
    torch.set_num_threads(1)
    dist.init_process_group("chorus", init_method=init, rank=rank, world_size=world)
    assert dist.get_backend() == "chorus", dist.get_backend()
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), float(sum(range(1, world + 1))))), t
    for op, want in [(dist.ReduceOp.MAX, world), (dist.ReduceOp.MIN, 1), (dist.ReduceOp.PRODUCT, 1)]:
        x = torch.tensor([rank + 1 if op != dist.ReduceOp.PRODUCT else 1], dtype=torch.int64)
        dist.all_reduce(x, op=op)
        assert x.item() == want, (op, x)
    b = torch.arange(4.0) if rank == 0 else torch.zeros(4)
    dist.broadcast(b, 0)
    assert torch.equal(b, torch.arange(4.0)), b
    outs = [torch.zeros(3) for _ in range(world)]
    dist.all_gather(outs, torch.full((3,), float(rank)))
    assert all(torch.equal(o, torch.full((3,), float(r))) for r, o in enumerate(outs)), outs
    flat = torch.zeros(world * 2)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(rank)))
    assert torch.equal(flat, torch.arange(world).float().repeat_interleave(2)), flat
    rs = torch.zeros(2)
    dist.reduce_scatter_tensor(rs, torch.ones(world * 2))
    assert torch.equal(rs, torch.full((2,), float(world))), rs
    work = dist.all_reduce(torch.ones(2), async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    assert torch.equal(fut.wait(), torch.full((2,), 2.0 * world))
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(world)], objs
    g = [torch.zeros(2) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank)), g, dst=0)
    if rank == 0:
        assert all(torch.equal(x, torch.full((2,), float(r))) for r, x in enumerate(g)), g
    sc = torch.zeros(3)
    dist.scatter(sc, [torch.full((3,), float(r)) for r in range(world)] if rank == 0 else None, src=0)
    assert torch.equal(sc, torch.full((3,), float(rank))), sc
    rsl = torch.zeros(2)
    dist.reduce_scatter(rsl, [torch.full((2,), float(r)) for r in range(world)])
    assert torch.equal(rsl, torch.full((2,), float(rank * world))), rsl
    a2a = torch.zeros(world * 2)
    dist.all_to_all_single(a2a, torch.arange(world * 2).float() + 100 * rank)
    want = torch.cat([torch.arange(rank * 2, rank * 2 + 2).float() + 100 * p for p in range(world)])
    assert torch.equal(a2a, want), a2a
    if world > 1:
        if rank == 0:
            dist.send(torch.arange(3.0), 1)
        elif rank == 1:
            r = torch.zeros(3)
            dist.recv(r, 0)
            assert torch.equal(r, torch.arange(3.0)), r
    dist.barrier()
    # DDP: replicas stay equal.
    torch.manual_seed(rank)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(g, gathered[0]) for g in gathered), "DDP replicas differ"
    dist.destroy_process_group()


if __name__ == "__main__":
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(body, args=(world, f"file://{d}/rendezvous"), nprocs=world)
    print(f"chorus backend smoke test passed at world size {world}")
