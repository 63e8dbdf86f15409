#!/usr/bin/env bash
# The main job survives a killed rank without losing a step: examples/train_ddp under
# `chorusrun --max-restarts 1` checkpoints every N steps; a random rank is killed with SIGKILL at a
# random moment after the first checkpoint; chorusrun restarts the group, the job resumes from the
# last checkpoint and must end with the same parameters (sha256) as an uninterrupted run.
# Usage: tests/train_resume.sh CHORUSRUN TRAIN_DDP [ddp|fsdp]
set -uo pipefail
chorusrun=$1 train=$2 strategy=${3:-ddp}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
args=(--epochs 2 --train-size 60000 --test-size 1200 --batch 64 --strategy "$strategy")
fail() { echo "FAILED: $*"; exit 1; }
sha_of() { grep -o "parameters sha256 [0-9a-f]*" "$1" | awk '{print $3}'; }

echo "== uninterrupted run ($strategy, 3 ranks)"
timeout 300 "$chorusrun" --nproc-per-node 3 --master-port 0 "$train" "${args[@]}" --out "$work/ref" >"$work/ref.log" 2>&1 ||
  { cat "$work/ref.log"; fail "the uninterrupted run failed"; }
want=$(sha_of "$work/ref.log")
[[ -n $want ]] || { cat "$work/ref.log"; fail "no fingerprint in the uninterrupted run"; }

echo "== run with checkpoints every 40 steps, a rank killed after the first"
timeout 300 "$chorusrun" --nproc-per-node 3 --master-port 0 --max-restarts 1 "$train" "${args[@]}" \
  --checkpoint-every 40 --out "$work/run" >"$work/run.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "checkpoint: step" "$work/run.log" && break; sleep 0.05; done
grep -q "checkpoint: step" "$work/run.log" || { kill $job; cat "$work/run.log"; fail "no checkpoint was written"; }
sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
launcher=$(pgrep -P $job)  # timeout's child: chorusrun, whose children are the ranks
mapfile -t ranks < <(pgrep -P "$launcher")
[[ ${#ranks[@]} -eq 3 ]] || { wait $job; cat "$work/run.log"; fail "expected 3 ranks under chorusrun, found ${#ranks[@]} (finished too early?)"; }
victim=${ranks[$((RANDOM % 3))]}
echo "killing pid $victim with SIGKILL"
kill -9 "$victim"
wait $job
code=$?
grep -v "epoch [0-9]/" "$work/run.log"
[[ $code -eq 0 ]] || fail "the job exited with $code"
grep -q "resumed from step" "$work/run.log" || fail "the restarted job did not resume"
got=$(sha_of "$work/run.log")
[[ "$got" == "$want" ]] || fail "parameters differ from the uninterrupted run: $got vs $want"
echo "PASSED: $(grep -o 'resumed from step [0-9]*' "$work/run.log"), parameters sha256 $got as uninterrupted"
