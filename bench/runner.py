"""What bench/compare.py and bench/compare_torch.py share: the flags, running a benchmark with its
output logged, the median over interleaved repeats, and the targets' verdicts."""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "peers")  # the peers' benchmarks: Open MPI, torch gloo, torch DDP/ZeRO/FSDP2, memcpy


def parser(doc, np_default):
    """The flags every comparison takes: --build, --np, --repeat, --out."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--np", default=np_default, help="world sizes, comma-separated")
    ap.add_argument("--repeat", type=int, default=1, help="run everything N times, interleaved; report medians")
    ap.add_argument("--out", default="bench-results")
    return ap


def worlds(args):
    return [int(w) for w in args.np.split(",")]


def one_thread_env():
    """One BLAS/OpenMP thread per rank: ranks, not threads, share the cores."""
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def run(cmd, env=None, log=None, log_mode="w"):
    """Runs cmd, returns its stdout; also writes it to log (log_mode "a" appends)."""
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    if log:
        with open(log, log_mode) as f:
            f.write(out)
    return out


# Open MPI's launcher as the comparisons start it, followed by the number of ranks.
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np"]


def build_mpi_tail(out, flags=()):
    """Builds bench/mpi_tail.c (Open MPI on chorus-bench's workload) into out/mpi_tail; its path."""
    tail_bin = os.path.join(out, "mpi_tail")
    run(["mpicc", "-O2", os.path.join(HERE, "mpi_tail.c")] + list(flags) + ["-o", tail_bin])
    return tail_bin


def default_python():
    """The project's environment (scripts/install-deps.sh), else the Python running this script."""
    venv = os.path.join(HERE, "..", ".venv", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable


def medians(runs):
    """Per key of the runs' tables: the median over the runs that have it (a tuple value: per
    element). One disturbed run of an interleaved repeat does not decide a comparison."""
    keys = []
    for table in runs:
        keys += [k for k in table if k not in keys]
    out = {}
    for k in keys:
        values = [t[k] for t in runs if k in t]
        if isinstance(values[0], tuple):
            out[k] = tuple(statistics.median(v[i] for v in values) for i in range(len(values[0])))
        else:
            out[k] = statistics.median(values)
    return out


class Verdicts:
    """The targets, each met or missed, printed last."""

    def __init__(self):
        self.items = []

    def check(self, label, ok):
        self.items.append((label, bool(ok)))

    def print(self, title=None):
        print()
        if title:
            print(title)
        for label, ok in self.items:
            print(f"{'PASS' if ok else 'MISS'}  {label}")
