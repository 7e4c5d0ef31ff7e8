#!/usr/bin/env bash
# killed_mpirun.sh MPIRUN BENCH — Open MPI's mpirun ended by SIGKILL leaves its ranks running;
# ferry's ranks end themselves when progress sees their parent gone (FERRY_LAUNCHER_WATCH):
# none may be left 3 s after the kill, nor any ferry segment. Ranks are found as children of
# this test's own mpirun, by pid.
set -u
. "$(dirname "$0")/rank_cleanup.sh"
mpirun=$1 bench=$2
tmp=$(mktemp -d)
job="" ranks=""
cleanup() {
  [ -n "$job" ] && kill -9 "$job" 2>/dev/null
  for p in $ranks; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; cat "$tmp/out" 2>/dev/null; exit 1; }

OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 FERRY_BOOTSTRAP=pmix \
  "$mpirun" --oversubscribe -n 2 "$bench" pingpong --size 8 --iters 1000000000 >"$tmp/out" 2>&1 &
job=$!
ranks=$(children_of "$job" "$bench" 2)
[ "$(wc -w <<<"$ranks")" -eq 2 ] || fail "the 2 ranks did not start"
sleep 2  # past start-up: in the ping-pong
for p in $ranks; do kill -0 "$p" 2>/dev/null || fail "rank pid $p ended before mpirun was killed"; done

kill -9 "$job"
wait "$job" 2>/dev/null
job=""
killed=$SECONDS
left=$(still_running_after 3 "$ranks")
[ -z "$left" ] || fail "rank pid(s)$left still running 3 s after mpirun was killed"
ranks_gone_and_clean "$ranks"
ranks=""
echo "ok: both ranks ended within $((SECONDS - killed)) s of mpirun's SIGKILL"
