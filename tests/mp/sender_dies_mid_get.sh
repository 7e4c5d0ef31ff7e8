#!/usr/bin/env bash
# sender_dies_mid_get.sh FERRYRUN PROG — rank 1 dies with rank 0's request for its data
# unanswered (see sender_dies_mid_get.cpp). Passes when ferryrun reports rank 1's SIGKILL (exit
# 137), rank 0 got the message back as failed and finalized, and both processes are gone with
# no segment left. The transport and the data path come from the environment.
set -u
. "$(dirname "$0")/rank_cleanup.sh"
ferryrun=$1 prog=$2
job_scratch
"$ferryrun" -n 2 --keep-going --timeout 60 -- "$prog" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
pids=$(sed -n 's/.*rank [0-9]* pid \([0-9]*\)$/\1/p' "$tmp/out" | tr '\n' ' ')
[ "$rc" = 137 ] || fail "expected exit code 137 (rank 1's SIGKILL), got $rc"
grep -q "rank 0: .*given up OK" "$tmp/out" || fail "rank 0 did not get the message back as failed"
grep -q "exited with code" "$tmp/out" && fail "rank 0 exited non-zero"
[ "$(wc -w <<<"$pids")" = 2 ] || fail "expected two ranks to print their pids, got: $pids"
ranks_gone_and_clean "$pids"
pids=""
echo "ok: the request to the dead sender was given up"
