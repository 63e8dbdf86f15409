#!/usr/bin/env python3
"""Runs chorus-bench next to its peers in bench/peers (Open MPI, torch gloo) in one go and
prints, per world size, each one's median time and busbw and chorus's speed-up over each peer.
chorus runs twice: on ordinary buffers, and (column chorus_sym) on buffers from
Communicator::alloc_symmetric, which shared memory moves directly between the ranks. The floor,
one 64 MiB memcpy on one core (membw.c), is measured in the same run, and so is what two
processes copying 64 MiB at once take each (membw_pair.c): every rank of a collective copies while
its peers do, so this says whether the cores share the memory's speed or each gets its own.
Where they share it, the pair's time is the floor an all_reduce can meet (each rank reads its 64
MiB input and writes its 64 MiB output while its peer does the same), and chorus is judged against
both floors. With more ranks than cores each core must copy for several ranks, and each floor is
that many memcpys (printed, and used by the verdicts, as such). Unloaded runs also time
staged_model.c: the copies and folds of chorus's all_reduce on ordinary buffers (two-shot, or
with more ranks than cores the ring) done by threads, without processes or waits, as fast as that
data movement goes on the machine.

Open MPI runs twice too: as programs call it (column mpi, peers/mpi_collectives.c), which never writes its buffers
again, and bench/mpi_tail.c --fresh (column mpi_fresh), which writes each input before every call
as chorus-bench does. Only the second is the same workload as chorus's: with unchanged buffers a
peer's data sits in the reader's cache from the previous call, and Open MPI's single copy moves
nothing between cores. The verdict "at least as fast as Open MPI" is taken against mpi_fresh;
where Open MPI as programs call it is faster is listed beside it. chorus-bench checks the result
of each size's last call only (--check-last): mpi_tail checks nothing, and checking every call
is work between the calls that, with more ranks than cores, slows the calls after it.

  bench/compare.py --build build [--np 2,4,8] [--gloo-np 2] [--repeat 3] [--out bench-results] [--load [matmul]]
                   [--last-rank]

--load runs a CPU-bound process beside every benchmark (one core taken from the ranks) and prints
the 95th percentile next to the median, chorus against Open MPI (bench/mpi_tail.c): how much a
rank that spins loses when a core is not its own. Loaded, both time more calls (--tail: 400 up to
1 MiB, 40 beyond), so that a p95 is not decided by whether a third call met a time slice, after as
many untimed ones: the p95 of a loop's steady calls, past the first calls of a size, in which
chorus's rank 0 tries its ways of moving the data.
--load matmul loads the ranks themselves, as a training step does: before every call each rank
multiplies two 256 x 256 float matrices on two intra-op threads of torch (bench/step_load.cc, the
same code in chorus-bench and in mpi_tail.c), whose idle thread, by OpenMP's default, then polls
on while the call runs. chorus-bench's ranks get OMP_WAIT_POLICY=PASSIVE from its launcher as
chorusrun's do (Note [Threads of ranks that share the cores]); mpirun sets nothing, and Open MPI
runs a second time with the same setting (column mpi_passive, printed apart).

Each call is timed on rank 0, as mpi_collectives.c times it. For a broadcast that is its root's
time, which leaves once its message is handed on: Open MPI 4.1's fixed rules send a message of 1
MiB and more to 4-7 ranks down one unsegmented chain (rank 1 reads the whole message out of the
root's buffer, then rank 2 out of rank 1's, and so on), so its root returns after one copy and the
chain's end has the data three copies later. --last-rank times
each call on the rank that finished it last instead (chorus-bench and mpi_tail.c --last-rank),
against mpi_fresh only: when the collective is done for every rank.

The barrier is compared by its median, as mpi_collectives.c reports it, and by its mean over the 1000
calls: with more ranks than cores rank 0's barrier times split in two groups (the calls it reached
last, and those in which it waited for its core to come back), and the median lands on either.

Machines are shared and noisy: compare the ratios of one run, not absolute figures across runs.
With --repeat N the three are run N times, interleaved, and each figure is the median of the N
runs' medians, which keeps one disturbed run from deciding a comparison. Within a run chorus and
Open MPI on its workload (mpi_tail) take turns a few sizes at a time (up to 1 MiB with the
barrier, then 16 MiB, then 64 MiB), each turn seconds to a minute long: a 2-core VM changes state
under a run (its two vCPUs moved to cores that share a cache or not, the barrier's time doubling;
docs/performance.md), and a side timed whole, a minute or more after the other, could meet the
other state (in one such --load run, chorus's three W=2 runs all met the slow state and two of
Open MPI's the fast one). Each run's barrier is printed for both sides: the state it met.
Writes the raw outputs and a combined CSV (world,op,bytes,impl,median_us,busbw_GBps,p95_us,mean_us;
the last two where the benchmark reports them: chorus-bench, mpi_tail.c) to --out.
"""
import contextlib
import csv
import os
import re
import subprocess
import sys

