#!/usr/bin/env bash
# exit_and_json.sh CMD ARGS... — a benchmark smoke test passes only if the program exits 0
# and prints its JSON record (a line naming "bench").
out=$("$@" 2>&1)
rc=$?
echo "$out"
[ "$rc" = 0 ] || { echo "FAIL: exit code $rc"; exit 1; }
grep -q '"bench"' <<<"$out" || { echo "FAIL: no JSON record (\"bench\") in the output"; exit 1; }
