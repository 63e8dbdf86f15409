#!/usr/bin/env bash
# A Python program on backend "chorus" over two "hosts" on one machine (tests/netns.sh):
# chorusrun runs 2 processes in each, which meet through torch's env:// store and must take
# chorus's hierarchical path (shared memory in each host, tcp between them), with correct
# collectives and equal DDP replicas on all 4 ranks.
# Usage: tests/python_two_hosts.sh CHORUSRUN PROBE.py PYTHON   (PYTHONPATH finds chorus_torch)
# Exits 77 (skipped) where network namespaces cannot be made (no root, no iproute2).
set -uo pipefail
run=$1 probe=$2 python=$3
out=$(mktemp -d)
netns_cleanup='rm -rf "$out"'
source "$(dirname "$0")/netns.sh"
netns_up

port=$((20000 + $$ % 10000))
pids=()
for node in 0 1; do
  ns=$A name=node-a
  ((node == 1)) && ns=$B name=node-b
  in_host "$ns" "$name" "$run" --nnodes 2 --node-rank $node --master-addr $MASTER_IP --master-port "$port" \
    --nproc-per-node 2 "$python" "$probe" >"$out/$name.log" 2>&1 &
  pids+=($!)
done
ok=1
for p in "${pids[@]}"; do wait "$p" || ok=0; done
cat "$out"/node-*.log
((ok)) || { echo "FAILED: a node exited non-zero"; exit 1; }
[[ $(cat "$out"/node-*.log | grep -c "engine hierarchical.*collectives and DDP correct") == 4 ]] ||
  { echo "FAILED: not every rank took the hierarchical path and checked out"; exit 1; }
echo "PASSED"
