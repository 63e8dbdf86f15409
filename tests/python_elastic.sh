#!/usr/bin/env bash
# chorus_torch under elastic launchers: two single-worker agents (torchrun --nnodes 1:2 with its
# c10d rendezvous, then chorusrun --nnodes 1:2) run python/tests/elastic_ddp.py, a torch DDP job
# on backend "chorus" that checkpoints every step; one agent is killed with its worker mid-run.
# The other's launcher restarts its worker at world 1, where init_process_group("chorus") must
# work again (no stale segment, store key or port) and the job resume from the checkpoint and
# finish. No worker process or chorus /dev/shm segment may be left.
# Usage: tests/python_elastic.sh PYTHON CHORUSRUN
set -uo pipefail
python=$1 chorusrun=$2
here=$(cd "$(dirname "$0")" && pwd)
script=$here/../python/tests/elastic_ddp.py
torchrun=$(dirname "$python")/torchrun
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
fail() {
  echo "FAILED: $*"
  for f in "$work"/*.log; do echo "--- $f"; cat "$f"; done
  exit 1
}
port() { echo $((20000 + RANDOM % 12000)); }
# Every process below pid, and pid: as if its machine died (torchrun starts its workers in
# sessions of their own, and they outlive a killed agent).
kill_tree() {
  local child
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill -9 "$1" 2>/dev/null
}

run_case() {
  local name=$1
  shift
  local pids=() i
  # Agent 0 first: under torchrun it hosts the c10d store (torchrun_agent says so), whose loss
  # would end the job (pytorch/pytorch#67742), so agent 1 is the one killed.
  for i in 0 1; do
    AGENT=$i "$@" "$script" "$work/$name.pt" 300 >"$work/$name.$i.log" 2>&1 &
    pids[i]=$!
    sleep 1
  done
  # (a bound, not a time limit: on a loaded machine torch's import alone takes seconds)
  for _ in $(seq 2400); do [[ -e $work/$name.pt ]] && break; sleep 0.05; done
  [[ -e $work/$name.pt ]] || fail "$name: no checkpoint was written"
  sleep 0.5
  echo "$name: killing agent 1 and its worker"
  kill -STOP "${pids[1]}"  # no agent left to restart what dies
  kill_tree "${pids[1]}"
  timeout 120 tail --pid="${pids[0]}" -f /dev/null || { kill_tree "${pids[0]}"; fail "$name: the surviving agent did not finish within 2 minutes"; }
  wait "${pids[0]}" || fail "$name: the surviving agent exited with $?"
  wait "${pids[1]}" 2>/dev/null
  grep -q "resumed from step [0-9]* at world 1" "$work/$name.0.log" || fail "$name: no resume at world 1"
  grep -q "done, 300 steps, at world 1" "$work/$name.0.log" || fail "$name: the job did not finish at world 1"
  echo "PASSED $name: $(grep -o 'resumed from step [0-9]* at world 1' "$work/$name.0.log")"
}

# torchrun agent $AGENT: agent 0 hosts the c10d store. Left to itself, whichever agent binds the
# endpoint first would (on a loaded machine, not always agent 0). Each round's workers get a store
# of their own: with torchrun's shared one, a second round (agent 1 arriving after agent 0 formed
# a round alone, as on a loaded machine) waits forever on the first round's keys
# (pytorch/pytorch#135712; CI saw it as "no checkpoint was written").
torchrun_agent() {
  local host=false
  ((AGENT == 0)) && host=true
  TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "$torchrun" --nnodes 1:2 --nproc-per-node 1 --max-restarts 3 --rdzv-backend c10d \
    --rdzv-endpoint 127.0.0.1:$p --rdzv-id py-elastic --rdzv-conf last_call_timeout=1,join_timeout=60,is_host=$host \
    --monitor-interval 0.1 "$@"
}
p=$(port)
run_case torchrun torchrun_agent
p=$(port)
run_case chorusrun "$chorusrun" --nnodes 1:2 --nproc-per-node 1 --max-restarts 3 --rdzv-endpoint 127.0.0.1:$p \
  --rdzv-id py-elastic --rdzv-conf last_call_timeout=1,join_timeout=60 "$python"
left=$(ps -eo args | grep -c "[e]lastic_ddp.py" || true)
((left == 0)) || fail "$left worker process(es) left"
echo "PASSED"
