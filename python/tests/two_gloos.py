"""Two gloos in one process (Note [One gloo per process], cmake/gloo.cmake): torch's own, inside
libtorch_cpu.so, and chorus's private copy behind its gloo engine (the path chorus takes between
hosts; CHORUS_BACKEND=gloo makes it take that path on one host too).

1. What each library exports: libtorch_cpu.so exports its gloo (the reason for the note); chorus's
   extension exports no gloo symbol at all, so neither copy can bind to the other.
2. Both at once, as Lightning's rank_zero_first does (a torch gloo group made beside the user's
   backend): each rank runs collectives on a chorus group on the gloo engine and on a torch gloo
   group, one after the other and overlapping, with sizes that take gloo's multi-buffer paths,
   and checks every value. scripts/test.sh also runs this under AddressSanitizer.

  PYTHONPATH=<build>/python/site .venv/bin/python python/tests/two_gloos.py [world]"""
import os
import subprocess
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def exported_gloo(path):
    out = subprocess.run(["nm", "-D", "--defined-only", "-C", path], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if "gloo::" in line]


def check_exports():
    import chorus_torch

    torch_cpu = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    theirs = exported_gloo(torch_cpu)
    ours = exported_gloo(chorus_torch._C.__file__)
    assert not ours, f"chorus_torch exports gloo symbols: {ours[:5]}"
    print(f"exports: libtorch_cpu.so {len(theirs)} gloo symbols, chorus_torch._C none")


def rank_main(rank, world, init):
    torch.set_num_threads(1)
    dist.init_process_group("chorus", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    import chorus_torch

    assert chorus_torch.engine() == "gloo", chorus_torch.engine()
    torch_gloo = dist.new_group(backend="gloo")  # torch's gloo, as Lightning's _InfiniteBarrier makes it
    chorus_gloo = dist.distributed_c10d._get_default_group()
    total = world * (world + 1) / 2
    for step, n in enumerate([1, 7, 1000, 1 << 16, 1 << 20, 3 << 20] * 4):
        a = torch.full((n,), float(rank + 1))
        b = torch.full((n,), float(rank + 1) * 2)
        if step % 2:  # one after the other
            dist.all_reduce(a, group=chorus_gloo)
            dist.all_reduce(b, group=torch_gloo)
        else:  # both in flight at once
            wa = dist.all_reduce(a, group=chorus_gloo, async_op=True)
            wb = dist.all_reduce(b, group=torch_gloo, async_op=True)
            wb.wait()
            wa.wait()
        assert torch.all(a == total) and torch.all(b == 2 * total), (step, n, a[:3], b[:3])
        for group in (chorus_gloo, torch_gloo):
            out = [torch.empty(n) for _ in range(world)]
            dist.all_gather(out, a * (rank + 1), group=group)
            assert all(torch.all(o == total * (r + 1)) for r, o in enumerate(out)), (step, n)
            c = torch.arange(n, dtype=torch.float64) if rank == 0 else torch.zeros(n, dtype=torch.float64)
            dist.broadcast(c, 0, group=group)
            assert torch.equal(c, torch.arange(n, dtype=torch.float64)), (step, n)
    dist.monitored_barrier(group=torch_gloo, timeout=timedelta(seconds=60))
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"both gloos: {world} ranks, chorus's gloo engine and a torch gloo group, every value checked")


if __name__ == "__main__":
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    os.environ["CHORUS_BACKEND"] = "gloo"  # the spawned ranks inherit it
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    check_exports()
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(rank_main, args=(world, f"file://{d}/store"), nprocs=world)
