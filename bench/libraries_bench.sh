#!/usr/bin/env bash
# The seeds' libraries on gloo and on chorus, in one run: a Fabric and an Accelerate DDP step
# (with their exposed communication) and DCP's save and load (bench/libraries_bench.py), FSDP2's
# step and peak RSS on the 100.7M-parameter MLP (bench/peers/torch_zero.py --modes
# fsdp2), and chorus's C++ FullShard on the same model (chorus-sharded-bench), at each world size.
# The programs meet on torch's TCPStore, which listens on every address: as root, everything
# runs in a network namespace whose only interface is loopback.
# Usage: bench/libraries_bench.sh [build-dir] [worlds, default "2 4"]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-"$root/build"}
worlds=${2:-"2 4"}
peers="$root/bench/peers"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH="$build/python/site"
py=${CHORUS_PYTHON:-"$root/.venv/bin/python"}

netns=()
if [[ $(id -u) -eq 0 ]] && command -v ip >/dev/null; then
  ns="chorus-libbench-$$"
  ip netns add "$ns"
  trap 'ip netns del "$ns"' EXIT
  ip -n "$ns" link set lo up
  netns=(ip netns exec "$ns")
fi

for world in $worlds; do
  for case in fabric accelerate dcp; do
    for backend in gloo chorus; do
      "${netns[@]}" "$py" -m torch.distributed.run --standalone --nproc-per-node "$world" \
        "$root/bench/libraries_bench.py" "$case" --backend "$backend" 2>/dev/null | grep "_ms="
    done
  done
  for backend in gloo chorus; do
    "${netns[@]}" "$py" "$peers/torch_zero.py" "$world" --backend "$backend" --modes fsdp2 | grep -v "^\[" || true
  done
  "${netns[@]}" "$build/bench/chorus-sharded-bench" --world "$world" --modes full_shard_units | grep -v "^#" || true
done
