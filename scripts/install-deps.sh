#!/usr/bin/env bash
# Installs the Debian packages chorus needs to build, test and benchmark, when missing.
# Usage: scripts/install-deps.sh [--bench]   (--bench adds matplotlib for bench/plot.py)
# The gloo and mpi backends build on libgloo-dev and libopenmpi-dev. The tests start programs
# under torchrun (python3-torch) and mpirun (openmpi-bin) too, and make network namespaces
# (iproute2) to stand in for other hosts. chorus_torch, the torch.distributed backend, builds
# against Debian's python3-torch with python3-dev and pybind11-dev.
set -euo pipefail

packages=(cmake g++ make libgtest-dev libcli11-dev libgloo-dev libopenmpi-dev libopenblas0-pthread libtorch-dev
          libxxhash-dev openmpi-bin python3-torch python3-dev pybind11-dev iproute2 clang-format)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(python3-matplotlib)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
echo "chorus: installing ${missing[*]}" >&2
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "chorus: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
