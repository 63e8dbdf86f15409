#!/usr/bin/env bash
# Builds chorus and runs every test: the README's test command, and what CI runs.
# Then builds chorus against torch 2.14 and runs the Python package's tests and a C++ consumer on
# it; then builds the core again with AddressSanitizer and UndefinedBehaviorSanitizer and runs the
# core's tests under them, and the test of torch's gloo and chorus's in one Python process with
# the sanitized chorus_torch. Those two builds compile beside the main tests (Note [Builds beside
# the tests]).
# Usage: scripts/test.sh [build-dir]      (the 2.14 build goes to <build-dir>-torch2.14, the
#                                          sanitized one to <build-dir>-sanitize, pip's build
#                                          in the tests to <build-dir>-pip)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# nproc obeys OMP_NUM_THREADS, which the tests set to 1: count the cores without it.
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
build=${1:-"$root/build"}
# Where CI's time goes: the time so far, and how busy the cores were since the last such line (the
# stages are bound by the cores' time where they are near 100%, and only there).
cpu_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6}' /proc/stat; }  # busy, idle
read -r busy_then idle_then < <(cpu_ticks)
elapsed() {
  local busy idle
  read -r busy idle < <(cpu_ticks)
  echo "== $1 after $((SECONDS / 60)) min $((SECONDS % 60)) s" \
    "(the cores busy $(((busy - busy_then) * 100 / (busy - busy_then + idle - idle_then + 1)))% of the time since the last line)"
  busy_then=$busy idle_then=$idle
}

"$root/scripts/install-deps.sh"  # Debian packages, and torch 2.13 in .venv (which CMake finds)
# A compiler cache for the builds this script starts (CMake reads these when it first configures a
# build directory): the Python package's build in the tests (python_pip_package, in <build>-pip)
# and the torch 2.14 build (<build>-torch2.14) then compile only what differs from the main build,
# not the whole core again. ccache finds a compile again only where its command line is the same,
# so every build here takes: one compiler name (pip's takes Python's g++ where CMake takes c++);
# one generator (pip's would take Ninja where it is installed, which compiles from the build
# directory's top where Makefiles compile from each subdirectory); and paths relative to the
# directory that holds the sources and the builds (CCACHE_BASEDIR), each build a sibling of the
# main one, so that a build's own generated files are at the same relative place in each. The
# pip build went from 219 to 67 s with 100 of 101 compiles found. The precompiled header of the
# torch layer (26 s of those 67) is cached too, and the compiles that include it are found, only
# where ccache does not check the header's defines and its files' times (CCACHE_SLOPPINESS, as
# ccache's manual asks for precompiled headers): then the pip build took 34 s, every compile found.
mkdir -p "$build" && build=$(cd "$build" && pwd)
if command -v ccache > /dev/null; then
  base=$root
  while [[ "$build/" != "$base/"* ]]; do base=$(dirname "$base"); done
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache CC=${CC:-gcc} CXX=${CXX:-g++} \
    CMAKE_GENERATOR=${CMAKE_GENERATOR:-Unix Makefiles} \
    CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
  [[ $base == / ]] || export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$base}
