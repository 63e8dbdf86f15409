#!/usr/bin/env bash
# Elastic jobs on network-namespace hosts (tests/netns.sh): the main job (examples/train_ddp)
# under `chorusrun --nnodes 2:3` on 3 hosts x 2 ranks, checkpointing every 10 steps, while a
# scenario happens at a random moment after the first checkpoint:
#   kill2 / kill0   every process of host 2 (or host 0, the first rendezvous endpoint) is killed
#   cut2            host 2's link goes down (its agent must give up: no majority on its side)
#   grow            a 4th host's agent starts (--nnodes 2:4): the ranks let it in at their next
#                   checkpoint (chorus::elastic::nodes_waiting)
# ip-kill2, ip-kill0, ip-cut2, ip-grow: the same through in-process recovery (train_ddp
# --in-process: chorus::elastic::run, a commit in memory every 10 steps, no restart, no disk).
# The job must finish on the hosts left (or on 4) with exit 0, and its final parameters must be
# bit-identical to a reference made of two plain runs of the same shapes: 6 ranks up to the step
# the job resumed from, then the new size from that checkpoint (restart path: the step its
# checkpoint held; in process: the step of its last commit). Each scenario prints the time from
# the event to the first step of the new round. Every agent authenticates with a
# shared secret; nothing may be left behind (processes, /dev/shm segments).
# Usage: tests/elastic_hosts.sh CHORUSRUN TRAIN_DDP ddp|fsdp SCENARIO...   (KEEP=1 keeps the logs)
# Exits 77 (skipped) where network namespaces cannot be made.
set -uo pipefail
run=$1 train=$2 strategy=$3
shift 3
out=$(mktemp -d)
netns_cleanup='[[ -n ${KEEP:-} ]] || rm -rf "$out"'
source "$(dirname "$0")/netns.sh"
hosts_up 4
export OMP_NUM_THREADS=1 CHORUS_RDZV_SECRET=elastic-test-$$-$RANDOM
# The job and its reference must add their gradients in the same order. Between 3 hosts the
# ring all_reduce and a tree add in different orders, and the choice between them comes from
# terms each group measures (Note [Choosing an algorithm between hosts]): the terms are given,
# as veth measures them, so that every group chooses alike.
export CHORUS_CROSS_COST=alpha_us=7,gbps=15,fold_gbps=200,o_us=2
port=29400
endpoints="${HOST_IP[0]}:$port,${HOST_IP[1]}:$port,${HOST_IP[2]}:$port"
# The job must outlast the event (0-2 s after the first checkpoint) on a fast machine: on tcp, 6
# ranks train 24,000 samples in about a second here. In process the steps are quicker still (no
# restart, no disk): a longer epoch leaves room for the event.
args_for() { echo --epochs 1 --train-size "$1" --test-size 1200 --batch 64 --strategy "$strategy" --checkpoint-every 10; }
args=($(args_for 120000))
pids=()

