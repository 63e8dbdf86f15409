#!/usr/bin/env python3
"""DDP's exposed communication against the raw collective of the same bytes (issue 28, items 1
and 3), on the reference MLP (12.6M parameters, 50438184 bytes of f32 gradients):

- C++: chorus-ddp-bench's step with sync minus its step without (the modes take turns step by
  step in one process), against chorus-bench's all_reduce of 50438184 bytes between symmetric
  buffers at the same world size;
- Python: torch's DDP on the chorus backend and on gloo (bench/python_extras.py: the step minus
  the no_sync step, interleaved), against the same all_reduce; and its parts: the all_reduce of
  those bytes from Python, in the memory the backend gives DDP's buckets (what the adapter adds
  is that against chorus-bench's), and DDP with gradient_as_bucket_view=True (torch's reducer no
  longer copies the bucket back into .grad).

  bench/ddp_exposed.py --build build [--np 2,4] [--repeat 3] [--out bench-results] [--no-python]

Everything runs --repeat times, interleaved; each figure is the median of the runs' medians.
Compare the ratios: these machines are shared and noisy, absolute times drift.
"""
import os
import re

import runner

GRAD_BYTES = 50438184  # the reference MLP's parameters, f32


def cpp_ddp(build, world, log):
    """chorus-ddp-bench's mode -> median step ms."""
    out = runner.run([os.path.join(build, "bench", "chorus-ddp-bench"), "--np", str(world)],
                     env=runner.one_thread_env(), log=log, log_mode="a")
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+) ([\d.]+) [\d.]+$", out, re.M)}


def raw_all_reduce(build, world, log):
    """Median us of chorus-bench's all_reduce of GRAD_BYTES between symmetric buffers."""
    out = runner.run([os.path.join(build, "bench", "chorus-bench"), "--np", str(world), "--ops", "all_reduce",
                      "--sizes", str(GRAD_BYTES), "--symmetric", "--iters", "20", "--csv"],
                     env=runner.one_thread_env(), log=log, log_mode="a")
    for line in out.splitlines():
        parts = line.split(",")
        if parts[0] == "all_reduce" and parts[1] == str(GRAD_BYTES):
            return float(parts[2]) / 1000
    raise SystemExit("chorus-bench printed no all_reduce line")


def python_ddp(build, world, backend, log):
    """bench/python_extras.py's figures, ms: exposed communication (default DDP, and with
    gradient_as_bucket_view) and the all_reduce of the gradients' bytes from Python."""
    env = runner.one_thread_env()
    site = os.path.join(build, "python", "site")
    env["PYTHONPATH"] = site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = runner.run([runner.default_python(), os.path.join(runner.HERE, "python_extras.py"), str(world),
                      "--backend", backend], env=env, log=log, log_mode="a")
    patterns = {"exposed": r"^ddp step .* exposed communication (-?[\d.]+) ms",
                "exposed_view": r"^ddp \(gradient_as_bucket_view\) step .* exposed communication (-?[\d.]+) ms",
                "all_reduce": r"^all_reduce of the gradients' \d+ B in DDP's bucket memory: ([\d.]+) ms"}
    found = {}
    for key, pattern in patterns.items():
        m = re.search(pattern, out, re.M)
        if not m:
            raise SystemExit(f"python_extras.py ({backend}) printed no line for {key}")
        found[key] = float(m.group(1))
    return found


def main():
    ap = runner.parser(__doc__, "2,4")
    ap.add_argument("--no-python", action="store_true", help="C++ DDP only (a build without the Python backend)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    python = not args.no_python and os.path.isdir(os.path.join(args.build, "python", "site"))
    runs = {w: [] for w in runner.worlds(args)}
    for _ in range(args.repeat):
        for w in runs:
            r = {}
            modes = cpp_ddp(args.build, w, os.path.join(args.out, f"ddp-exposed-cpp-np{w}.txt"))
            r["cpp_step"] = modes["ddp_overlap"]
            r["cpp_exposed"] = modes["ddp_overlap"] - modes["local_no_sync"]
            r["raw_all_reduce"] = raw_all_reduce(args.build, w, os.path.join(args.out, f"ddp-exposed-raw-np{w}.txt"))
            if python:
                for backend in ("chorus", "gloo"):
                    log = os.path.join(args.out, f"ddp-exposed-python-{backend}-np{w}.txt")
                    for key, value in python_ddp(args.build, w, backend, log).items():
                        r[f"py_{backend}_{key}"] = value
            runs[w].append(r)
    verdicts = runner.Verdicts()
    for w, table in runs.items():
        m = runner.medians(table)
        raw = m["raw_all_reduce"]
        print(f"\n== W={w}, median ms over {args.repeat} run(s); ratio = exposed / raw all_reduce of the same bytes")

        def line(label, v, ratio=True):
            print(f"  {label:58s} {v:8.2f}" + (f"  {v / raw:5.2f}x" if ratio else ""))

        line(f"raw all_reduce, {GRAD_BYTES} B, symmetric buffers", raw, ratio=False)
        line("C++ DDP step", m["cpp_step"], ratio=False)
        line("C++ DDP exposed communication", m["cpp_exposed"])
        for backend in ("chorus", "gloo"):
            for key, what in (("exposed", "exposed communication"),
                              ("exposed_view", "exposed, gradient_as_bucket_view"),
                              ("all_reduce", "all_reduce of the bytes from Python")):
                if f"py_{backend}_{key}" in m:
                    line(f"torch DDP on {backend}: {what}", m[f"py_{backend}_{key}"])
        verdicts.check(f"W={w} C++ DDP exposed <= 1.3x the raw all_reduce", m["cpp_exposed"] <= 1.3 * raw)
        if "py_chorus_exposed" in m:
            verdicts.check(f"W={w} torch DDP on chorus exposed <= 1.3x the raw all_reduce",
                           m["py_chorus_exposed"] <= 1.3 * raw)
            verdicts.check(f"W={w} the all_reduce from Python (DDP's bucket memory) <= 1.1x chorus-bench's",
                           m["py_chorus_all_reduce"] <= 1.1 * raw)
    verdicts.print()


if __name__ == "__main__":
    main()