import runner

SIZES = [8, 1024, 65536, 1 << 20, 16 << 20, 64 << 20]
PARTS = [SIZES[:4], SIZES[4:5], SIZES[5:]]  # timed on each side in turn (the barrier with the first)
STEP_MATMUL = 256  # --load matmul: the side of the matrices each rank multiplies before every call
OPS = ["barrier", "all_reduce", "all_gather", "broadcast"]
# combined.csv: a row's key, then its measures (median and busbw; chorus-bench's and mpi_tail's also p95 and mean)
CSV_KEY = ["world", "op", "bytes", "impl"]
CSV_MEASURES = ["median_us", "busbw_GBps", "p95_us", "mean_us"]


def parse_table(text):
    """'op bytes median_us [algbw busbw]' lines -> {(op, bytes): (median_us, busbw)}."""
    rows = {}
    for line in text.splitlines():
        parts = line.replace(",", " ").split()
        if len(parts) < 3 or parts[0].startswith("#") or parts[0] == "op":
            continue
        try:
            op, size, med = parts[0], int(parts[1]), float(parts[2])
        except ValueError:
            continue
        busbw = float(parts[4]) if len(parts) > 4 and parts[0] != "barrier" else 0.0
        rows[(op, size)] = (med, busbw)
    return rows


def chorus_rows(build, world, ops, out, symmetric=False, step=(), sizes=SIZES):
    """chorus-bench's table; with symmetric, between buffers from Communicator::alloc_symmetric; step:
    the arguments of a step's compute before every call."""
    cmd = [os.path.join(build, "bench", "chorus-bench"), "--np", str(world), "--ops", ",".join(ops),
           "--sizes", ",".join(str(s) for s in sizes), "--csv", "--check-last"] + (["--symmetric"] if symmetric else []) + list(step)
    name = "chorus_sym" if symmetric else "chorus"
    text = runner.run(cmd, log=os.path.join(out, f"{name}_w{world}_{len(os.listdir(out))}.txt"))
    rows = {}
    for line in text.splitlines():
        if line.startswith("#") or line.startswith("op,"):
            continue
        op, size, med, p95, mean, _alg, bus, check = line.split(",")
        if check == "FAIL":
            sys.exit(f"chorus-bench reported a wrong result for {op} {size}")
        rows[(op, int(size))] = (float(med), float(bus), float(p95), float(mean))
    return rows


def busbw(op, size, world, us):
    """nccl-tests' bus bandwidth in GB/s of a call of `size` bytes per rank that took `us`."""
    if op == "barrier" or us <= 0:
        return 0.0
    factor = {"all_reduce": 2 * (world - 1) / world, "all_gather": world * (world - 1) / world}.get(op, 1.0)
    return size / (us * 1e-6) / 1e9 * factor


def tail_rows(text, world):
    """mpi_tail's 'op bytes median_us p95_us mean_us' lines -> {(op, bytes): (median_us, busbw, p95_us, mean_us)}."""
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] != "op":
            op, size, med = parts[0], int(parts[1]), float(parts[2])
            rows[(op, size)] = (med, busbw(op, size, world, med), float(parts[3]), float(parts[4]))
    return rows


def pair_memcpy_us(text):
    """membw_pair's line -> the time of a 64 MiB memcpy while another process does one too, in us."""
    m = re.search(r"memcpy, \d+ at once: ([\d.]+) us", text)
    if not m:
        sys.exit("membw_pair printed no time")
    return float(m.group(1))


