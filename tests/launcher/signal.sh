#!/usr/bin/env bash
# signal.sh FERRYRUN PROBE — SIGINT, SIGTERM and SIGHUP to ferryrun end the job with
# 128+signal and leave no rank behind.
. "$(dirname "$0")/lib.sh"

for case in INT:130 TERM:143 HUP:129; do
  sig=${case%%:*}
  want=${case##*:}
  "$FERRYRUN" -n 3 --timeout 30 "$PROBE" hang >"$TMP/out" 2>"$TMP/err" &
  fr=$!
  wait_for_pids 3
  t0=$(now_ms)
  kill -"$sig" "$fr"
  wait "$fr"
  RC=$?
  elapsed=$(( $(now_ms) - t0 ))
  expect_rc "$want" "SIG$sig"
  expect_err "^ferryrun: caught SIG$sig; terminating 3 ranks$"
  [ "$elapsed" -lt 4000 ] || fail "SIG$sig: shutdown took ${elapsed} ms"
  pids=$(probe_pids)
  expect_gone $pids
done
echo "PASS: signals"
