#!/usr/bin/env bash
# rank_exit.sh MPIEXEC TEST_SP_FAULTS - a rank that exits inside
# sdpa_mpi_forward (exit code 3, and 0 without MPI_Finalize) while the
# others wait on its messages: Open MPI's mpirun must end the whole job, in
# bounded time, with a non-zero status and a message naming the rank; no
# other rank may return from the call. Run by CTest with 3 ranks.
set -u
mpiexec=$1 test=$2
failed=0
for code in 3 0; do
  start=$(date +%s)
  out=$(timeout 60 "$mpiexec" -n 3 "$test" --exit-rank 1 "$code" 2>&1)
  rc=$? secs=$(( $(date +%s) - start ))
  why=""
  [ "$rc" -eq 124 ] && why="still running after 60 s (a rank left waiting)"
  [ -z "$why" ] && [ "$rc" -eq 0 ] && why="mpirun returned 0"
  [ -z "$why" ] && ! grep -q "rank 1: exiting with $code" <<<"$out" && why="rank 1 never exited"
  [ -z "$why" ] && grep -q "sdpa_mpi_forward returned" <<<"$out" && why="a rank returned from the call"
  [ -z "$why" ] && ! grep -Eq "process rank 1|\[\[[0-9]+,1\],1\]" <<<"$out" && why="no message names rank 1"
  if [ -n "$why" ]; then
    echo "FAIL exit code $code: $why (mpirun status $rc after ${secs} s)"
    echo "$out" | tail -20
    failed=$((failed + 1))
  else
    echo "exit code $code: mpirun ended the job in ${secs} s with status $rc, naming rank 1"
  fi
done
echo "$((2 - failed)) passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
