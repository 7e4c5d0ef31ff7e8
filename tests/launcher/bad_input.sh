#!/usr/bin/env bash
# bad_input.sh FERRYRUN PROBE — malformed command lines exit 2 and the message names the
# offending argument and value.
. "$(dirname "$0")/lib.sh"

# Each case: expected stderr regex, then the arguments.
check() {
  local want=$1
  shift
  run "$@"
  expect_rc 2 "ferryrun $*"
  expect_err "$want"
  [ -s "$TMP/out" ] && fail "ferryrun $*: wrote to stdout"
  return 0
}
check "invalid value for -n: '0'" -n 0 "$PROBE" ok
check "invalid value for -n: '-3'" -n -3 "$PROBE" ok
check "invalid value for -n: 'abc'" -n abc "$PROBE" ok
check "invalid value for -n: '2.5'" -n 2.5 "$PROBE" ok
check "invalid value for -n: '99999999999'" -n 99999999999 "$PROBE" ok
check "missing -n" "$PROBE" ok
check "-n|np" -n
check "missing PROGRAM" -n 2
check "missing PROGRAM" -n 2 --
check "invalid value for --timeout: '-1'" -n 2 --timeout -1 "$PROBE" ok
check "invalid value for --timeout: 'soon'" -n 2 --timeout soon "$PROBE" ok
check "unknown option '--bogus'" --bogus -n 2 "$PROBE" ok
check "unknown option '-x'" -n 2 -x "$PROBE" ok
FERRY_TIMEOUT=abc check "invalid value for FERRY_TIMEOUT: 'abc'" -n 1 "$PROBE" ok

run --help
expect_rc 0 "--help"
expect_out '^Usage: ferryrun -n N'
expect_out 'FERRY_TIMEOUT'
echo "PASS: bad input"
