#!/usr/bin/env bash
# exit_code.sh FERRYRUN PROBE — a rank's non-zero exit code (or PMI abort code) becomes
# ferryrun's, the failing rank is named, and the others are terminated promptly.
. "$(dirname "$0")/lib.sh"

run -n 3 --timeout 30 "$PROBE" exit 2 3
expect_rc 3
expect_err '^ferryrun: rank 2 \(pid [0-9]+\) exited with code 3$'
expect_err '^ferryrun: terminating the other 2 ranks$'
[ "$ELAPSED_MS" -lt 10000 ] || fail "took ${ELAPSED_MS} ms; the sleeping ranks were not terminated"
pids=$(probe_pids)
expect_gone $pids

run -n 2 --timeout 30 "$PROBE" exit 0 42
expect_rc 42
expect_err '^ferryrun: rank 0 \(pid [0-9]+\) exited with code 42$'
expect_err '^ferryrun: terminating the other 1 rank$'

run -n 3 --timeout 30 "$PROBE" abort 1 5
expect_rc 5
expect_err '^ferryrun: rank 1 \(pid [0-9]+\) called PMI abort with code 5: probe gave up$'
expect_err '^ferryrun: terminating the other 2 ranks$'
pids=$(probe_pids)
expect_gone $pids

# A rank leaving early with 0 (no finalize) is not a failure.
run -n 3 --timeout 30 "$PROBE" early-exit
expect_rc 0
expect_out '^\[1\] rank 1 done$'
expect_out '^\[2\] rank 2 done$'
echo "PASS: exit codes"
