#!/usr/bin/env bash
# all_reduce across two "hosts" (network namespaces joined by a veth pair, tests/netns.sh) at
# world 4, 2 ranks per host, in one run: chorus's hierarchical path (backend auto: shared memory
# in each host, gloo between them), chorus flat on gloo, and torch's gloo with the same layout
# (torchrun on each host). Prints one table, rank 0's median µs, and the ratios to torch.
# Usage: bench/two_hosts_bench.sh [BUILD_DIR] [SIZES]   (root; SIZES: comma-separated bytes per rank)
# NPROC=1 runs one rank per host (then auto runs flat, as gloo).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
sizes=${2:-8,512,32768,262144,1048576,4194304,16777216,67108864}
out=$(mktemp -d)
netns_cleanup='rm -rf "$out"'
source "$root/tests/netns.sh"
netns_up
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
port=$((30000 + $$ % 10000))
nproc=${NPROC:-2}

# run NAME LAUNCHER [ENV=VALUE...] -- PROGRAM ARGS...: the launcher on both hosts (node 0 on
# A); node A's output lands in $out/NAME.
run() {
  local name=$1 launcher=$2
  shift 2
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  port=$((port + 1))
  local pids=()
  for node in 0 1; do
    local ns=$A host=node-a
    ((node == 1)) && ns=$B host=node-b
    in_host $ns $host env "${envs[@]}" GLOO_SOCKET_IFNAME=${ns}v $launcher --nnodes 2 --node_rank $node \
      --master_addr $MASTER_IP --master_port $port --nproc_per_node $nproc "$@" >"$out/$name.$node" 2>&1 &
    pids+=($!)
  done
  wait ${pids[0]} && wait ${pids[1]} || { echo "FAILED: $name"; cat "$out/$name".*; exit 1; }
  echo "== $name"
  cat "$out/$name.0"
}

chorusrun="$build/launcher/chorusrun --no_prefix"
bench="$build/bench/chorus-bench --ops all_reduce --sizes $sizes"
run hierarchical "$chorusrun" CHORUS_BACKEND=auto -- $bench
run flat_gloo "$chorusrun" CHORUS_BACKEND=gloo -- $bench
# torchrun of the project's environment; the table goes to stderr, which is tee'd (lines then
# start with "[default0]:").
py=${CHORUS_PYTHON:-"$root/.venv/bin/python"}
run torch_gloo "$py -m torch.distributed.run --redirects 1 --tee 2" -- "$root/bench/torch_all_reduce.py" "$sizes"

echo
echo "== all_reduce f32, world $((2 * nproc)) = 2 hosts x $nproc ranks, rank 0's median µs (ratio: torch gloo / that)"
"$py" - "$out" <<'PY'
import sys
out = sys.argv[1]
def table(name):
    t = {}
    for line in open(f"{out}/{name}.0"):
        f = line.split(":", 1)[1].split() if line.startswith("[default") else line.split()
        if len(f) >= 3 and f[0] == "all_reduce" and f[1].isdigit():
            t[int(f[1])] = float(f[2])
    return t
h, g, t = table("hierarchical"), table("flat_gloo"), table("torch_gloo")
print(f"{'bytes':>10} {'hierarchical':>13} {'flat gloo':>11} {'torch gloo':>11} {'hier. ratio':>11} {'flat ratio':>11}")
for b in sorted(t):
    print(f"{b:>10} {h[b]:>13.1f} {g[b]:>11.1f} {t[b]:>11.1f} {t[b] / h[b]:>10.2f}x {t[b] / g[b]:>10.2f}x")
PY
