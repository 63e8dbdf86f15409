"""What bench/peers does not time, for backends gloo and chorus alike: reduce_scatter_tensor
and all_gather_into_tensor of 64 MiB (what FSDP2 calls), and DDP's exposed communication on the
reference MLP (Linear(2048,2048)-ReLU x3, Linear(2048,10); batch 64 per rank, SGD): the median step
minus the median step under no_sync, in the same processes, interleaved. Its parts: the all_reduce
of the gradients' bytes from Python, in the memory the backend gives DDP's buckets
(Backend.allocate_tensor where the backend offers it), and DDP again with
gradient_as_bucket_view=True, which saves torch's reducer its copy of the bucket back into .grad.

  .venv/bin/python bench/python_extras.py WORLD --backend gloo|chorus
Prints rank 0's medians."""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import common  # noqa: E402
from common import reference_mlp  # noqa: E402


def exposed(rank, gradient_as_bucket_view):
    """DDP's median step with sync and under no_sync (s), interleaved step by step."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(reference_mlp(), gradient_as_bucket_view=gradient_as_bucket_view)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 2048, generator=g), torch.randint(0, 10, (64,), generator=g)

    def step(sync):
        opt.zero_grad()
        if sync:
            nn.functional.cross_entropy(model(x), y).backward()
        else:
            with model.no_sync():
                nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    synced, local = [], []
    for i in range(45):  # interleaved, so that drift on a shared machine hits both alike
        t0 = time.perf_counter()
        step(i % 2 == 0)
        (synced if i % 2 == 0 else local).append(time.perf_counter() - t0)
    return statistics.median(synced[2:]), statistics.median(local[2:])


def body(rank, world, backend, args):
    out = []
    n = (64 << 20) // 4
    big = torch.ones(n)
    part = torch.empty(n // world)
    t = common.median_seconds(lambda: dist.reduce_scatter_single(part, big), 5, warmup=2, barrier_each=True)  # reduce_scatter_tensor before torch 2.13
    out.append(f"reduce_scatter_tensor 64 MiB in: {t * 1e3:.2f} ms")
    whole = torch.empty(n * world)
    t = common.median_seconds(lambda: dist.all_gather_single(whole, big), 5, warmup=2, barrier_each=True)  # all_gather_into_tensor before torch 2.13
    out.append(f"all_gather_into_tensor 64 MiB per rank: {t * 1e3:.2f} ms")

    grads = sum(p.numel() for p in reference_mlp().parameters())  # f32, as DDP's buckets hold them
    backend_of = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    if backend_of.supports_tensor_alloc(torch.device("cpu")):
        bucket = backend_of.allocate_tensor(grads, dtype=torch.float32, device=torch.device("cpu"))
    else:
        bucket = torch.empty(grads)
    bucket.fill_(1.0)
    t = common.median_seconds(lambda: dist.all_reduce(bucket), 10, warmup=2, barrier_each=True)
    out.append(f"all_reduce of the gradients' {grads * 4} B in DDP's bucket memory: {t * 1e3:.2f} ms")

    for as_view in (False, True):
        synced, local = exposed(rank, as_view)
        name = "ddp (gradient_as_bucket_view)" if as_view else "ddp"
        out.append(f"{name} step {synced * 1e3:.1f} ms, no_sync step {local * 1e3:.1f} ms, "
                   f"exposed communication {(synced - local) * 1e3:.1f} ms")
    if rank == 0:
        print(f"# {backend}, torch {torch.__version__}, {world} ranks")
        for line in out:
            print(line)


if __name__ == "__main__":
    common.spawn(body, common.arguments(__doc__))
