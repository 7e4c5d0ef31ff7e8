#!/usr/bin/env bash
# output.sh FERRYRUN PROBE — "[r] " prefixes on stdout and stderr, the unterminated last line
# flushed at EOF, and --no-prefix passing output through untouched.
. "$(dirname "$0")/lib.sh"

run -n 2 "$PROBE" output
expect_rc 0
for r in 0 1; do
  expect_out "^\[$r\] out line 1$"
  expect_out "^\[$r\] out line 2$"
  expect_out "^\[$r\] unterminated$"
  expect_err "^\[$r\] err line 1$"
done
grep -q 'err line' "$TMP/out" && fail "stderr lines ended up on stdout"
grep -q 'out line' "$TMP/err" && fail "stdout lines ended up on stderr"
# Rank-local order survives the interleaving of ranks.
for r in 0 1; do
  order=$(grep "^\[$r\] " "$TMP/out" | sed "s/^\[$r\] //" | tr '\n' '|')
  [ "$order" = "out line 1|out line 2|unterminated|" ] || fail "rank $r stdout order: $order"
done

run -n 2 --no-prefix "$PROBE" output
expect_rc 0
# Untouched means unterminated output runs into whatever comes next.
[ "$(grep -c 'out line 1$' "$TMP/out")" -eq 2 ] || fail "--no-prefix: expected 2 bare 'out line 1'"
grep -q '^\[' "$TMP/out" && fail "--no-prefix still prefixed stdout"
[ "$(grep -c '^err line 1$' "$TMP/err")" -eq 2 ] || fail "--no-prefix: expected 2 bare stderr lines"

# The later of --prefix / --no-prefix wins.
run -n 1 --no-prefix --prefix "$PROBE" output
expect_out '^\[0\] out line 1$'
echo "PASS: output forwarding"
