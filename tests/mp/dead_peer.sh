#!/usr/bin/env bash
# ferryrun must end the job when rank 1 dies: rank 1 named with how it died (exit code 3, or
# SIGABRT with "abort"), the job's exit code its, no rank left running.
set -u
ferryrun=$1 prog=$2 mode=${3:-exit}
case "$mode" in
  exit) want_rc=3 want_line="rank 1 (pid [0-9]*) exited with code 3" ;;
  abort) want_rc=134 want_line="rank 1 (pid [0-9]*) was killed by signal 6 (Aborted)" ;;
  *) echo "dead_peer.sh: mode '$mode' is not one of: exit, abort" >&2; exit 2 ;;
esac
start=$SECONDS
if [ "$mode" = exit ]; then out=$("$ferryrun" -n 2 --timeout 50 "$prog" 2>&1); else out=$("$ferryrun" -n 2 --timeout 50 "$prog" "$mode" 2>&1); fi
rc=$?
echo "$out"
[ "$rc" = "$want_rc" ] || { echo "FAIL: expected exit code $want_rc (rank 1's), got $rc"; exit 1; }
grep -q "$want_line" <<<"$out" || { echo "FAIL: no line matching: $want_line"; exit 1; }
(( SECONDS - start < 30 )) || { echo "FAIL: took $((SECONDS - start)) s"; exit 1; }
# This job's own ranks, by the pids they printed (other jobs may run the same program).
pids=$(sed -n 's/.*rank [0-9]* pid \([0-9]*\)$/\1/p' <<<"$out")
[ "$(wc -w <<<"$pids")" = 2 ] || { echo "FAIL: expected two ranks to print their pids, got: $pids"; exit 1; }
for pid in $pids; do
  kill -0 "$pid" 2>/dev/null && { echo "FAIL: rank pid $pid is still running"; kill -9 "$pid"; exit 1; }
done
echo "ok: the job ended in $((SECONDS - start)) s with rank 1's $mode"
