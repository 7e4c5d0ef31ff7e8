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
pgrep -f "^$prog" >/dev/null && { echo "FAIL: a rank is still running"; exit 1; }
echo "ok: the job ended in $((SECONDS - start)) s with rank 1's exit code"
