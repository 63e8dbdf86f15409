#!/usr/bin/env bash
# Installs chorus from a build tree into a fresh prefix, builds tests/install_consumer against it
# with find_package(chorus CONFIG), and runs it; then imports the installed Python package with
# the Python it was built for.
# Usage: check.sh <build-dir> <work-dir> [python]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1 work=$2 python=${3:-}
rm -rf "$work"
cmake --install "$build" --prefix "$work/prefix" > /dev/null
cmake -S "$here" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$work/consumer" > /dev/null
OMP_NUM_THREADS=1 "$work/consumer/consumer"
# What cmake --install put in bin/ starts (the torch benchmarks find the LibTorch they were built
# against), and runs.
for tool in "$work/prefix/bin/"*; do
  "$tool" --help > /dev/null || { echo "check.sh: installed $(basename "$tool") does not start" >&2; exit 1; }
done
if [[ -x "$work/prefix/bin/chorus-ddp-bench" ]]; then
  OMP_NUM_THREADS=1 "$work/prefix/bin/chorus-ddp-bench" --np 2 --warmup 1 --steps 1 > /dev/null
fi

# The Python package, when built: its .pth hook loads chorus_torch after torch, with no import.
site=$(find "$work/prefix" -name chorus_torch.pth -printf '%h\n' | head -1)
if [[ -n "$site" && -n "$python" ]]; then
  "$python" - "$site" "$work" <<'PY'
import site, sys
site.addsitedir(sys.argv[1])  # what Python does at start-up for its site-packages
import torch, torch.distributed as dist
dist.init_process_group("chorus", init_method=f"file://{sys.argv[2]}/store", rank=0, world_size=1)
t = torch.ones(2)
dist.all_reduce(t)
assert dist.get_backend() == "chorus" and t.tolist() == [1.0, 1.0], t
where = sys.modules["chorus_torch"].__file__
assert where.startswith(sys.argv[1]), where
print("installed chorus_torch: ok, from", where)
PY
fi
