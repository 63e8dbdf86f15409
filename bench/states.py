#!/usr/bin/env python3
"""chorus against Open MPI within each state of the machine, for calls that a few trips of a cache
line between the cores decide (barrier, all_reduce, all_gather and broadcast of 8 B to 64 KiB).

A VM's vCPUs may share a cache one moment and not the next (Note [Streaming into the slots]): on
the 2-core Zen 4 VM a cache line's round trip between them took 0.06, 0.15 or 0.55 us, changing
within a second. Such a call's median over a run then says which state the run met more than which
library is faster, and a median of three runs (compare.py) compares whichever states each side
met. Here chorus-bench and Open MPI (bench/mpi_tail.c --fresh, the same workload: fresh input
before every call, a barrier before and after it, rank 0's median) run one after the other for
many short rounds. Each side's medians of an op are split in two groups where they fall in two:
the split that leaves the least spread within the groups, taken when each group holds at least 5%
of the rounds (and 3) and the slower group's median is at least 1.5 times the faster's. The faster
group is the fast state, the slower the slow one; each side's fast state is compared with the
other's, slow with slow, and a side whose times form one group (the state does not change its
time) with both of the other's.

A second table groups the same rounds as issue 44 tells the states apart: by the barrier each side
timed first in the round, split the same way. Where a VM has three states, an op's own times may
fall in three groups that split two ways on the two sides (on the 2-core Zen 3 VM, the 8-byte
broadcast at 0.08, 0.13 and 0.23 us for chorus, 0.09, 0.14-0.18 and 0.25 for Open MPI: the split
put chorus's third group alone in its slow state, Open MPI's second and third together), while
each round's barrier takes both sides' slowest state apart alike.

With --load a CPU-bound process runs beside both sides (as compare.py --load): each round's p95
is then compared too, within the same states (the rounds whose medians fell in each).

  bench/states.py --build build [--np 2] [--rounds 100] [--max-bytes 65536] [--load] [--out bench-results/states]

Writes every round's tables to --out (chorus_w<N>.txt, mpi_w<N>.txt) and prints the comparison and
a verdict per op and size.
"""
import os
import statistics
import sys

import runner
from compare import OPS, SIZES, cpu_load

MIN_SHARE = 0.05  # each state holds at least this share of the rounds, and 3
MIN_RATIO = 1.5  # the slow state's median is at least this many times the fast state's


def median_and_p95(text):
    """chorus-bench's CSV or mpi_tail's table -> {(op, bytes): (median_us, p95_us)}: both put the
    median third and the p95 fourth."""
    rows = {}
    for line in text.splitlines():
        parts = line.replace(",", " ").split()
        if len(parts) < 4 or parts[0].startswith("#") or parts[0] == "op":
            continue
        try:
            rows[(parts[0], int(parts[1]))] = (float(parts[2]), float(parts[3]))
        except ValueError:
            continue
    return rows


def two_states(rounds):
    """rounds ((median, p95, ...) each) split into (fast, slow) where their medians fall in two groups
    (see the module's doc), else (rounds, None)."""
    rows = sorted(rounds)
    v = [row[0] for row in rows]
    best, cut = None, 0
    for i in range(1, len(v)):
        lo, hi = v[:i], v[i:]
        ml, mh = statistics.fmean(lo), statistics.fmean(hi)
        spread = sum((x - ml) ** 2 for x in lo) + sum((x - mh) ** 2 for x in hi)
        if best is None or spread < best:
            best, cut = spread, i
    lo, hi = v[:cut], v[cut:]
    least = max(3, int(MIN_SHARE * len(v)))
    if cut and len(lo) >= least and len(hi) >= least and statistics.median(hi) >= MIN_RATIO * statistics.median(lo):
        return rows[:cut], rows[cut:]
    return rows, None


def table_keys(times, sizes, width):
    """Prints a table's column heads; the (op, bytes) both sides timed, in the table's order."""
    print(f"{'op':11s} {'bytes':>6s} {'fast: chorus':>{width}s} {'Open MPI':>{width}s} {'slow: chorus':>{width}s} "
          f"{'Open MPI':>{width}s}")
    return [(op, size) for op in OPS for size in ([0] if op == "barrier" else sizes)
            if (op, size) in times["chorus"] and (op, size) in times["mpi"]]


def state_row(op, size, groups, load, width, counted):
    """Prints a table's row: each side's median (and p95, under load) of its rounds in each state,
    groups[side] = (its fast rounds, its slow ones); with counted, each cell's count of rounds (all:
    one group stands for both states). Whether chorus is at or under Open MPI in both states."""
    cells, ok = [], True
    for state in (0, 1):
        median = {side: statistics.median(m for m, _ in groups[side][state]) for side in groups}
        p95 = {side: statistics.median(p for _, p in groups[side][state]) for side in groups}
        for side in ("chorus", "mpi"):
            shown = f"{median[side]:.2f} / {p95[side]:.2f}" if load else f"{median[side]:.2f}"
            if counted:
                one = groups[side][0] is groups[side][1]
                shown += f" ({'all' if one else len(groups[side][state])})"
            cells.append(shown)
        ok = ok and median["chorus"] <= median["mpi"] and (not load or p95["chorus"] <= p95["mpi"])
    print(f"{op:11s} {size:>6d} " + " ".join(f"{c:>{width}s}" for c in cells))
    return ok


