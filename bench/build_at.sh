#!/usr/bin/env bash
# Builds chorus-bench on an older commit's library with this tree's benchmark, for a before-and-after
# run of bench/compare.py on the same workload:
#   bench/build_at.sh b609d2a /tmp/at-b609d2a
#   bench/compare.py --build /tmp/at-b609d2a/build --np 2 --repeat 3 --out /tmp/cmp-b609d2a
# alternating with `bench/compare.py --build build ...` on this tree's build.
#
# The benchmark is this tree's chorus_bench.cc and bench_ops.{h,cc}: the fill of each call's input
# is part of the workload (Note [The same fill on both sides] in chorus_bench.cc), and what it
# leaves in the caches changes how fast the next call's copies go. The commit's own benchmark, or
# its library with only this tree's chorus_bench.cc, times another workload: on the 2-core Xeon VM,
# W=2, 2000 calls of a 1 MiB broadcast, b609d2a's element-by-element fill gave a p95 of 56-84 us,
# this tree's (memcpy in runs of up to 64 KiB, as in mpi_tail.c) 88-92 on the same library.
# A launcher older than its binding of ranks to cores (Note [A core for every rank]) starts them
# unbound, as it did.
# Usage: bench/build_at.sh COMMIT DIR   (DIR/src: the commit's tree, DIR/build: its build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[[ $# == 2 ]] || { echo "usage: $0 COMMIT DIR" >&2; exit 2; }
commit=$(git -C "$root" rev-parse --verify --quiet "$1^{commit}") ||
  { echo "build_at.sh: no commit '$1' in $root (a clone with its history has every commit the docs name)" >&2; exit 2; }
dir=$2
rm -rf "$dir/src"
mkdir -p "$dir/src"
git -C "$root" archive "$commit" | tar -x -m -C "$dir/src"  # -m: times of now, so a DIR reused for another commit rebuilds
cp "$root"/bench/{chorus_bench.cc,bench_ops.cc,bench_ops.h} "$dir/src/bench/"
if ! grep -rqs "worker_cpus" "$dir/src/core/include"; then
  python3 - "$dir/src/bench/chorus_bench.cc" << 'EOF'
import re, sys
path = sys.argv[1]
text = open(path).read()
spec = re.compile(r"specs\.push_back\(\s*\{r, args, (launcher_environment\(.*?\)\)), worker_cpus\(r, np\)\}\);\n"
                  r"\s*for \(auto& var : worker_thread_environment\(np\)\) specs\.back\(\)\.env\.push_back\(var\);",
                  re.S)
text, n = spec.subn(r"specs.push_back({r, args, \1});", text)
if n != 1:
    sys.exit(f"{path}: the workers' binding to take out was not found")
open(path, "w").write(text)
EOF
fi
if command -v ccache > /dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
fi
cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DCHORUS_BUILD_TORCH=OFF -DCHORUS_BUILD_PYTHON=OFF \
  -DCHORUS_BUILD_TESTS=OFF -DCHORUS_BUILD_EXAMPLES=OFF -DCHORUS_GLOO=OFF -DCHORUS_MPI=OFF > "$dir/configure.log" 2>&1 ||
  { tail -20 "$dir/configure.log" >&2; exit 1; }
cmake --build "$dir/build" -j "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" --target chorus-bench > "$dir/build.log" 2>&1 ||
  { tail -20 "$dir/build.log" >&2; exit 1; }
echo "$dir/build/bench/chorus-bench: $(git -C "$root" log -1 --format='%h %s' "$commit" | cut -c1-80), with this tree's benchmark"
