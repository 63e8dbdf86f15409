#!/usr/bin/env bash
# Installs chorus from a build tree into a fresh prefix, builds tests/install_consumer against it
# with find_package(chorus CONFIG), and runs it. Usage: check.sh <build-dir> <work-dir>
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1 work=$2
rm -rf "$work"
cmake --install "$build" --prefix "$work/prefix" > /dev/null
cmake -S "$here" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$work/consumer" > /dev/null
OMP_NUM_THREADS=1 "$work/consumer/consumer"
