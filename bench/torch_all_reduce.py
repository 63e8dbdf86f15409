"""torch.distributed all_reduce (gloo, f32) over a size sweep, started by torchrun on each node:
the peer of chorus-bench in bench/two_hosts_bench.sh, timed the way chorus-bench times (a
barrier before each call, the median of rank 0's calls).
Run: torchrun ... bench/torch_all_reduce.py SIZE[,SIZE...]   (bytes per rank)
Prints on rank 0, to stderr (what Debian's torchrun can tee): op bytes median_us algbw_GBps busbw_GBps (nccl-tests conventions)."""
import os, statistics, sys, time

import torch
import torch.distributed as dist


def main():
    sizes = [int(s) for s in sys.argv[1].split(",")]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    if rank == 0:
        print(f"# torch {torch.__version__} gloo: {n} ranks, f32, rank 0's median", file=sys.stderr)
        print(f"{'op':11s} {'bytes':>10s} {'median_us':>12s} {'algbw_GBps':>10s} {'busbw_GBps':>10s}", file=sys.stderr)
    for b in sizes:
        x = torch.ones(max(1, b // 4), dtype=torch.float32)
        iters = 100 if b <= 65536 else (20 if b <= (1 << 20) else 5)
        for _ in range(3):
            dist.all_reduce(x)
        dist.barrier()
        ts = []
        for _ in range(iters):
            dist.barrier()  # as chorus-bench times: each call from a common start
            t0 = time.perf_counter()
            dist.all_reduce(x)
            ts.append(time.perf_counter() - t0)
        t = statistics.median(ts)
        alg = b / t / 1e9
        if rank == 0:
            print(f"{'all_reduce':11s} {b:>10d} {t * 1e6:12.1f} {alg:10.3f} {alg * 2 * (n - 1) / n:10.3f}", file=sys.stderr, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
