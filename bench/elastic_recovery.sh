#!/usr/bin/env bash
# Recovery from a lost host: chorus (restart from a checkpoint; in process, replicated and
# FullShard) against torchrun's elastic launch with gloo, on 3 network-namespace hosts x 2 ranks (tests/netns.sh), training the
# main job's model (examples/train_ddp; bench/peers/elastic_train.py for torchrun: the same
# model, data, batch and optimizer), a checkpoint or commit every 10 steps. At a random moment
# after the first one, every process of host 2 is killed (torchrun's c10d store lives on host 0,
# whose loss ends a torchrun job, so host 2 is the one all three can survive). Reported per run:
# the time from the kill to the first step of the new round (rank 0's stamps) and the steps
# redone (taken before the kill, lost with it). Needs the build (chorusrun, train_ddp,
# chorus_torch) and the project venv's torch and torchrun.
# Usage: bench/elastic_recovery.sh [--repeat N] [--build DIR]
#   ONLY=restart|in-process|in-process-fsdp|torchrun runs that path once; KEEP=1 keeps the logs
#   (the directory is printed).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
repeat=3 build=$root/build
while (($#)); do
  case $1 in
    --repeat) repeat=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "usage: $0 [--repeat N] [--build DIR]"; exit 2 ;;
  esac
done
out=$(mktemp -d)
netns_cleanup='[[ -n ${KEEP:-} ]] || rm -rf "$out"'
source "$root/tests/netns.sh"
hosts_up 3
export OMP_NUM_THREADS=1 PYTHONPATH=$build/python/site
python=$root/.venv/bin/python torchrun=$root/.venv/bin/torchrun
ep="${HOST_IP[0]}:29400,${HOST_IP[1]}:29400,${HOST_IP[2]}:29400"
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# run PATH N: one job on the 3 hosts, host 2 killed; prints "ms steps".
run() {
  local path=$1 n=$2 i pids=() dir=$out/$1.$2
  mkdir -p "$dir"
  for i in 0 1 2; do
    case $path in
      restart | in-process | in-process-fsdp)
        local extra=()
        [[ $path == in-process* ]] && extra=(--in-process)
        [[ $path == *-fsdp ]] && extra+=(--strategy fsdp)
        in_host "${HOST_NS[i]}" host$i "$build/launcher/chorusrun" --nnodes 2:3 --nproc-per-node 2 --max-restarts 3 \
          --rdzv-endpoint "$ep" --rdzv-id "$path$n" --rdzv-conf join_timeout=60,last_call_timeout=2 \
          "$build/examples/train_ddp" --epochs 1 --train-size 24000 --test-size 1200 --batch 64 \
          --checkpoint-every 10 --log-steps --out "$dir" "${extra[@]}" >"$dir/host$i.log" 2>&1 &
        ;;
      torchrun)
        # The namespaces' hostnames resolve nowhere: say which agent hosts the store (is_host),
        # and which interface gloo uses, instead of letting them look the names up. The workers
        # get a store of their own each round: with the rendezvous store shared (torchrun's
        # default), the survivors' second round read the first round's gloo addresses and never
        # connected (pytorch/pytorch#135712).
        local is_host=false
        ((i == 0)) && is_host=true
        in_host "${HOST_NS[i]}" host$i env GLOO_SOCKET_IFNAME=c$$h$i TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "$torchrun" --nnodes 2:3 --nproc-per-node 2 \
          --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint "${HOST_IP[0]}:29400" --rdzv-id "tr$n" \
          --local-addr "${HOST_IP[i]}" --rdzv-conf last_call_timeout=2,join_timeout=60,is_host=$is_host \
          --monitor-interval 0.1 \
          "$root/bench/peers/elastic_train.py" "$dir/ckpt.pt" >"$dir/host$i.log" 2>&1 &
        sleep 0.5  # host 0's agent first: it serves the store
        ;;
    esac
    pids[i]=$!
  done
  for _ in $(seq 1200); do grep -q "step 10 done" "$dir"/host*.log 2>/dev/null && break; sleep 0.05; done
  sleep "0.$((RANDOM % 10))"
  local t0
  t0=$(now_ms)
  host_kill 2
  for i in 0 1; do timeout 180 tail --pid="${pids[i]}" -f /dev/null || echo "  ($path: host $i did not finish)" >&2; done
  wait 2>/dev/null
  # Rank 0's stamps, wherever rank 0 was: the new round's first step (marked), and the last step
  # the old round finished before it (a step in flight at the kill may still have finished).
  local stamps before after resumed
  after=$(grep -ho "first step after resuming done at unix ms [0-9]*\|first step of group 2 done at unix ms [0-9]*\|done at unix ms [0-9]* (first after resuming)" \
    "$dir"/host*.log | grep -o "unix ms [0-9]*" | awk '{print $3}' | sort -n | awk -v t="$t0" '$1 >= t {print; exit}')
  stamps=$(grep -ho "step [0-9]* done at unix ms [0-9]*" "$dir"/host*.log | awk '{print $2, $NF}' | sort -n -k2)
  before=$(awk -v t="${after:-0}" '$2 < t {s = $1} END {print s}' <<<"$stamps")
  resumed=$(grep -ho "resumed from step [0-9]*\|in-process: group 2 of [0-9]* ranks from step [0-9]*" "$dir"/host*.log |
    head -1 | awk '{print $NF}')
  if [[ -z $after || -z $resumed ]]; then
    echo "failed -"
  else
    echo "$((after - t0)) $((before - resumed))"
  fi
}

printf "%-16s %4s %22s %14s\n" path run "kill -> next step (ms)" "steps redone"
[[ -n ${KEEP:-} ]] && echo "logs: $out"
for n in $(seq "$repeat"); do
  if [[ -n ${ONLY:-} ]]; then
    read -r ms redone < <(run "$ONLY" 1)
    printf "%-16s %4s %22s %14s\n" "$ONLY" 1 "$ms" "$redone"
    break
  fi
  for path in restart in-process in-process-fsdp torchrun; do
    read -r ms redone < <(run "$path" "$n")
    printf "%-16s %4s %22s %14s\n" "$path" "$n" "$ms" "$redone"
  done
done
