"""The seeds' libraries on a backend, one case per run, launched by torchrun (bench/libraries_bench.sh
runs every case on gloo and chorus at W=2 and W=4, interleaved):

  torchrun --nproc-per-node W bench/libraries_bench.py fabric|accelerate|dcp --backend gloo|chorus

fabric, accelerate: a DDP training step on the reference MLP of bench/peers/torch_ddp.py
  (Linear(2048,2048)-ReLU x3, Linear(2048,10); batch 64 per rank, SGD), through Fabric
  (DDPStrategy(process_group_backend=...)) or Accelerate (the group started first, then
  Accelerator(cpu=True)); the step and the step under no_sync (Fabric's no_backward_sync,
  Accelerate's no_sync), in interleaved blocks of 5 steps (2 warm-up and 8 timed blocks of each;
  the slowest rank's time per step, median over blocks); exposed communication = the step minus
  the no_sync step.
dcp: torch.distributed.checkpoint save and load of the 100.7M-parameter MLP of
  bench/peers/torch_zero.py, FSDP2-sharded (fully_shard per Linear), with Adam's
  state after one step (1.13 GiB over all ranks), to a fresh directory under $TMPDIR, after an
  os.sync() (the pages a previous save left dirty would otherwise be written during this one);
  median of 3.
Prints rank 0's medians in ms, one line per case."""
import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
from common import reference_mlp, wide_mlp  # noqa: E402  (bench/peers/common.py)

warnings.filterwarnings("ignore")


def timed_pairs(step, local_step, blocks=8, warmup=2, k=5):
    """Per-step times of `step` and `local_step`, each run in blocks of k steps that start together
    after a barrier, the two kinds interleaved: the median over blocks of the slowest rank's
    block time / k. With more ranks than cores, one step after a barrier would time how the
    barrier happened to release the ranks (a rank released first computes alone for a while);
    a block of steps times what training runs at."""
    times = {step: [], local_step: []}
    for i in range(warmup + blocks):
        for fn in (step, local_step):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            slowest = torch.tensor([(time.perf_counter() - t0) / k], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if i >= warmup:
                times[fn].append(slowest.item())
    return statistics.median(times[step]) * 1e3, statistics.median(times[local_step]) * 1e3


def timed_steps(model, opt, backward, no_sync):
    """timed_pairs of a training step and the same step inside `no_sync()`, through the library's
    `backward`."""
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(64, 2048, generator=g), torch.randint(0, 10, (64,), generator=g)

    def step(sync=True):
        opt.zero_grad()
        with contextlib.nullcontext() if sync else no_sync():
            backward(nn.functional.cross_entropy(model(x), y))
        opt.step()

    return timed_pairs(step, lambda: step(sync=False))


def fabric_case(backend):
    from lightning.fabric import Fabric
    from lightning.fabric.strategies import DDPStrategy

    fabric = Fabric(accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]),
                    strategy=DDPStrategy(process_group_backend=backend))
    fabric.launch()
    torch.manual_seed(0)
    model = reference_mlp()
    model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.01))
    return timed_steps(model, opt, fabric.backward, lambda: fabric.no_backward_sync(model))


def accelerate_case(backend):
    dist.init_process_group(backend)
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = reference_mlp()
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    return timed_steps(model, opt, accelerator.backward, lambda: accelerator.no_sync(model))


def dcp_case(backend):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group(backend)
    model = wide_mlp()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(4, 4096)).sum().backward()
    opt.step()
    model_sd, opt_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": opt_sd}
    saves, loads = [], []
    for _ in range(3):
        where = [tempfile.mkdtemp(prefix="chorus-dcp-") if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(where)
        if dist.get_rank() == 0:
            os.sync()  # the last run's written pages leave first, so each save starts from a clean cache
        dist.barrier()
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=where[0])
        dist.barrier()
        saves.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        dcp.load(state, checkpoint_id=where[0])
        dist.barrier()
        loads.append(time.perf_counter() - t0)
        if dist.get_rank() == 0:
            shutil.rmtree(where[0])
    return statistics.median(saves) * 1e3, statistics.median(loads) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=["fabric", "accelerate", "dcp"])
    ap.add_argument("--backend", default="chorus")
    args = ap.parse_args()
    torch.set_num_threads(1)
    a, b = {"fabric": fabric_case, "accelerate": accelerate_case, "dcp": dcp_case}[args.case](args.backend)
    world = dist.get_world_size()
    if dist.get_rank() == 0:
        if args.case == "dcp":
            print(f"dcp_{args.backend} world={world} save_ms={a:.1f} load_ms={b:.1f}", flush=True)
        else:
            print(f"{args.case}_{args.backend} world={world} step_ms={a:.2f} no_sync_step_ms={b:.2f} "
                  f"exposed_comm_ms={a - b:.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
