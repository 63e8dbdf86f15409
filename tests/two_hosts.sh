#!/usr/bin/env bash
# Two "hosts" on one machine (tests/netns.sh); chorusrun runs 2 processes on each (world 4,
# backend auto):
#   1. the collective sweep, which must take the hierarchical path and be correct on every rank;
#   2. with TRAIN_DDP given, a short DDP training run (examples/train_ddp) that must end with
#      identical parameters on all 4 ranks;
#   3. all_reduce in a loop, then node B's processes are killed: node A must name a rank of
#      node B and stop within seconds.
# Usage: tests/two_hosts.sh CHORUSRUN GROUP_PROBE [TRAIN_DDP]
# Exits 77 (skipped) where network namespaces cannot be made (no root, no iproute2).
set -uo pipefail
run=$1 probe=$2 train=${3:-}
out=$(mktemp -d)
netns_cleanup='rm -rf "$out"'
source "$(dirname "$0")/netns.sh"
netns_up

port=$((20000 + $$ % 10000))
# on NAMESPACE HOSTNAME NODE_RANK PROGRAM ARGS...: chorusrun for that node, in the background.
on() {
  local ns=$1 name=$2 node=$3
  shift 3
  in_host "$ns" "$name" "$run" --nnodes 2 --node-rank "$node" --master-addr $MASTER_IP --master-port "$port" \
    --nproc-per-node 2 "$@" >"$out/$name.log" 2>&1 &
}
fail() {
  echo "FAILED: $*"
  for f in "$out"/*.log; do echo "--- $f"; cat "$f"; done
  exit 1
}

echo "== every collective, world 4 on 2 hosts"
on $A node-a 0 "$probe"
pa=$!
on $B node-b 1 "$probe"
pb=$!
wait $pa || fail "node A exited with $?"
wait $pb || fail "node B exited with $?"
cat "$out"/node-*.log
[[ $(cat "$out"/node-*.log | grep -c "backend hierarchical") == 4 ]] || fail "not every rank took the hierarchical path"
[[ $(cat "$out"/node-*.log | grep -c "every collective correct") == 4 ]] || fail "not every rank checked out"

if [[ -n "$train" ]]; then
  echo "== DDP training, world 4 on 2 hosts"
  port=$((port + 1))
  export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
  on $A node-a 0 "$train" --epochs 1 --train-size 8000 --test-size 1000 --out "$out/ckpt"
  pa=$!
  on $B node-b 1 "$train" --epochs 1 --train-size 8000 --test-size 1000 --out "$out/ckpt"
  pb=$!
  wait $pa || fail "node A's training exited with $?"
  wait $pb || fail "node B's training exited with $?"
  cat "$out"/node-a.log
  grep -q "replicas: all 4 ranks hold the same" "$out/node-a.log" || fail "the replicas differ"
fi

echo "== node B dies"
port=$((port + 1))
on $A node-a 0 "$probe" --hang
pa=$!
on $B node-b 1 "$probe" --hang
for _ in $(seq 100); do
  [[ $(cat "$out"/node-*.log | grep -c "backend") == 4 ]] && break
  sleep 0.1
done
sleep 1
ip netns pids $B | xargs -r kill -9
killed=$(date +%s%N)
wait $pa
code=$?
took_ms=$((($(date +%s%N) - killed) / 1000000))
cat "$out"/node-a.log
((code != 0)) || fail "node A exited 0 after node B died"
grep -Eq "rank (2|3) \((global rank [0-9]+ )?on node-b\)" "$out/node-a.log" ||
  fail "node A did not name a rank of node B and its host"
echo "node A stopped $took_ms ms after node B was killed"
((took_ms < 15000)) || fail "took $took_ms ms"
echo "PASSED"
