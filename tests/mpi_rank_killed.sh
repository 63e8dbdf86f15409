#!/usr/bin/env bash
# What a user sees when a rank of an mpirun job dies on the mpi backend: 3 ranks loop on
# all_reduce, rank 1 kills itself with SIGKILL. Open MPI has no fault tolerance: mpirun ends the
# whole job. The job must end within seconds (not hang until a timeout), fail, and the output
# must name rank 1 (chorus's PeerFailure, or mpirun's own report of the dead process).
# Usage: tests/mpi_rank_killed.sh GROUP_PROBE
set -uo pipefail
probe=$1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
CHORUS_BACKEND=mpi timeout 100 mpirun --allow-run-as-root --oversubscribe -np 3 -x CHORUS_BACKEND \
  "$probe" --hang --kill-rank 1 >"$log" 2>&1
code=$?
elapsed=$(($(date +%s) - start))
cat "$log"
echo "mpirun exited with $code after ${elapsed} s"
fail() { echo "FAILED: $*"; exit 1; }
[[ $code -ne 0 ]] || fail "the job succeeded although rank 1 died"
[[ $code -ne 124 ]] || fail "the job hung until the test's limit"
[[ $elapsed -le 60 ]] || fail "the job took ${elapsed} s to end"
grep -q "backend mpi" "$log" || fail "the group did not run on the mpi backend"
grep -Eq "rank 1[^0-9]|process rank 1 " "$log" || fail "no message names rank 1"
echo "PASSED: the job ended after ${elapsed} s, naming rank 1"