fi
# Note [Builds beside the tests]: the later stages' builds (against torch 2.14, and with the
# sanitizers) compile while the main tests run, at the lowest priority (nice 19): the tests leave
# the cores idle about a third of the time (waits, timeouts, namespace hosts' links, the tests that
# run alone), and a nice-19 compile takes only what a test does not; each test's process preempts
# it as soon as it wakes. Their output waits in logs. torch 2.14's environment is made while the
# main build compiles (pip mostly unpacks, 5.4 GB, where the compiler computes); its build starts
# once the main build is done, so that ccache hands it the main build's objects.
build214="$build-torch2.14"
sanitized="$build-sanitize"
main_built="$build/.main-built"
rm -f "$main_built"
torch214_log="$build/torch2.14.log"
(
  "$root/scripts/install-deps.sh" --torch 2.14
  while [[ ! -e $main_built ]]; do
    kill -0 $$ 2> /dev/null || exit 1  # test.sh ended before its main build did
    sleep 1
  done
  nice -n 19 cmake -S "$root" -B "$build214" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$root/.venv-2.14/bin/python" \
    -DCHORUS_BUILD_BENCH=OFF -DCHORUS_BUILD_EXAMPLES=OFF
  nice -n 19 cmake --build "$build214" -j "$jobs" --target chorus_torch_ext chorusrun chorus_torch
) > "$torch214_log" 2>&1 &
torch214_job=$!
# A failed stage ends the script, and the builds beside it end with it: each job with what it
# started (pip, cmake, the compilers), which killing the job's subshell alone would leave running.
kill_tree() {
  local child
  for child in $(pgrep -P "$1" 2> /dev/null); do kill_tree "$child"; done
  kill "$1" 2> /dev/null || true
}
trap 'for job in $(jobs -p); do kill_tree "$job"; done' EXIT
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$jobs"
touch "$main_built"
elapsed "installed and built"
# -O1 and line tables only (CMakeLists.txt adds -g1): the reports keep their file:line, and the
# build takes half the time of -O2 -g.
sanitize_log="$build/sanitize-build.log"
(
  nice -n 19 cmake -S "$root" -B "$sanitized" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCHORUS_SANITIZE=address,undefined \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -DNDEBUG" \
    -DCHORUS_BUILD_BENCH=OFF -DCHORUS_BUILD_EXAMPLES=OFF
  nice -n 19 cmake --build "$sanitized" -j "$jobs" --target core_tests chorus_torch_ext
) > "$sanitize_log" 2>&1 &
sanitize_job=$!
# Tests start real processes; more ranks than cores is intended. One BLAS/OpenMP thread each.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
(cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 900)
elapsed "the tests passed"

echo "== torch 2.14 (a CUDA build, on the CPU): the Python package's tests and a C++ consumer"
# The whole suite ran above on torch 2.13; here chorus builds against 2.14.1 from its own
# environment, and the backend's tests, torch's suite at W=2 and a find_package(chorus) consumer
# run on it. (The wheel as pip builds and installs it is tested on 2.13 above: the same build with
# another torch pinned, and a second compile of everything here would cost CI five minutes.)
wait "$torch214_job" || { cat "$torch214_log"; echo "test.sh: installing or building against torch 2.14 failed" >&2; exit 1; }
tail -n 3 "$torch214_log"
elapsed "torch 2.14 installed and built (beside the tests)"
(cd "$build214" && ctest --output-on-failure -j "$jobs" --timeout 900 \
  -R '^(python_(smoke|backend|collectives|fsdp2)|torch_suite_w2|install_and_find_package)$')

echo "== the core's tests, and two gloos in one process, under -fsanitize=address,undefined"
wait "$sanitize_job" || { cat "$sanitize_log"; echo "test.sh: the sanitized build failed" >&2; exit 1; }
tail -n 3 "$sanitize_log"
elapsed "the sanitized build built (beside the tests)"
export ASAN_OPTIONS="abort_on_error=0:detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0"
cd "$sanitized"
# Left out here: seven ranks on two cores, which run the code that three and four run at twice the
# time; the algorithms between namespace hosts (hosts_algorithms_*, 108 s of CI's last minutes
# run alone), whose code the forced algorithms of the tcp sweeps run, as two_hosts runs the
# hierarchy's between two hosts; of those forced algorithms, the power of two (W=4), whose steps
# three ranks run too, with the folding of an extra rank besides (67 s); and Gloo's sweeps at
# three and four ranks (73 s), which run Gloo's own algorithms where chorus's adapter around
# them is the same as at two. The first run of the tests above runs them all.
ctest --output-on-failure -j "$jobs" --timeout 900 -L 'core|gloo' \
  -E 'W7|hosts_algorithms|gloo_W[34]|tcp_W4_(doubling|ring|halving)'
elapsed "the sanitized tests passed"
