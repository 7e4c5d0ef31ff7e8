#!/usr/bin/env bash
# killed_launcher.sh FERRYRUN BENCH — a ferryrun ended by SIGKILL (no handler of its own runs)
# leaves no rank running after 3 s and no ferry segment in /dev/shm: its ranks are busy in a
# ping-pong that would last minutes. The transport comes from the environment (FERRY_TRANSPORT).
set -u
. "$(dirname "$0")/rank_cleanup.sh"
ferryrun=$1 bench=$2
tmp=$(mktemp -d)
job="" ranks=""
cleanup() {
  [ -n "$job" ] && kill -9 "$job" 2>/dev/null
  for p in $ranks; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; cat "$tmp/out" 2>/dev/null; exit 1; }

"$ferryrun" -n 2 --timeout 60 -- "$bench" pingpong --size 8 --iters 1000000000 >"$tmp/out" 2>&1 &
job=$!
ranks=$(children_of "$job" "$bench" 2)
[ "$(wc -w <<<"$ranks")" -eq 2 ] || fail "the 2 ranks did not start"
# Past start-up: both ranks are in the ping-pong (their CPU time grows), not in the bootstrap.
sleep 1
for p in $ranks; do kill -0 "$p" 2>/dev/null || fail "rank pid $p ended before ferryrun was killed"; done

kill -9 "$job"
wait "$job" 2>/dev/null
job=""
killed=$SECONDS
left=$(still_running_after 3 "$ranks")
[ -z "$left" ] || fail "rank pid(s)$left still running 3 s after ferryrun was killed"
ranks_gone_and_clean "$ranks"
ranks=""
echo "ok: both ranks ended within $((SECONDS - killed)) s of ferryrun's SIGKILL; no segment left"
