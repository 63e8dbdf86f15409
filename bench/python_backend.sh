#!/usr/bin/env bash
# chorus's torch.distributed backend against gloo, in one run: the torch peers in bench/peers
# with --backend gloo and --backend chorus, bench/python_extras.py (FSDP2's tensor
# collectives, DDP's exposed communication) likewise, and chorus-bench at 8 bytes for the C++
# side of the per-call cost. Usage: bench/python_backend.sh [build-dir] [world]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-"$root/build"}
world=${2:-2}
peers="$root/bench/peers"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH="$build/python/site"
py=${CHORUS_PYTHON:-"$root/.venv/bin/python"}  # the project's environment (scripts/install-deps.sh)

echo "== C++: chorus-bench, 8 bytes and barrier, W=$world"
"$build/bench/chorus-bench" -n "$world" --ops barrier,all_reduce --sizes 8
for backend in gloo chorus; do
  echo "== collectives from Python, $backend, W=$world"
  $py "$peers/torch_collectives.py" "$world" --backend "$backend"
done
for backend in gloo chorus gloo chorus; do
  echo "== DDP on the reference MLP, $backend"
  $py "$peers/torch_ddp.py" "$world" --backend "$backend" | tail -1
done
for backend in gloo chorus; do
  echo "== reduce_scatter_tensor, all_gather_into_tensor, DDP's exposed communication, $backend"
  $py "$root/bench/python_extras.py" "$world" --backend "$backend" | grep -v "^\[" || true
done
for backend in gloo chorus; do
  echo "== objects, $backend"
  $py "$peers/torch_objects.py" "$world" --backend "$backend" | tail -3
done
for backend in gloo chorus; do
  echo "== DDP+Adam, ZeRO-1 and FSDP2, $backend"
  $py "$peers/torch_zero.py" "$world" --backend "$backend" | grep -v "^\[" || true
done
