#!/usr/bin/env bash
# ferryrun must end the job when rank 1 dies: exit code 3, rank 1 named, no rank left running.
set -u
ferryrun=$1 prog=$2
start=$SECONDS
out=$("$ferryrun" -n 2 --timeout 50 "$prog" 2>&1)
rc=$?
echo "$out"
[ "$rc" = 3 ] || { echo "FAIL: expected exit code 3 (rank 1's), got $rc"; exit 1; }
grep -q "rank 1 (pid [0-9]*) exited with code 3" <<<"$out" || { echo "FAIL: rank 1 not named"; exit 1; }
(( SECONDS - start < 30 )) || { echo "FAIL: took $((SECONDS - start)) s"; exit 1; }
# This job's own ranks, by the pids they printed (other jobs may run the same program).
pids=$(sed -n 's/.*rank [0-9]* pid \([0-9]*\)$/\1/p' <<<"$out")
[ "$(wc -w <<<"$pids")" = 2 ] || { echo "FAIL: expected two ranks to print their pids, got: $pids"; exit 1; }
for pid in $pids; do
  kill -0 "$pid" 2>/dev/null && { echo "FAIL: rank pid $pid is still running"; kill -9 "$pid"; exit 1; }
done
echo "ok: the job ended in $((SECONDS - start)) s with rank 1's exit code"
