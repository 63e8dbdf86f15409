#!/usr/bin/env bash
# The Python package as a user gets it: `pip wheel --no-build-isolation` builds chorus_torch and
# chorusrun against the torch of the given Python's environment (twice, from one build directory), then a fresh virtual environment
# installs torch and that wheel (which requires exactly the torch it was built against), and
# chorusrun from the wheel starts two ranks that use backend "chorus" without importing
# chorus_torch (the .pth the wheel installs loads it after torch).
# Usage: tests/pip_package.sh PYTHON WORK_DIR [BUILD_DIR]
#   BUILD_DIR: pip's build directory (default WORK_DIR/build); the test command gives a sibling of
#   its own build directory, whose compiles ccache then finds (scripts/test.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=$1 work=$2 pip_build=${3:-"$2/build"}
rm -rf "$work" "$pip_build"
mkdir -p "$work"
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)

# Twice from the same build directory, as a second install from one clone does (after a git
# pull, say): the second wheel must hold the same package, not chorusrun alone.
for round in first second; do
  echo "== pip wheel --no-build-isolation $root ($round time)"
  rm -rf "$work/dist"
  CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$python" -m pip wheel --no-build-isolation --no-deps -q -w "$work/dist" \
    -C build-dir="$pip_build" "$root" 2>&1 | grep -v "^WARNING: Location" || true
  wheel=$(ls "$work"/dist/chorus_torch-*.whl)
  contents=$(unzip -l "$wheel")
  for part in chorus_torch/_C chorus_torch/__init__.py chorus_torch.pth chorus_torch_autoload.py /chorusrun; do
    grep -q "$part" <<< "$contents" || { echo "FAILED: the $round wheel has no $part"; echo "$contents"; exit 1; }
  done
  echo "built $(basename "$wheel"): extension, package, .pth hook and chorusrun"
done
# Read whole before grepping: the metadata carries the README, larger than a pipe's buffer, and a
# grep -q that stops at its match would leave unzip writing into a closed pipe (SIGPIPE, which
# pipefail turns into a failure).
metadata=$(unzip -p "$wheel" '*.dist-info/METADATA')
grep -E "^(Name|Version|Requires-Dist):" <<< "$metadata"
torch_version=$("$python" -c "import torch; print(torch.__version__.split('+')[0])")
grep -qx "Requires-Dist: torch==$torch_version" <<< "$metadata" ||
  { echo "FAILED: the wheel does not require torch==$torch_version"; exit 1; }

echo "== a fresh environment installs it"
"$python" -c "import sys; print(sys.base_prefix)" > /dev/null
base=$("$python" -c "import sys; print(sys.base_prefix)")/bin/python3
"$base" -m venv "$work/env"
"$work/env/bin/python" -m pip install -q --disable-pip-version-check "$wheel" 2>&1 | grep -v "^WARNING: Location" || true
"$work/env/bin/python" -m pip list 2>/dev/null | grep -iE "^(torch|chorus)"

cat > "$work/job.py" <<'PY'
import sys, torch, torch.distributed as dist
dist.init_process_group("chorus")  # env:// from chorusrun; chorus_torch was loaded after torch
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
assert t.tolist() == [3.0] * 4, t
where = sys.modules["chorus_torch"].__file__
assert where.startswith(sys.prefix), (where, sys.prefix)
print("rank", dist.get_rank(), "backend", dist.get_backend(), "chorus_torch from", where, flush=True)
dist.destroy_process_group()
PY
out=$(OMP_NUM_THREADS=1 "$work/env/bin/chorusrun" --nproc-per-node 2 --master-port 0 "$work/env/bin/python" "$work/job.py")
echo "$out"
[[ $(grep -c "backend chorus" <<< "$out") == 2 ]] || { echo "FAILED: not both ranks ran on chorus"; exit 1; }
echo "PASSED"
