#!/usr/bin/env bash
# descendants.sh FERRYRUN PROBE — processes forked by the ranks die with the job, even the
# orphans of a crashed rank, and ferryrun does not wait for them to close its pipes.
. "$(dirname "$0")/lib.sh"

run -n 3 --timeout 30 "$PROBE" spawn-child "$TMP/grandchildren"
expect_rc 139
expect_err '^ferryrun: rank 0 \(pid [0-9]+\) was killed by signal 11'
[ "$ELAPSED_MS" -lt 10000 ] || fail "took ${ELAPSED_MS} ms"
grandchildren=$(cat "$TMP/grandchildren")
[ "$(echo "$grandchildren" | wc -l)" -eq 3 ] || fail "expected 3 grandchild pids"
expect_gone $(probe_pids) $grandchildren

# After a successful job, background processes the ranks left are ended too; exit stays 0.
run -n 2 --timeout 30 sh -c 'sleep 600 & echo "rank $PMI_RANK pid $!"'
expect_rc 0 "leftover background process"
expect_err '^ferryrun: all ranks have exited; terminating the processes they left behind$'
[ "$ELAPSED_MS" -lt 5000 ] || fail "took ${ELAPSED_MS} ms"
expect_gone $(probe_pids)
echo "PASS: descendants"
