#!/usr/bin/env bash
# Installs what chorus needs to build, test and benchmark, when missing: Debian packages with apt,
# and the project's Python environment (a venv with torch 2.13 and the test tools) with pip.
# Usage: scripts/install-deps.sh [--bench] [--torch 2.14]
#   --bench        adds matplotlib for bench/plot.py
#   --torch 2.14   a second environment, .venv-2.14, with torch 2.14.1 (a CUDA build of 5.4 GB,
#                  which runs on the CPU) and what the Python package's tests need, for the build
#                  that checks chorus against 2.14 (scripts/test.sh)
#   CHORUS_VENV=DIR   where the venv lives (default: .venv, or .venv-2.14 with --torch 2.14); CMake
#                     finds .venv by itself.
#
# LibTorch comes from the torch wheel (torch/share/cmake, its headers and libraries): Debian's
# libtorch-dev and python3-torch (1.13) are not used. torch is pinned: an unpinned one would pull
# the newest CUDA build, several GB. The mpi backend builds on libopenmpi-dev; the gloo backend
# builds its own private copy of gloo (cmake/gloo.cmake). The tests start programs under mpirun
# (openmpi-bin) and torchrun (the wheel's), and make network namespaces (iproute2) to stand in
# for other hosts, and show a hung process's stacks with gdb when one does not end. SimGrid
# (libsimgrid-dev) runs chorus's algorithms at 1,024 nodes (bench/sim). ccache hands
# scripts/test.sh's later builds (the pip package's, torch 2.14's) what its first one compiled.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${CHORUS_VENV:-"$root/.venv"}

packages=(cmake g++ make libgtest-dev libcli11-dev libopenmpi-dev openmpi-bin libxxhash-dev iproute2 clang-format
          python3-venv pkg-config libsimgrid-dev gdb ccache)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "chorus: installing ${missing[*]}" >&2
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "chorus: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

requirements=("$root/python/requirements-test.txt")
nodeps="$root/python/requirements-nodeps.txt"  # installed without their dependencies
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bench) requirements+=("$root/python/requirements-bench.txt") ;;
    --torch)
      [[ "${2:-}" == "2.14" ]] || { echo "install-deps.sh: --torch takes 2.14 (2.13 is the default)" >&2; exit 2; }
      requirements=("$root/python/requirements-torch2.14.txt")
      nodeps=/dev/null
      venv=${CHORUS_VENV:-"$root/.venv-2.14"}
      shift ;;
    *) echo "install-deps.sh: unknown argument $1 (--bench, --torch 2.14)" >&2; exit 2 ;;
  esac
  shift
done
# The venv is current when it holds what every requirements file asks for (a stamp per file).
stamp="$venv/.chorus-requirements"
wanted=$(cat "${requirements[@]}" "$nodeps" | sha256sum | cut -d' ' -f1)
if [[ -x "$venv/bin/python" && -f "$stamp" ]] && grep -qx "$wanted" "$stamp"; then
  exit 0
fi
if [[ ! -x "$venv/bin/python" ]]; then
  echo "chorus: making the Python environment $venv" >&2
  python3 -m venv "$venv"
fi
args=()
for r in "${requirements[@]}"; do args+=(-r "$r"); done
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${args[@]}"
[[ "$nodeps" == /dev/null ]] || "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$nodeps"
echo "$wanted" >> "$stamp"
