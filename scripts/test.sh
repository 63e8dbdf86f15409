#!/usr/bin/env bash
# Builds chorus and runs every test: the README's test command, and what CI runs.
# Usage: scripts/test.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-"$root/build"}

"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)"
# Tests start real processes; more ranks than cores is intended. One BLAS/OpenMP thread each.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 900