def staged_model_us(text):
    """staged_model's line -> {"best", "median"}: its runs' times of the all_reduce's copies and
    folds alone (two-shot, or the ring), in us."""
    m = re.search(r"(two-shot|ring) all_reduce model, .* rounds of \d+ KiB: best ([\d.]+) us, median ([\d.]+) us", text)
    if not m:
        sys.exit("staged_model printed no time")
    return {"best": float(m.group(2)), "median": float(m.group(3))}


def memcpy_floor_us(text):
    """membw's 64 MiB line -> the time of one 64 MiB memcpy on one core, in us."""
    for line in text.splitlines():
        m = re.match(r"\s*(\d+) memcpy ([\d.]+) GB/s", line)
        if m and int(m.group(1)) == 64 << 20:
            return (64 << 20) / (float(m.group(2)) * 1e9) * 1e6
    sys.exit("membw printed no 64 MiB memcpy line")


@contextlib.contextmanager
def cpu_load(on):
    """With on: a CPU-bound process runs until the block ends."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if on else None
    try:
        yield
    finally:
        if hog:
            hog.kill()
            hog.wait()


def load_table(title, chorus, mpi, ops):
    """Prints median and p95 of chorus and Open MPI side by side; returns the rows ((op, size), chorus, mpi)."""
    print(f"\n## {title}: p95 / median (us), chorus and Open MPI")
    print(f"{'op':11s} {'bytes':>9s} {'chorus_med':>10s} {'chorus_p95':>10s} {'mpi_med':>10s} {'mpi_p95':>10s}"
          f" {'med xmpi':>8s} {'p95 xmpi':>8s}")
    rows = []
    for op in ops:
        for size in SIZES:
            c, m = chorus.get((op, size)), mpi.get((op, size))
            if c and m:
                print(f"{op:11s} {size:>9d} {c[0]:>10.2f} {c[2]:>10.2f} {m[0]:>10.2f} {m[2]:>10.2f}"
                      f" {m[0] / c[0]:>8.2f} {m[2] / c[2]:>8.2f}")
                rows.append(((op, size), c, m))
    return rows


def main():
    ap = runner.parser(__doc__, "2,4,8")
    ap.add_argument("--gloo-np", default="2")
    ap.add_argument("--python", default=runner.default_python(), help="the Python with torch for the gloo peer "
                    "(default: the project's .venv)")
    ap.add_argument("--load", nargs="?", const="cpu", choices=["cpu", "matmul"],
                    help="cpu (the default): a CPU-bound process beside the benchmarks; matmul: a step's matmul "
                    "on 2 threads in every rank before every call; p95 tables")
    ap.add_argument("--last-rank", action="store_true",
                    help="time each call on the rank that finished it last, not rank 0 (against mpi_fresh only)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    mpi_bin, membw_bin = os.path.join(args.out, "mpi_bench"), os.path.join(args.out, "membw")
    runner.run(["mpicc", "-O2", os.path.join(runner.PEERS, "mpi_collectives.c"), "-o", mpi_bin])
    step, step_flags = [], []
    if args.load == "matmul":  # mpi_tail runs chorus-bench's step: bench/step_load.cc, built with chorus-bench
        lib_dir = os.path.abspath(os.path.join(args.build, "bench"))
        if not os.path.exists(os.path.join(lib_dir, "libchorus_step_load.so")):
            sys.exit(f"--load matmul needs {lib_dir}/libchorus_step_load.so (a build with the torch layer)")
        step_flags = ["-DCHORUS_STEP_LOAD", "-I", runner.HERE, "-L", lib_dir, "-lchorus_step_load", f"-Wl,-rpath,{lib_dir}"]
        step = ["--step-matmul", str(STEP_MATMUL)]
    if args.last_rank:  # chorus-bench and mpi_tail both take it; mpi_collectives.c and the gloo peer do not
        step = step + ["--last-rank"]
    if args.load:  # a p95 that one time slice does not decide (chorus-bench's Note [A p95 beside busy cores])
        step = step + ["--tail"]
    tail_bin = runner.build_mpi_tail(args.out, step_flags)  # Open MPI on chorus-bench's workload, with p95
    runner.run(["gcc", "-O3", "-march=native", os.path.join(runner.PEERS, "membw.c"), "-o", membw_bin])
    pair_bin = os.path.join(args.out, "membw_pair")
    runner.run(["gcc", "-O3", "-march=native", os.path.join(runner.HERE, "membw_pair.c"), "-o", pair_bin])
    model_bin = os.path.join(args.out, "staged_model")
    runner.run(["gcc", "-O3", "-march=native", "-pthread", os.path.join(runner.HERE, "staged_model.c"), "-o", model_bin])
    env1 = runner.one_thread_env()

    combined = []
    verdicts = runner.Verdicts()
    for world in runner.worlds(args):
        ops = OPS
        runs = {"chorus": [], "chorus_sym": [], "mpi_fresh": []}
        # Open MPI as programs call it and the gloo peer time rank 0, unloaded: beside rank 0's tables only.
        rank0_peers = not args.load and not args.last_rank
        if rank0_peers:
            runs["mpi"] = []
        if args.load == "matmul":
            runs["mpi_passive"] = []
        with_gloo = str(world) in args.gloo_np.split(",") and rank0_peers
        if with_gloo:
            runs["gloo"] = []
        floors, pairs, models = [], [], []
        for r in range(args.repeat):
            floors.append(memcpy_floor_us(runner.run([membw_bin], log=os.path.join(args.out, f"membw_w{world}_{r}.txt"))))
            pairs.append(pair_memcpy_us(runner.run([pair_bin, "2"], log=os.path.join(args.out, f"membw_pair_w{world}_{r}.txt"))))
            if not args.load:
                models.append(staged_model_us(runner.run([model_bin, str(world)],
                                                         log=os.path.join(args.out, f"staged_model_w{world}_{r}.txt"))))
            tables = {impl: {} for impl in runs}
            with cpu_load(args.load == "cpu"):
                # A few sizes at a time, chorus and Open MPI one after the other: the machine's state
                # (the docstring) then changes between the two sides of a row less often.
                for part, sizes in enumerate(PARTS):
                    part_ops = ops if part == 0 else [op for op in ops if op != "barrier"]
                    tables["chorus"].update(chorus_rows(args.build, world, part_ops, args.out, step=step, sizes=sizes))
                    tables["chorus_sym"].update(chorus_rows(args.build, world, ["all_reduce", "all_gather"], args.out,
                                                            symmetric=True, step=step, sizes=sizes))
                    selected = ["--ops", ",".join(part_ops), "--sizes", ",".join(str(s) for s in sizes)]
                    tables["mpi_fresh"].update(tail_rows(runner.run(
                        runner.MPIRUN + [str(world), tail_bin, "--fresh"] + selected + step,
                        log=os.path.join(args.out, f"mpi_fresh_w{world}_{r}_{part}.txt")), world))
                    if args.load == "matmul":  # as chorus's launchers set it (Note [Threads of ranks that share the cores])
                        tables["mpi_passive"].update(tail_rows(runner.run(
                            runner.MPIRUN + [str(world), "-x", "OMP_WAIT_POLICY=PASSIVE", tail_bin, "--fresh"] + selected
                            + step, log=os.path.join(args.out, f"mpi_passive_w{world}_{r}_{part}.txt")), world))
                if "mpi" in runs:
                    tables["mpi"] = parse_table(runner.run(
                        runner.MPIRUN + [str(world), mpi_bin], log=os.path.join(args.out, f"mpi_w{world}_{r}.txt")))
            if with_gloo:
                tables["gloo"] = parse_table(runner.run([args.python, os.path.join(runner.PEERS, "torch_collectives.py"), str(world)],
                                                        env=env1, log=os.path.join(args.out, f"gloo_w{world}_{r}.txt")))
            for impl, table in tables.items():
                runs[impl].append(table)
        results = {impl: runner.medians(tables) for impl, tables in runs.items()}
        floor = runner.medians([{"floor": f} for f in floors])["floor"]
        pair = runner.medians([{"pair": p} for p in pairs])["pair"]
        peers = [p for p in ("chorus_sym", "mpi_fresh", "mpi", "gloo") if p in results]
        print(f"\n## world size {world}, {args.repeat} run(s) (median us; busbw GB/s; speed-up = peer time / chorus time; "
              "chorus_sym = chorus between symmetric buffers)")
        header = f"{'op':11s} {'bytes':>9s} {'chorus_us':>10s}" + "".join(f" {p + '_us':>10s}" for p in peers)
        header += "".join(f" {'x' + p:>8s}" for p in peers) + f" {'chorus_bw':>9s}" + "".join(f" {p + '_bw':>8s}" for p in peers)
        print(header)
        for op in ops:
            for size in ([0] if op == "barrier" else SIZES):
                c = results["chorus"].get((op, size))
                if not c:
                    continue
                line = f"{op:11s} {size:>9d} {c[0]:>10.2f}"
                for p in peers:
                    v = results[p].get((op, size))
                    line += f" {v[0]:>10.2f}" if v else f" {'-':>10s}"
                for p in peers:
                    v = results[p].get((op, size))
                    line += f" {v[0] / c[0]:>8.2f}" if v else f" {'-':>8s}"
                line += f" {c[1]:>9.3f}"
                for p in peers:
                    v = results[p].get((op, size))
                    line += f" {v[1]:>8.3f}" if v else f" {'-':>8s}"
                print(line)
                for impl, table in results.items():
                    if (op, size) in table:
                        row = table[(op, size)]
                        combined.append([world, op, size, impl, *row, *[""] * (len(CSV_MEASURES) - len(row))])
        # The VM's state in each run (the docstring): its barrier, run by run, on both sides.
        barriers = {impl: [t[("barrier", 0)][0] for t in runs[impl] if ("barrier", 0) in t] for impl in ("chorus", "mpi_fresh")}
        if all(barriers.values()):
            print("each run's barrier (us), the machine's state in it: "
                  + "; ".join(f"{impl} " + " ".join(f"{b:.2f}" for b in times) for impl, times in barriers.items()))

        if args.load:
            beside = "beside a CPU-bound process" if args.load == "cpu" else f"with a {STEP_MATMUL}^2 matmul on 2 threads before each call"
            for (op, size), c, m in load_table(f"world size {world} {beside}", results["chorus"], results["mpi_fresh"], ops):
                verdicts.check(f"W={world} {op} {size} B: median and p95 <= Open MPI's under load",
                               c[0] <= m[0] and c[2] <= m[2])
            if args.load == "matmul":
                load_table(f"world size {world}, the same with Open MPI's threads passive too (OMP_WAIT_POLICY=PASSIVE, "
                           "as chorus's launchers set it)", results["chorus"], results["mpi_passive"], ops)
            continue
        # Every rank reads its 64 MiB input and writes its 64 MiB output, one memcpy's traffic at
        # least; with more ranks than cores a core carries the memcpys of all the ranks it runs.
        cores = len(os.sched_getaffinity(0))
        per_core = max(1.0, world / cores)
        big_ordinary = results["chorus"][("all_reduce", 64 << 20)][0]
        big_symmetric = results["chorus_sym"][("all_reduce", 64 << 20)][0]
        print(f"64 MiB memcpy on one core (membw, the floor): {floor:.0f} us; chorus's 64 MiB all_reduce reaches "
              f"{floor / big_ordinary:.0%} of it (ordinary buffers), {floor / big_symmetric:.0%} (symmetric)")
        if per_core > 1:
            print(f"{world} ranks on {cores} cores: each core copies for {per_core:g} ranks, so the floor is "
                  f"{per_core:g} memcpys ({per_core * floor:.0f} us); chorus reaches "
                  f"{per_core * floor / big_ordinary:.0%} of that (ordinary buffers), "
                  f"{per_core * floor / big_symmetric:.0%} (symmetric)")
        print(f"64 MiB memcpy while a second process does one (membw_pair): {pair:.0f} us, "
              f"{floor / pair:.0%} of the one-core floor's speed")
        # The ranks of an all_reduce read their inputs and write their outputs at the same time:
        # where the cores share the memory's speed, the pair's time is the floor that can be met.
        at_once = per_core * pair
        print(f"the floor for ranks copying at once ({per_core:g} of membw_pair's memcpys per core): "
              f"{at_once:.0f} us; chorus reaches {at_once / big_ordinary:.0%} of it (ordinary buffers), "
              f"{at_once / big_symmetric:.0%} (symmetric)")
        # On ordinary buffers every byte goes through the slots (core/src/shm/all_reduce.cc): the
        # same copies and folds without processes or waits are as fast as that path can be here.
        model = runner.medians(models)
        way = "the ring's" if world > cores else "two-shot's"
        print(f"{way} copies and folds alone (staged_model: threads, no processes or waits): "
              f"best {model['best']:.0f} us ({at_once / model['best']:.0%} of the floor for ranks copying at once), "
              f"median {model['median']:.0f} us; chorus on ordinary buffers takes {big_ordinary / model['median']:.2f}x "
              "the median")

        def check(label, ok):
            verdicts.check(f"W={world} {label}", ok)

        def slower_than(peers):
            return [f"{op} {size} B vs {p}" for op in ops for size in ([0] if op == "barrier" else SIZES)
                    for p in peers if p in results and (op, size) in results[p] and (op, size) in results["chorus"]
                    and results["chorus"][(op, size)][0] > results[p][(op, size)][0]]

        losers = slower_than(["mpi_fresh", "gloo"])
        check("every op and size at least as fast as Open MPI (same workload) and gloo"
              + (f" (slower: {', '.join(losers)})" if losers else ""), not losers)
        if "mpi" in results:
            stale = slower_than(["mpi"])
            print("where Open MPI on buffers never written again is faster: " + (", ".join(stale) or "nowhere"))
        check("64 MiB all_reduce (ordinary buffers) >= 80% of the one-core memcpy floor"
              + (f" (x{per_core:g}: {world} ranks on {cores} cores)" if per_core > 1 else ""),
              per_core * floor >= 0.8 * big_ordinary)
        check("64 MiB all_reduce (ordinary buffers) >= 80% of the floor for ranks copying at once (membw_pair)",
              at_once >= 0.8 * big_ordinary)

        # Open MPI on buffers never written again (with --last-rank, on chorus's workload)
        ch, mp = results["chorus"], results.get("mpi", results["mpi_fresh"])
        check("barrier <= Open MPI", ch[("barrier", 0)][0] <= mp[("barrier", 0)][0])
        # With more ranks than cores rank 0's barrier times split in two groups (bench/chorus_bench.cc)
        # and the median lands on either; the mean is what a loop of barriers pays.
        chorus_barrier, fresh_barrier = ch[("barrier", 0)], results["mpi_fresh"][("barrier", 0)]
        print(f"barrier, mean of rank 0's calls: chorus {chorus_barrier[3]:.2f} us, "
              f"Open MPI {fresh_barrier[3]:.2f} us (medians {chorus_barrier[0]:.2f} and {fresh_barrier[0]:.2f})")
        check("barrier mean <= Open MPI's", chorus_barrier[3] <= fresh_barrier[3])
        check("8 B all_reduce <= Open MPI", ch[("all_reduce", 8)][0] <= mp[("all_reduce", 8)][0])
        if world == 2:
            big = 64 << 20
            check("64 MiB all_reduce busbw >= 1.5x Open MPI", ch[("all_reduce", big)][1] >= 1.5 * mp[("all_reduce", big)][1])
            sym = results["chorus_sym"]
            check("64 MiB all_reduce busbw >= 1.5x Open MPI (symmetric buffers)", sym[("all_reduce", big)][1] >= 1.5 * mp[("all_reduce", big)][1])
            if "gloo" in results:
                gloo_bw = results["gloo"][("all_reduce", big)][1]
                check("64 MiB all_reduce busbw >= 4x torch gloo", ch[("all_reduce", big)][1] >= 4 * gloo_bw)
                check("64 MiB all_reduce busbw >= 4x torch gloo (symmetric buffers)", sym[("all_reduce", big)][1] >= 4 * gloo_bw)
            check("64 MiB all_gather >= Open MPI", ch[("all_gather", big)][0] <= mp[("all_gather", big)][0])
            check("64 MiB broadcast >= Open MPI", ch[("broadcast", big)][0] <= mp[("broadcast", big)][0])

    with open(os.path.join(args.out, "combined.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_KEY + CSV_MEASURES)
        w.writerows(combined)
    verdicts.print("## targets (issues 2 and 28)")


if __name__ == "__main__":
    main()
