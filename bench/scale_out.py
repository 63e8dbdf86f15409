#!/usr/bin/env python3
"""chorus at scale, in SimGrid: calibrate build/bench/chorus-sim against the namespace-host runs of
bench/hosts_bench.sh, then predict all_reduce at 2-1,024 nodes x 8-64 ranks per node, and check
that the algorithm chorus's cost model picks is the one the simulation finds fastest.

  bench/scale_out.py calibrate MEASURED.csv... [--terms ...]  prediction vs measurement, per row
  bench/scale_out.py predict [--quick]                         the sweep, its CSV and plots
  bench/scale_out.py all MEASURED.csv...                       both

MEASURED.csv is hosts_bench.sh --csv's output (several: their layouts together). Plots and CSVs
go to docs/img (--out)."""
import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = ["op", "bytes", "nodes", "ranks_per_node", "scheme", "algorithm", "seconds", "busbw_GBps", "rank0_seconds"]
# This machine's namespace hosts (chorus-sim --testbed 2), as the fit to bench/hosts_bench.sh's
# runs on a 2-core AMD EPYC VM left them (calibrate --fit-on 2x2,3x2,4x1,4x2; the rows are
# docs/img/hosts_measured.csv, main at e7eb852, and hosts_measured_2x3_4x2.csv, a day later, whose
# 2x3 the fit leaves out to check it): the veth/bridge "network" is the kernel copying between the
# namespaces on the same 2 cores. The fit put a message's time in CPU work (per message, wake-ups,
# growing with the ranks that share a core) and the latencies near zero (docs/scale-out.md says
# what that means). The cost model chooses with what the tcp engine measured on them
# (CHORUS_LOG_LEVEL=1 prints it: alpha 11 to 32 us from run to run, median 24; 14 to 23 Gb/s,
# median 20; folds at 354 Gb/s; o is its default), as the runs did; the fit leaves those alone.
VETH = {"link-gbps": 9.12e6, "link-lat-us": 0.0128, "o-us": 5.98, "fold-gbps": 63.2, "shm-gbps": 46.2,
        "shm-lat-us": 0.8, "kernel-copy-gbps": 28.3, "socket-buffer-kib": 4380.0, "loopback-lat-us": 0.000563,
        "wake-us": 2.28, "crowd": 0.168, "cache-kib": 2040.0, "cached-copy-gbps": 41.8, "cost-alpha-us": 24.0,
        "cost-gbps": 20.0, "cost-fold-gbps": 354.0, "cost-o-us": 2.0}
VETH_FITTED_ON = {"2x2", "3x2", "4x1", "4x2"}
FITTED = [k for k in VETH if not k.startswith("cost-")]
# A node: shared memory at what bench/compare.py measures here (membw_pair: a 64 MiB memcpy in 9.6 ms
# while another process copies, 56 Gb/s; membw's a+=b at 10 GB/s for folds), 1 us per step; the
# fat tree's hops 1 us each, and 1 us of a rank's own time per message.
DATACENTER = {"link-lat-us": 1.0, "o-us": 1.0, "fold-gbps": 80.0, "shm-gbps": 56.0, "shm-lat-us": 1.0}
ALGORITHMS = {"all_reduce": ["recursive_doubling", "halving_doubling", "ring"]}


