#!/usr/bin/env bash
# passthrough.sh FERRYRUN PROBE — options after the program belong to the program, and the
# ranks see ferryrun's PMI environment, not an outer launcher's.
. "$(dirname "$0")/lib.sh"

run -n 1 "$PROBE" args --size 8 -n 3 --timeout 1 -- --no-prefix
expect_rc 0
[ "$(sed 's/^\[0\] //' "$TMP/out" | tr '\n' '|')" = \
  "arg 1: --size|arg 2: 8|arg 3: -n|arg 4: 3|arg 5: --timeout|arg 6: 1|arg 7: --|arg 8: --no-prefix|" ] ||
  fail "program arguments were altered"

run -n 1 -- "$PROBE" args -n 3
expect_rc 0 "-- before the program"
expect_out '^\[0\] arg 1: -n$'

PMIX_RANK=7 PMIX_NAMESPACE=outer PMI_PORT=host:1234 PMI_RANK=9 run -n 2 "$PROBE" env
expect_rc 0
for r in 0 1; do
  expect_out "^\[$r\] PMI_RANK=$r$"
  expect_out "^\[$r\] PMI_SIZE=2$"
  expect_out "^\[$r\] PMI_FD=[0-9]+$"
  expect_out "^\[$r\] FERRY_LAUNCHER=ferryrun$"
  expect_out "^\[$r\] PMIX_RANK=<unset>$"
  expect_out "^\[$r\] PMIX_NAMESPACE=<unset>$"
  expect_out "^\[$r\] PMI_PORT=<unset>$"
done
echo "PASS: passthrough"
