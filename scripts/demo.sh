#!/usr/bin/env bash
# The main job for now: builds chorus and runs a 4-process collective benchmark on this machine,
# every result verified, printed as an nccl-tests-style table.
# Usage: scripts/demo.sh [chorus-bench options]   (default: --np 4, 8 B .. 16 MiB)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target chorus-bench
if [[ $# -eq 0 ]]; then
  set -- --np 4 --min-bytes 8 --max-bytes 16M --step-factor 8
fi
exec "$build/bench/chorus-bench" "$@"
