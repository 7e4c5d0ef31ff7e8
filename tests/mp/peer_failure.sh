#!/usr/bin/env bash
# peer_failure.sh FERRYRUN PROG RANKS THREADS — the last rank SIGKILLs itself mid-flood (see
# peer_failure.cpp); ferryrun --keep-going lets the survivors run on. Passes when ferryrun
# reports the victim's SIGKILL (exit 137), every survivor prints its verdict, every rank's
# process is gone and none left a segment behind. The transport comes from the environment.
set -u
. "$(dirname "$0")/rank_cleanup.sh"
ferryrun=$1 prog=$2 ranks=$3 threads=$4
job_scratch

start=$SECONDS
FERRY_TEST_STAMP="$tmp/stamp" "$ferryrun" -n "$ranks" --keep-going --timeout 90 -- "$prog" "$threads" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
pids=$(sed -n 's/.*rank [0-9]* pid \([0-9]*\)$/\1/p' "$tmp/out" | tr '\n' ' ')
[ "$rc" = 137 ] || fail "expected exit code 137 (the victim's SIGKILL), got $rc"
victim=$((ranks - 1))
grep -q "rank $victim (pid [0-9]*) was killed by signal 9" "$tmp/out" || fail "ferryrun did not name rank $victim"
grep -q "exited with code" "$tmp/out" && fail "a survivor exited non-zero"
ok=$(grep -c "peer failure OK" "$tmp/out")
[ "$ok" = $((ranks - 1)) ] || fail "$ok of $((ranks - 1)) survivors passed"
[ "$(wc -w <<<"$pids")" = "$ranks" ] || fail "expected $ranks ranks to print their pids, got: $pids"
ranks_gone_and_clean "$pids"
pids=""
echo "ok: $((ranks - 1)) survivors reported rank $victim's failure; job took $((SECONDS - start)) s"
