#!/usr/bin/env bash
# The main job: builds chorus, then trains a small classifier with DDP in 4 processes started by
# chorusrun on this machine (examples/train_ddp.cc): progress on rank 0, evaluation gathered
# across ranks, a checkpoint from rank 0, a summary. About half a minute on 2 cores.
# Usage: scripts/demo.sh [train_ddp options]   (e.g. --epochs 2, --out DIR; --help)
#        CHORUS_DEMO_NPROC=2 scripts/demo.sh   (another number of processes)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# nproc obeys OMP_NUM_THREADS, which the tests set to 1: count the cores without it.
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
build="$root/build"
"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$jobs" --target chorusrun train_ddp
exec "$build/launcher/chorusrun" --nproc-per-node "${CHORUS_DEMO_NPROC:-4}" --master-port 0 \
  "$build/examples/train_ddp" "$@"
