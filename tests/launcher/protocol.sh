#!/usr/bin/env bash
# protocol.sh FERRYRUN PROBE — the PMI-1 server's edge cases: split and batched requests,
# error replies, limits, the process mapping.
. "$(dirname "$0")/lib.sh"

run -n 3 --timeout 30 "$PROBE" protocol
expect_rc 0
for r in 0 1 2; do expect_out "^\[$r\] rank $r protocol ok$"; done
echo "PASS: protocol"
