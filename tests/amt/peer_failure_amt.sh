#!/usr/bin/env bash
# peer_failure_amt.sh FERRYRUN PROG RANKS — the last rank SIGKILLs itself with AMT calls to it
# in flight (see peer_failure_amt.cpp); ferryrun --keep-going lets the survivors run on.
# Passes when ferryrun reports the victim's SIGKILL (exit 137), every survivor prints its
# verdict, and every rank's process is gone with no ferry segment left. The transport comes
# from the environment.
set -u
. "$(dirname "$0")/../mp/rank_cleanup.sh"
ferryrun=$1 prog=$2 ranks=$3
job_scratch

"$ferryrun" -n "$ranks" --keep-going --timeout 90 -- "$prog" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
pids=$(sed -n 's/.*rank [0-9]* pid \([0-9]*\)$/\1/p' "$tmp/out" | tr '\n' ' ')
[ "$rc" = 137 ] || fail "expected exit code 137 (the victim's SIGKILL), got $rc"
grep -q "exited with code" "$tmp/out" && fail "a survivor exited non-zero"
ok=$(grep -c "amt peer failure OK" "$tmp/out")
[ "$ok" = $((ranks - 1)) ] || fail "$ok of $((ranks - 1)) survivors passed"
[ "$(wc -w <<<"$pids")" = "$ranks" ] || fail "expected $ranks ranks to print their pids, got: $pids"
ranks_gone_and_clean "$pids"
pids=""
echo "ok: $((ranks - 1)) survivors' futures and finalize reported rank $((ranks - 1))'s failure"