def by_own_times(times, world, sizes, load, width, verdicts):
    """Each side's rounds of an op split by that op's own times (the module's doc)."""
    for op, size in table_keys(times, sizes, width):
        groups = {}  # side -> its (fast, slow) rounds; one group stands for both states
        for side in times:
            fast, slow = two_states(times[side][(op, size)])
            groups[side] = (fast, fast) if slow is None else (fast, slow)
        verdicts.check(f"W={world} {op} {size} B at least as fast as Open MPI in each state"
                       + (", median and p95" if load else ""), state_row(op, size, groups, load, width, True))


def by_barrier(times, world, sizes, load, width, verdicts):
    """The rounds of each side grouped by the state its barrier saw in them (the module's doc)."""
    slow_rounds = {}
    for side in times:
        rounds = times[side].get(("barrier", 0), [])
        _, slow = two_states([(median, p95, i) for i, (median, p95) in enumerate(rounds)])
        if slow is None:
            print(f"\n{side}'s barrier fell in one group at W={world}: no table by the barrier's states")
            return
        slow_rounds[side] = {row[2] for row in slow}
    fast_n = {side: len(times[side][("barrier", 0)]) - len(slow_rounds[side]) for side in times}
    print(f"\n## W={world}, the same rounds grouped by each side's barrier in them (fast: chorus {fast_n['chorus']}, "
          f"Open MPI {fast_n['mpi']} rounds; slow: {len(slow_rounds['chorus'])} and {len(slow_rounds['mpi'])})")
    for op, size in table_keys(times, sizes, width):
        groups = {}
        for side in times:
            rounds = times[side][(op, size)]
            groups[side] = tuple([row for i, row in enumerate(rounds) if (i in slow_rounds[side]) == slow]
                                 for slow in (False, True))
        verdicts.check(f"W={world} {op} {size} B at least as fast as Open MPI in each state of its barrier"
                       + (", median and p95" if load else ""), state_row(op, size, groups, load, width, False))


def main():
    ap = runner.parser(__doc__, "2")
    ap.add_argument("--rounds", type=int, default=100, help="rounds of chorus and Open MPI, one after the other")
    ap.add_argument("--max-bytes", type=int, default=65536, help="the largest message timed")
    ap.add_argument("--load", action="store_true", help="a CPU-bound process beside both sides; p95 compared too")
    ap.set_defaults(out=os.path.join("bench-results", "states"))
    args = ap.parse_args()
    if args.rounds < 10:
        sys.exit("states.py: --rounds must be at least 10: the states are told apart by how the rounds fall")
    if args.max_bytes < SIZES[0]:
        sys.exit(f"states.py: --max-bytes {args.max_bytes} leaves no size to time (the smallest is {SIZES[0]})")
    os.makedirs(args.out, exist_ok=True)
    tail_bin = runner.build_mpi_tail(args.out)
    sizes = [s for s in SIZES if s <= args.max_bytes]
    selected = ["--ops", ",".join(OPS), "--sizes", ",".join(map(str, sizes))]  # the same on both sides
    env1 = runner.one_thread_env()
    verdicts = runner.Verdicts()
    for world in runner.worlds(args):
        times = {"chorus": {}, "mpi": {}}  # (op, bytes) -> every round's (median, p95)
        logs = {side: os.path.join(args.out, f"{side}_w{world}.txt") for side in times}
        for log in logs.values():
            open(log, "w").close()
        for r in range(args.rounds):
            with cpu_load(args.load):
                tables = {
                    "mpi": runner.run(runner.MPIRUN + [str(world), tail_bin, "--fresh"] + selected,
                                      env=env1, log=logs["mpi"], log_mode="a"),
                    "chorus": runner.run([os.path.join(args.build, "bench", "chorus-bench"), "--np", str(world)] + selected
                                         + ["--csv", "--check-last"], env=env1, log=logs["chorus"], log_mode="a"),
                }
            for side, text in tables.items():
                for key, row in median_and_p95(text).items():
                    times[side].setdefault(key, []).append(row)
            if (r + 1) % 10 == 0:
                print(f"W={world}: {r + 1} of {args.rounds} rounds", file=sys.stderr, flush=True)

        beside = " beside a CPU-bound process" if args.load else ""
        shown = "median / p95 (the rounds' medians of each)" if args.load else "median"
        print(f"\n## W={world}, {args.rounds} rounds{beside}: {shown} us (rounds) in each state; one group: the same in both")
        width = 22 if args.load else 14
        by_own_times(times, world, sizes, args.load, width, verdicts)
        by_barrier(times, world, sizes, args.load, width, verdicts)
    verdicts.print("## in each state")


if __name__ == "__main__":
    main()
