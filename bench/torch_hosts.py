"""torch.distributed collectives (f32) over a size sweep, started by a launcher on each host: the
peer of chorus-bench in bench/hosts_bench.sh, timed the way chorus-bench times (a barrier
before each call, rank 0's median) with its iteration counts and its size conventions (bytes are
per rank: all_gather's input, reduce_scatter's output).

  torchrun ... bench/torch_hosts.py --ops barrier,all_reduce,... --sizes 8,1024,... [--backend gloo]

Prints on rank 0 (stdout): op bytes median_us algbw_GBps busbw_GBps, nccl-tests' conventions."""
import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist


def iterations(nbytes):
    return 200 if nbytes <= 65536 else 50 if nbytes <= 1 << 20 else 10


def timed(fn, iters):
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()  # each call from a common start
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def calls(op, nbytes, n):
    """fn, algorithm bytes, bus factor of one op at nbytes per rank."""
    x = torch.ones(max(1, nbytes // 4))
    if op == "all_reduce":
        return (lambda: dist.all_reduce(x)), nbytes, 2 * (n - 1) / n
    if op == "broadcast":
        return (lambda: dist.broadcast(x, 0)), nbytes, 1.0
    if op == "all_gather":
        out = torch.empty(x.numel() * n)
        return (lambda: dist.all_gather_into_tensor(out, x)), nbytes * n, (n - 1) / n
    if op == "reduce_scatter":
        big = torch.ones(x.numel() * n)
        return (lambda: dist.reduce_scatter_tensor(x, big)), nbytes * n, (n - 1) / n
    raise SystemExit(f"torch_hosts.py: unknown op {op}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default="barrier,all_reduce,broadcast,all_gather,reduce_scatter")
    ap.add_argument("--sizes", default="8,1024,65536,1048576,4194304,16777216,67108864")
    ap.add_argument("--backend", default="gloo")
    args = ap.parse_args()
    if args.backend == "chorus":
        import chorus_torch  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    n, rank = dist.get_world_size(), dist.get_rank()
    if rank == 0:
        print(f"# torch {torch.__version__} {args.backend}: {n} ranks, f32, rank 0's median", flush=True)
        print(f"{'op':14s} {'bytes':>10s} {'median_us':>12s} {'algbw_GBps':>10s} {'busbw_GBps':>10s}", flush=True)
    for op in args.ops.split(","):
        sizes = [0] if op == "barrier" else [int(s) for s in args.sizes.split(",")]
        for nbytes in sizes:
            if op == "barrier":
                fn, alg, factor = dist.barrier, 0, 0.0
            else:
                fn, alg, factor = calls(op, nbytes, n)
            t = timed(fn, iterations(nbytes))
            if rank == 0:
                bw = alg / t / 1e9
                print(f"{op:14s} {nbytes:>10d} {t * 1e6:12.1f} {bw:10.3f} {bw * factor:10.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
