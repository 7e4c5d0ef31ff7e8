#!/usr/bin/env bash
# timeout.sh FERRYRUN PROBE — --timeout and FERRY_TIMEOUT end a hung job with exit 124 in
# bounded time, and a rank ignoring SIGTERM is SIGKILLed after the grace period.
. "$(dirname "$0")/lib.sh"

run -n 2 --timeout 1 "$PROBE" hang
expect_rc 124
expect_err '^ferryrun: timeout after 1 s; terminating 2 ranks$'
[ "$ELAPSED_MS" -ge 900 ] || fail "timed out too early (${ELAPSED_MS} ms)"
[ "$ELAPSED_MS" -lt 4000 ] || fail "timeout took ${ELAPSED_MS} ms"
pids=$(probe_pids)
expect_gone $pids

FERRY_TIMEOUT=0.5 run -n 2 "$PROBE" hang
expect_rc 124 "FERRY_TIMEOUT"
expect_err '^ferryrun: timeout after 0.5 s; terminating 2 ranks$'
[ "$ELAPSED_MS" -lt 4000 ] || fail "FERRY_TIMEOUT took ${ELAPSED_MS} ms"

# The command line beats the environment.
FERRY_TIMEOUT=100 run -n 1 --timeout 0.3 "$PROBE" hang
expect_rc 124 "--timeout over FERRY_TIMEOUT"

# SIGTERM ignored: SIGKILL follows 2 s later.
run -n 2 --timeout 0.5 "$PROBE" stubborn
expect_rc 124 "stubborn ranks"
[ "$ELAPSED_MS" -ge 2300 ] || fail "SIGKILL came before the grace period (${ELAPSED_MS} ms)"
[ "$ELAPSED_MS" -lt 6000 ] || fail "stubborn ranks took ${ELAPSED_MS} ms to kill"
pids=$(probe_pids)
expect_gone $pids
echo "PASS: timeout"
