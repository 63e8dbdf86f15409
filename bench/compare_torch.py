#!/usr/bin/env python3
"""Runs chorus-torch-bench and chorus-ddp-bench next to torch's own object broadcast and DDP
(bench/peers/torch_objects.py and torch_ddp.py, gloo, the project's .venv) and
prints the torch layer's ratios and targets.

  bench/compare_torch.py --build build [--np 2,4] [--repeat 3] [--out bench-results]

With --repeat N everything runs N times, interleaved; each figure is the median of the runs'
medians. Compare ratios of one run: these machines are shared and noisy.
"""
import os
import re

import runner


def run(cmd, log=None):
    """runner.run with one BLAS/OpenMP thread per rank, every repeat appended to the log."""
    return runner.run(cmd, env=runner.one_thread_env(), log=log, log_mode="a")


def chorus_cases(text):
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and not line.startswith("#"):
            try:
                rows[parts[0]] = float(parts[1])
            except ValueError:
                pass  # the header line
    return rows


def torch_cases(text):
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"torch_gloo (\S+) world=\d+ median_ms=([\d.]+)", text)}


def main():
    args = runner.parser(__doc__, "2,4").parse_args()
    os.makedirs(args.out, exist_ok=True)
    bench = os.path.join(args.build, "bench", "chorus-torch-bench")
    worlds = runner.worlds(args)
    runs = {w: [] for w in worlds}
    torch_runs = []
    ddp_runs, torch_ddp_runs = [], []
    for _ in range(args.repeat):
        ddp_runs.append(chorus_cases(run([os.path.join(args.build, "bench", "chorus-ddp-bench"), "--np", "2"],
                                         os.path.join(args.out, "chorus-ddp.txt"))))
        out = run([runner.default_python(), os.path.join(runner.PEERS, "torch_ddp.py"), "2"],
                  os.path.join(args.out, "torch-ddp.txt"))
        torch_ddp_runs.append({"ddp": float(m.group(1)) for m in re.finditer(r"median_ms=([\d.]+)", out)})
        for w in worlds:
            runs[w].append(chorus_cases(run([bench, "--np", str(w), "--iters", "20"],
                                            os.path.join(args.out, f"chorus-torch-np{w}.txt"))))
        script = os.path.join(runner.PEERS, "torch_objects.py")
        torch_runs.append(torch_cases(run([runner.default_python(), script, "2"], os.path.join(args.out, "torch-object.txt"))))

    torch_obj = runner.medians(torch_runs)
    torch_raw = torch_obj["broadcast_raw_100MB"]
    torch_obj = torch_obj["broadcast_object_list_100MB_dict"]
    verdicts = runner.Verdicts()
    for w in worlds:
        r = runner.medians(runs[w])
        print(f"\n== world {w} (median ms over {args.repeat} run(s))")
        for k, v in r.items():
            print(f"  {k:32s} {v:9.3f}")
        dict_vs_bare = r["broadcast_object_100MB_dict"] / r["broadcast_bare_100MB"]
        coalesced = r["all_reduce_separate_fabric"] / r["all_reduce_dict_coalesced"]
        print(f"  object dict / bare tensors        {dict_vs_bare:6.2f}x   (target <= 1.5)")
        print(f"  1000 separate Fabric calls / dict {coalesced:6.2f}x   (target >= 5)")
        print(f"  1000 in-place calls / dict        {r['all_reduce_separate_inplace'] / r['all_reduce_dict_coalesced']:6.2f}x")
        verdicts.check(f"W={w} dict <= 1.5x bare", dict_vs_bare <= 1.5)
        verdicts.check(f"W={w} coalesced >= 5x", coalesced >= 5)
        if w == 2:
            speedup = torch_obj / r["broadcast_object_100MB_dict"]
            print(f"  torch broadcast_object_list       {torch_obj:9.3f}  -> chorus {speedup:5.1f}x faster (target >= 10)")
            print(f"  torch dist.broadcast (bare)       {torch_raw:9.3f}  -> chorus bare {torch_raw / r['broadcast_bare_100MB']:5.1f}x faster")
            verdicts.check("W=2 object broadcast >= 10x torch", speedup >= 10)
    d = runner.medians(ddp_runs)
    t = runner.medians(torch_ddp_runs)["ddp"]
    print(f"\n== DDP, reference MLP (12.6M parameters), W=2, median step ms over {args.repeat} run(s)")
    print(f"  torch DDP (gloo)                  {t:9.2f}")
    for k, v in d.items():
        print(f"  chorus {k:26s} {v:9.2f}")
    speed = t / d["ddp_overlap"]
    comm_overlap = d["ddp_overlap"] - d["local_no_sync"]
    comm_after = d["ddp_sync_after_backward"] - d["local_no_sync"]
    print(f"  chorus DDP vs torch DDP           {speed:6.2f}x   (target >= 1.5)")
    print(f"  sync cost: {comm_after:.2f} ms after backward, {comm_overlap:.2f} ms with overlap"
          f" ({100 * (1 - comm_overlap / comm_after) if comm_after > 0 else 0:.0f}% hidden)")
    verdicts.check("W=2 DDP step >= 1.5x torch DDP", speed >= 1.5)
    verdicts.print()


if __name__ == "__main__":
    main()
