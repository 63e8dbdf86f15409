#!/usr/bin/env bash
# Builds the core with ThreadSanitizer and runs its tests under it (not part of scripts/test.sh:
# the core's multi-process suites run several times slower under TSan).
# Usage: scripts/tsan.sh [build-dir] [ctest args...]    (default build dir: build-tsan)
# Suppressions (tests/sanitizers/tsan.supp) only with a reason each.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# nproc obeys OMP_NUM_THREADS, which the tests set to 1: count the cores without it.
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
build=${1:-"$root/build-tsan"}
shift || true
"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCHORUS_SANITIZE=thread \
  -DCHORUS_BUILD_TORCH=OFF -DCHORUS_BUILD_BENCH=OFF -DCHORUS_BUILD_EXAMPLES=OFF
cmake --build "$build" -j "$jobs"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/sanitizers/tsan.supp"
cd "$build"
ctest --output-on-failure -j "$jobs" --timeout 1800 -E '^(format|two_hosts)$' "$@"
