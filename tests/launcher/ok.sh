#!/usr/bin/env bash
# ok.sh FERRYRUN PROBE N — a healthy job of N ranks: exit 0, every rank reports, nothing left.
. "$(dirname "$0")/lib.sh"
n=$1

run -n "$n" "$PROBE" ok
expect_rc 0
for r in $(seq 0 $((n - 1))); do
  expect_out "^\[$r\] rank $r of $n ok$"
done
[ "$(grep -c ' ok$' "$TMP/out")" -eq "$n" ] || fail "expected exactly $n 'ok' lines"
[ -s "$TMP/err" ] && fail "a healthy job wrote to stderr"
pids=$(probe_pids)
[ "$(echo "$pids" | wc -l)" -eq "$n" ] || fail "expected $n pids"
expect_gone $pids
expect_no_shm $pids
echo "PASS: $n ranks"