fail() {
  echo "FAILED: $*"
  for f in "$out"/*.log; do echo "--- $f"; grep -v "epoch 1/1" "$f"; done
  exit 1
}
sha_of() { grep -ho "parameters sha256 [0-9a-f]*" "$@" | awk '{print $3}' | head -1; }

# agent I RUN NNODES DIR [train args...]: host I's chorusrun for run RUN, in the background, with
# a /dev/shm of its own (a machine's), in which nothing may be left when it exits ($out/RUN.hostI.shm).
agent() {
  local i=$1 id=$2 nn=$3 dir=$4
  shift 4
  in_host_own_shm "${HOST_NS[i]}" host$i "$out/$id.host$i.shm" "$run" --nnodes "$nn" --nproc-per-node 2 --max-restarts 2 \
    --rdzv-endpoint "$endpoints" --rdzv-id "$id" --rdzv-conf join_timeout=8,last_call_timeout=2 \
    "$train" "${args[@]}" --out "$dir" "$@" >"$out/$id.host$i.log" 2>&1 &
  pids[i]=$!
}

# expect_exit I CODE: waits for host I's agent and checks its code. An agent still running after
# 300 s (a whole scenario takes under a minute here) is a hang: every process left on the hosts
# is shown with its threads' stacks (hosts_report), then the test fails.
expect_exit() {
  local waited
  for ((waited = 0; waited < 3000; waited++)); do
    kill -0 "${pids[$1]}" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "${pids[$1]}" 2>/dev/null; then
    hosts_report
    fail "host $1's chorusrun still running after 300 s (expected to exit with $2)"
  fi
  wait "${pids[$1]}"
  local code=$?
  [[ $code == "$2" ]] || fail "host $1's chorusrun exited with $code, expected $2"
}

# reference ID STEP NODES_AFTER: 6 ranks up to STEP, then NODES_AFTER x 2 from its checkpoint.
reference() {
  local id=$1 step=$2 after=$3 i
  for i in 0 1 2; do agent $i "$id-a" 3:3 "$out/$id" --max-steps "$step"; done
  for i in 0 1 2; do expect_exit $i 0; done
  for ((i = 0; i < after; i++)); do agent $i "$id-b" "$after:$after" "$out/$id"; done
  for ((i = 0; i < after; i++)); do expect_exit $i 0; done
  sha_of "$out/$id-b".host*.log
}

scenario() {
  local what=$1 victim nn=2:3 survivors i t0 mode=()
  args=($(args_for 120000))
  # FullShard steps are slower: half the in-process epoch leaves as much room for the event.
  [[ $what == ip-* ]] && mode=(--in-process) && what=${what#ip-} && args=($(args_for $([[ $strategy == fsdp ]] && echo 150000 || echo 300000)))
  local name=$what${mode:+-ip}
  case $what in
    kill2 | cut2) victim=2 ;;
    kill0) victim=0 ;;
    grow) victim=3 nn=2:4 ;;
    *) fail "unknown scenario $what" ;;
  esac
  echo "== $name ($strategy)"
  for i in 0 1 2; do agent $i "$name" $nn "$out/$name" "${mode[@]}"; done
  for _ in $(seq 1200); do grep -Eq "(checkpoint|commit): step" "$out/$name".host*.log 2>/dev/null && break; sleep 0.05; done
  grep -Eq "(checkpoint|commit): step" "$out/$name".host*.log || fail "$name: no checkpoint or commit was made"
  # A random moment; a newcomer at once, so that the job has steps left to take it in.
  [[ $what == grow ]] || sleep "$((RANDOM % 2)).$((RANDOM % 10))"
  t0=$(date +%s%N)
  case $what in
    kill*) echo "killing every process of host $victim"; host_kill $victim ;;
    cut2) echo "cutting host $victim's link"; host_cut $victim ;;
    grow) echo "starting host 3"; agent 3 "$name" $nn "$out/$name" "${mode[@]}" ;;
  esac
  survivors=(0 1 2)
  [[ $what == grow ]] && survivors=(0 1 2 3)
  [[ $what == kill* || $what == cut2 ]] && survivors=(${survivors[@]/$victim/})
  for i in "${survivors[@]}"; do expect_exit $i 0; done
  if [[ $what == cut2 ]]; then
    expect_exit $victim 1
    grep -q "no round could be formed" "$out/$name.host$victim.log" || fail "the cut-off host did not say why it stopped"
    host_mend $victim
  fi
  [[ $what == kill* ]] && wait "${pids[$victim]}" 2>/dev/null
  grep -h "round [0-9]*:\|stopped the workers\|forming a new round\|resumed from\|in-process: group\|exited with\|left for" \
    "$out/$name".host*.log | sed 's/(on [^)]*)//' | sort | uniq -c
  if ((${#mode[@]})); then
    resumed=$(grep -ho "in-process: group 2 of [0-9]* ranks from step [0-9]*" "$out/$name".host*.log | head -1 | awk '{print $NF}')
  else
    resumed=$(grep -ho "resumed from step [0-9]*" "$out/$name".host*.log | tail -1 | awk '{print $4}')
  fi
  [[ -n $resumed ]] || fail "$name: the job did not go on in a new round"
  local got want
  got=$(sha_of "$out/$name".host*.log)
  [[ -n $got ]] || fail "$name: no fingerprint"
  want=$(reference "ref-$name" "$resumed" "${#survivors[@]}")
  [[ -n $want ]] || fail "$name: the reference run gave no fingerprint"
  [[ $got == "$want" ]] || fail "$name: parameters $got differ from the reference's $want (6 ranks to step $resumed, then $((2 * ${#survivors[@]})))"
  # The new round's first step, as the program stamped it.
  local t1
  t1=$(grep -ho "first step \(after resuming\|of group 2\) done at unix ms [0-9]*" "$out/$name".host*.log | head -1 | awk '{print $NF}')
  echo "PASSED $name: went on from step $resumed at $((2 * ${#survivors[@]})) ranks, its first step done $((t1 - t0 / 1000000)) ms after the event; parameters sha256 $got as the reference"
}

for s in "$@"; do scenario "$s"; done
for ns in "${HOST_NS[@]}"; do
  [[ -z $(ip netns pids "$ns") ]] || fail "processes left in $ns: $(ip netns pids "$ns" | tr '\n' ' ')"
done
# Every agent that exited (a killed host's did not) listed what its host's /dev/shm held then.
ls "$out"/*.shm > /dev/null 2>&1 || fail "no agent listed its host's /dev/shm"
for f in "$out"/*.shm; do
  [[ -s $f ]] && fail "chorus shared-memory segments left on ${f##*/}: $(tr '\n' ' ' <"$f")"
done
echo "PASSED: $*"
