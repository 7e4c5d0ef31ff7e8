#!/usr/bin/env bash
# not_found.sh FERRYRUN PROBE — a program that cannot be executed is reported once, exit 127
# (not found) or 126 (not executable).
. "$(dirname "$0")/lib.sh"

run -n 2 ferry-no-such-program-here --flag
expect_rc 127
expect_err "^ferryrun: cannot execute 'ferry-no-such-program-here': No such file or directory$"
[ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "expected exactly one error line"

run -n 2 "$TMP/missing/prog"
expect_rc 127

printf 'not a program\n' >"$TMP/plain"
chmod 644 "$TMP/plain"
run -n 2 "$TMP/plain"
expect_rc 126
expect_err "cannot execute '$TMP/plain': Permission denied"

# PATH lookup works like execvp.
mkdir "$TMP/bin"
cp "$PROBE" "$TMP/bin/probe-on-path"
PATH="$TMP/bin:$PATH" run -n 2 probe-on-path ok
expect_rc 0 "program found through PATH"
expect_out '^\[1\] rank 1 of 2 ok$'
echo "PASS: not found"
