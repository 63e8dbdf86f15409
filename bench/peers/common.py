"""What the torch peer benchmarks share: the backend flag, the world of spawned ranks, timing,
and the reference MLP (bench/python_extras.py and libraries_bench.py use them too).

Every script takes WORLD (default 2) and --backend NAME (default gloo). "chorus" imports
chorus_torch first, in each spawned rank too (spawned children do not run the parent's __main__),
so one script measures torch's gloo and chorus's backend on the same workload in one run. Each
rank uses one intra-op thread: ranks, not threads, share the cores."""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def arguments(doc, extra=None):
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("world", nargs="?", type=int, default=2, help="ranks to spawn (default 2)")
    ap.add_argument("--backend", default="gloo", help="gloo (default), chorus, or any registered backend")
    if extra:
        extra(ap)
    return ap.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, backend, body, args):
    if backend == "chorus":
        import chorus_torch  # noqa: F401  (registers the backend)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        body(rank, world, backend, args)
    finally:
        dist.destroy_process_group()


def spawn(body, args):
    """Runs body(rank, world, backend, args) on args.world spawned ranks of one group."""
    mp.spawn(_rank_main, args=(args.world, free_port(), args.backend, body, args), nprocs=args.world)


def median_seconds(fn, iters, warmup=3, barrier_each=False):
    """fn's median time over iters calls, after warm-up and a barrier; with barrier_each, every
    call starts from a barrier of its own (a common start)."""
    for _ in range(warmup):
        fn()
    dist.barrier()
    times = []
    for _ in range(iters):
        if barrier_each:
            dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def reference_mlp():
    """Linear(2048,2048)-ReLU x3, then Linear(2048,10): 12.6M f32 parameters (bench/mlp_model.h in C++)."""
    return nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048),
                         nn.ReLU(), nn.Linear(2048, 10))


def wide_mlp():
    """Linear(4096,4096)-ReLU x6, then Linear(4096,10): 100.7M f32 parameters (chorus-sharded-bench's model)."""
    layers = []
    for _ in range(6):
        layers += [nn.Linear(4096, 4096), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(4096, 10))
