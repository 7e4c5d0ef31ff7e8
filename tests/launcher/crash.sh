#!/usr/bin/env bash
# crash.sh FERRYRUN PROBE — a rank killed by SIGSEGV: exit 139, the rank and signal named,
# every rank gone and the /dev/shm segments of all ranks removed.
. "$(dirname "$0")/lib.sh"

# Someone else's segment must survive the cleanup.
decoy=/dev/shm/ferryrun-test-decoy-$$
touch "$decoy" || fail "cannot create $decoy"
trap 'rm -rf "$TMP" "$decoy"' EXIT

run -n 4 --timeout 30 "$PROBE" crash 1
expect_rc 139
expect_err '^ferryrun: rank 1 \(pid [0-9]+\) was killed by signal 11 \(Segmentation fault\)$'
expect_err '^ferryrun: terminating the other 3 ranks$'
[ "$ELAPSED_MS" -lt 10000 ] || fail "took ${ELAPSED_MS} ms"
pids=$(probe_pids)
[ "$(echo "$pids" | wc -l)" -eq 4 ] || fail "expected 4 pids"
expect_gone $pids
expect_no_shm $pids
[ -e "$decoy" ] || fail "ferryrun removed an unrelated /dev/shm entry"
echo "PASS: crash"