def simulate(sim, op, nbytes, nodes, per_node, scheme="chorus", algorithm=None, terms=None):
    args = [sim, "--nodes", str(nodes), "--ranks-per-node", str(per_node), "--op", op, "--bytes", str(nbytes),
            "--scheme", scheme, "--cfg=contexts/stack-size:64", "--cfg=contexts/guard-size:0",
            "--cfg=network/model:CM02", "--cfg=network/crosstraffic:0", "--log=root.thres:critical"]
    for k, v in (terms or {}).items():
        args += [f"--{k}", str(v)]
    if algorithm:
        args += ["--algorithm", f"{op}={algorithm}"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return dict(zip(FIELDS, out.split(",")))


def measured_rows(paths):
    """hosts_bench.sh --csv files -> {(layout, op, bytes): median over the runs of chorus's median, us}."""
    rows = defaultdict(list)
    for path in paths:
        for r in csv.DictReader(open(path)):
            if r["impl"] == "chorus":
                rows[(r["layout"], r["op"], int(r["bytes"]))].append(float(r["median_us"]))
    return {k: statistics.median(v) for k, v in rows.items()}


def predictions(sim, keys, terms):
    """The testbed's prediction for each (layout, op, bytes), us, and the algorithm picked."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futs = []
        for layout, op, b in keys:
            h, r = (int(x) for x in layout.split("x"))
            futs.append(pool.submit(simulate, sim, op, b, h, r, terms=dict(terms, testbed=2)))
        # hosts_bench.sh times rank 0's calls: so does the prediction
        return [(float(f.result()["rank0_seconds"]) * 1e6, f.result()["algorithm"]) for f in futs]


def misfit(measured, predicted):
    """The mean squared log ratio: a prediction 2x off weighs as much as one 2x under."""
    return statistics.fmean(math.log(p / m) ** 2 for m, (p, _) in zip(measured, predicted))


def fit(sim, keys, measured, terms, names, factor=2.0):
    """Coordinate search in log space, the factor's root taken when no term improves by 1%."""
    best = misfit(measured, predictions(sim, keys, terms))
    while factor > 1.04:
        before = best
        for name in names:
            for f in (factor, 1 / factor):
                trial = dict(terms, **{name: float(terms[name]) * f})
                m = misfit(measured, predictions(sim, keys, trial))
                if m < best:
                    best, terms = m, trial
        print(f"  fit: factor {factor:.3f}, rms log error {math.sqrt(best):.3f}: "
              + " ".join(f"{k}={float(v):.3g}" for k, v in terms.items()), file=sys.stderr, flush=True)
        if math.sqrt(best) > 0.99 * math.sqrt(before):  # under 1% better: a finer step
            factor = math.sqrt(factor)
    return terms


def calibrate(args):
    measured = measured_rows(args.measured)
    terms = dict(VETH)
    for kv in args.terms or []:
        k, v = kv.split("=")
        terms[k] = float(v)
    if args.fit_on:
        fit_on = set(args.fit_on.split(","))
        keys = sorted(k for k in measured if k[0] in fit_on)
        terms = fit(args.sim, keys, [measured[k] for k in keys], terms, [n for n in FITTED if n not in (args.keep or [])],
                    args.step)
    else:  # the rows VETH was fitted to, unless other terms are given
        fit_on = set() if args.terms else VETH_FITTED_ON
    keys = sorted(measured)
    got = predictions(args.sim, keys, terms)
    out = []
    for (layout, op, b), (predicted, algorithm) in zip(keys, got):
        m = measured[(layout, op, b)]
        out.append({"layout": layout, "op": op, "bytes": b, "measured_us": f"{m:.1f}", "predicted_us": f"{predicted:.1f}",
                    "error_pct": f"{100 * (predicted - m) / m:+.0f}", "algorithm": algorithm,
                    "fitted_on": "yes" if layout in fit_on else ""})
    path = os.path.join(args.out, "calibration.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(out[0]))
        w.writeheader()
        w.writerows(out)
    print("terms: " + " ".join(f"--{k} {float(v):.3g}" for k, v in terms.items()))
    print("| layout | op | bytes | measured µs | predicted µs | error | algorithm |\n|---|---|---:|---:|---:|---:|---|")
    for o in out:
        print(f"| {o['layout']}{' (fit)' if o['fitted_on'] else ''} | {o['op']} | {o['bytes']} | {o['measured_us']} | "
              f"{o['predicted_us']} | {o['error_pct']}% | {o['algorithm']} |")
    print()
    for layout in sorted({o["layout"] for o in out}) + [None]:
        for op in sorted({o["op"] for o in out}) + [None]:
            errs = [abs(float(o["error_pct"])) for o in out
                    if (layout is None or o["layout"] == layout) and (op is None or o["op"] == op)]
            if errs:
                print(f"{layout or 'every layout'}{' (fitted on)' if layout in fit_on else ''} {op or 'every op'}: "
                      f"{sum(e <= 25 for e in errs)} of {len(errs)} within 25%, median |error| {statistics.median(errs):.0f}%")
    plot_calibration(out, os.path.join(args.out, "calibration.png"))


def pyplot():
    """matplotlib's pyplot, drawing to files; scripts/install-deps.sh --bench installs matplotlib in .venv."""
    try:
        import matplotlib
    except ImportError:
        sys.exit("scale_out.py: the plots need matplotlib: scripts/install-deps.sh --bench installs it in .venv")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_calibration(rows, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 5))
    markers = {"2x2": "o", "3x2": "s", "4x1": "^", "2x3": "D", "4x2": "v"}
    for layout in sorted({r["layout"] for r in rows}):
        pts = [(float(r["measured_us"]), float(r["predicted_us"])) for r in rows if r["layout"] == layout]
        fitted = any(r["fitted_on"] for r in rows if r["layout"] == layout)
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=markers.get(layout, "x"),
                   label=layout + ("" if fitted else " (held out)"), facecolors=None if fitted else "none",
                   edgecolors=None if fitted else f"C{len(ax.collections)}")
    lo = min(min(float(r["measured_us"]), float(r["predicted_us"])) for r in rows) / 1.5
    hi = max(max(float(r["measured_us"]), float(r["predicted_us"])) for r in rows) * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25], color="grey", alpha=0.2, label="±25%")
    ax.set(xscale="log", yscale="log", xlabel="measured on namespace hosts (µs)", ylabel="SimGrid prediction (µs)",
           title="chorus-sim against the measurement")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def predict(args):
    nodes = [2, 4, 16, 64, 256, 1024] if args.quick else [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    per_node = [8, 64] if args.quick else [8, 16, 32, 64]
    sizes = [8, 64 << 10, 16 << 20, 1 << 30]
    links = [25.0, 100.0, 400.0]  # floats, as a row read back from the CSV gives them
    points = [(n, l, b, g) for g in links for b in sizes for l in per_node for n in nodes]
    jobs = []  # (point, scheme, forced algorithm)
    for n, l, b, g in points:
        jobs.append(((n, l, b, g), "chorus", ""))
        jobs += [((n, l, b, g), "chorus", a) for a in ALGORITHMS["all_reduce"]]  # the rule's check: each, forced
        if n * l <= 512:  # flat schemes: one actor per rank (1,024 of them take minutes a point)
            jobs += [((n, l, b, g), s, "") for s in ["ring", "recursive_doubling", "tree"]]
        if n <= 256 or b <= 64 << 10:
            jobs.append(((n, l, b, g), "two_level", ""))
    # Rows go to the CSV as they finish, and a run picks up where an interrupted one stopped
    # (the whole sweep takes hours on 2 cores); --fresh starts over.
    path = os.path.join(args.out, "scale_out.csv")
    rows = [] if args.fresh or not os.path.exists(path) else list(csv.DictReader(open(path)))
    done = {(point_of(r), r["scheme"], r["forced"]) for r in rows}
    todo = [j for j in jobs if j not in done]
    print(f"  {len(jobs) - len(todo)} of {len(jobs)} simulations from {path}, {len(todo)} to run", file=sys.stderr)
    with open(path, "w" if not rows else "a", newline="") as f, ThreadPoolExecutor(max_workers=2) as pool:
        w = csv.DictWriter(f, fieldnames=FIELDS + ["link_gbps", "forced"])
        if not rows:
            w.writeheader()
        futs = {}
        for (n, l, b, g), scheme, forced in todo:
            terms = dict(DATACENTER, **{"link-gbps": g})
            fut = pool.submit(simulate, args.sim, "all_reduce", b, n, l, scheme=scheme, algorithm=forced or None,
                              terms=terms)
            futs[fut] = (g, forced)
        for i, fut in enumerate(as_completed(futs)):
            r = fut.result()
            r.update(link_gbps=futs[fut][0], forced=futs[fut][1])
            w.writerow(r)
            f.flush()
            rows.append(r)
            if i % 50 == 0:
                print(f"  {i + 1} of {len(todo)} simulations", file=sys.stderr, flush=True)
    report(rows, args.out)


def point_of(row):
    """A sweep row's point: (nodes, ranks per node, bytes, link Gb/s)."""
    return int(row["nodes"]), int(row["ranks_per_node"]), int(row["bytes"]), float(row["link_gbps"])


def report(rows, out):
    picked = {point_of(r): r for r in rows if r["scheme"] == "chorus" and not r["forced"]}
    forced = defaultdict(dict)
    for r in rows:
        if r["scheme"] == "chorus" and r["forced"]:
            forced[point_of(r)][r["forced"]] = float(r["seconds"])
    misses = []
    for k, r in sorted(picked.items()):
        best = min(forced[k].items(), key=lambda kv: kv[1])
        if float(r["seconds"]) > best[1] * 1.05:
            misses.append((k, r["algorithm"], best[0], float(r["seconds"]) / best[1]))
    print(f"\nthe cost model's pick is within 5% of the fastest algorithm in the simulation at "
          f"{len(picked) - len(misses)} of {len(picked)} points")
    for (n, l, b, g), mine, best, ratio in misses:
        print(f"  {n} nodes x {l}, {b} B, {g:g} Gb/s: picked {mine}, {best} {ratio:.2f}x faster")
    print("\nchorus's all_reduce: its time and the algorithm its cost model picks between the nodes "
          "(RD recursive doubling, HD halving-doubling)")
    grid(picked, lambda k: f"{human_time(float(picked[k]['seconds']))} {SHORT[picked[k]['algorithm']]}")
    print("\nchorus's all_reduce: bus bandwidth, GB/s (nccl-tests' factor 2(P-1)/P over all P ranks)")
    grid(picked, lambda k: f"{float(picked[k]['busbw_GBps']):.3g}")
    # chorus against the alternatives: the fastest of the flat schemes and the two-level one at
    # each point where any ran.
    others = defaultdict(dict)
    for r in rows:
        if r["scheme"] != "chorus":
            others[point_of(r)][r["scheme"]] = float(r["seconds"])
    print("\nchorus against the fastest alternative where one ran (time ratio: above 1, chorus is faster)")

    def versus_cell(k):
        if not others.get(k):
            return "-"
        best = min(others[k].items(), key=lambda kv: kv[1])
        return f"{best[1] / float(picked[k]['seconds']):.2f}× {best[0]}"

    grid(picked, versus_cell)
    plot_predictions(rows, out)


def grid(points, cell):
    """A markdown table, a row per link, size and ranks per node, a column per node count."""
    nodes = sorted({k[0] for k in points})
    print("\n| link | bytes | ranks/node | " + " | ".join(f"{n} nodes" for n in nodes) + " |")
    print("|---|---:|---:|" + "---:|" * len(nodes))
    for g in sorted({k[3] for k in points}):
        for b in sorted({k[2] for k in points}):
            for l in sorted({k[1] for k in points}):
                cells = [cell((n, l, b, g)) if (n, l, b, g) in points else "-" for n in nodes]
                print(f"| {g:g} Gb/s | {b} | {l} | " + " | ".join(cells) + " |")


SHORT = {"recursive_doubling": "RD", "halving_doubling": "HD", "ring": "ring"}


def human_time(seconds):
    for unit, scale in (("s", 1), ("ms", 1e-3)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-6:.3g} µs"


def plot_predictions(rows, out):
    plt = pyplot()
    sizes = sorted({int(r["bytes"]) for r in rows})
    for metric, label, fname in [("seconds", "all_reduce time (s)", "scale_out_time.png"),
                                 ("busbw_GBps", "bus bandwidth (GB/s)", "scale_out_busbw.png")]:
        fig, axes = plt.subplots(1, len(sizes), figsize=(4 * len(sizes), 4))
        for ax, b in zip(axes, sizes):
            for scheme, style in [("chorus", "-"), ("two_level", "--"), ("ring", ":"), ("recursive_doubling", "-."),
                                  ("tree", (0, (1, 3)))]:
                for l, color in [(8, "tab:blue"), (64, "tab:red")]:
                    pts = sorted((int(r["nodes"]), float(r[metric])) for r in rows
                                 if r["scheme"] == scheme and not r["forced"] and int(r["bytes"]) == b
                                 and int(r["ranks_per_node"]) == l and float(r["link_gbps"]) == 100)
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=style, color=color,
                                label=f"{scheme}, {l}/node")
            ax.set(xscale="log", yscale="log" if metric == "seconds" else "linear", xlabel="nodes",
                   title=f"{b:,} B, 100 Gb/s")
            ax.set_ylabel(label)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, fname), dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["calibrate", "predict", "all"])
    ap.add_argument("measured", nargs="*", help="hosts_bench.sh --csv files")
    ap.add_argument("--sim", default=os.path.join(ROOT, "build", "bench", "chorus-sim"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "img"))
    ap.add_argument("--quick", action="store_true", help="fewer node counts and ranks per node")
    ap.add_argument("--fresh", action="store_true", help="predict: start over, not from the rows in --out")
    ap.add_argument("--terms", nargs="*", help="calibration terms to start from, e.g. link-gbps=8 o-us=6")
    ap.add_argument("--fit-on", help="layouts whose rows fit the terms (e.g. 2x2); the others check them")
    ap.add_argument("--keep", nargs="*", help="terms the fit leaves as given (measured ones)")
    ap.add_argument("--step", type=float, default=2.0, help="the fit's first factor on each term (default 2)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.what in ("calibrate", "all"):
        if not args.measured:
            ap.error("calibrate needs hosts_bench.sh's CSV")
        calibrate(args)
    if args.what in ("predict", "all"):
        predict(args)


if __name__ == "__main__":
    main()
