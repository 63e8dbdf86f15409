#!/usr/bin/env python3
"""Plots busbw against message size for chorus, Open MPI and torch gloo from compare.py's
combined.csv: one panel per collective, at one world size.

  bench/plot.py bench-results/combined.csv docs/busbw.png --world 2 --note "2026-11-22, 2-core VM"

Needs matplotlib (scripts/install-deps.sh --bench installs it in .venv: .venv/bin/python bench/plot.py ...).
"""
import argparse
import csv
import collections

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"chorus": ("tab:blue", "o"), "chorus_sym": ("tab:purple", "D"), "mpi_fresh": ("tab:red", "v"),
         "mpi": ("tab:orange", "s"), "gloo": ("tab:green", "^")}
LABEL = {"chorus": "chorus (shm)", "chorus_sym": "chorus, symmetric buffers",
         "mpi_fresh": "Open MPI, inputs written before each call", "mpi": "Open MPI, buffers written once",
         "gloo": "torch gloo"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("out")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--ops", default="all_reduce,all_gather,broadcast")
    ap.add_argument("--note", default="", help="when and where it was measured (goes in the title)")
    args = ap.parse_args()

    series = collections.defaultdict(list)  # (op, impl) -> [(bytes, busbw)]
    with open(args.csv) as f:
        for row in csv.DictReader(f):
            if int(row["world"]) != args.world or float(row["busbw_GBps"]) <= 0:
                continue
            series[(row["op"], row["impl"])].append((int(row["bytes"]), float(row["busbw_GBps"])))
    ops = args.ops.split(",")
    fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 4), sharey=True)
    for ax, op in zip(axes, ops):
        for impl in STYLE:
            pts = sorted(series.get((op, impl), []))
            if not pts:
                continue
            color, marker = STYLE[impl]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=LABEL[impl])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{op}, {args.world} ranks")
        ax.set_xlabel("message size per rank (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("bus bandwidth (GB/s, nccl-tests convention)")
    axes[0].legend()
    fig.suptitle(f"busbw vs message size — {args.note}" if args.note else "busbw vs message size")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
