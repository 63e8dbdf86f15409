#!/usr/bin/env bash
# Every algorithm between hosts, on H "hosts" (tests/netns.sh) of R ranks each: chorusrun starts
# core/tests/group_probe --algorithms on each, which runs the collective sweep and a check that
# every rank ends with the same bits once per forced set of algorithms (and once as the cost
# model chooses), and that the results are the same under every set wherever the algorithms
# reduce in the same order (all but the ring all_reduce's float sums on 3 hosts). With R > 1 the group is hierarchical (the algorithms run between one rank per host); with
# R = 1 it is flat.
# Usage: tests/hosts_algorithms.sh CHORUSRUN GROUP_PROBE H R
# Exits 77 (skipped) where network namespaces cannot be made (no root, no iproute2).
set -uo pipefail
run=$1 probe=$2 h=$3 r=$4
out=$(mktemp -d)
netns_cleanup='rm -rf "$out"'
source "$(dirname "$0")/netns.sh"
hosts_up $h
export OMP_NUM_THREADS=1
port=$((20000 + $$ % 10000))
pids=()
for ((i = 0; i < h; i++)); do
  in_host ${HOST_NS[i]} host$i "$run" --nnodes $h --node-rank $i --master-addr ${HOST_IP[0]} --master-port $port \
    --nproc-per-node $r "$probe" --algorithms >"$out/host$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait $p || failed=1; done
cat "$out"/host*.log
((failed == 0)) || { echo "FAILED: a host's ranks exited non-zero"; exit 1; }
want=$((h * r * 5))
got=$(cat "$out"/host*.log | grep -c "identical on every rank")
[[ $got == "$want" ]] || { echo "FAILED: $got of $want rank x set checks passed"; exit 1; }
echo "PASSED"
