#!/usr/bin/env bash
# killed_rank_shm.sh FERRYRUN BENCH — ferry's shared-memory segments never outlive a job:
#  - once the runtime is up, every rank's segment is already gone from /dev/shm (unlinked as
#    soon as every peer mapped it), so a rank killed later leaves nothing;
#  - a segment a rank could not unlink (killed during start-up: stood for here by a file of
#    that name) is removed by ferryrun when the job ends.
set -u
ferryrun=$1 bench=$2
tmp=$(mktemp -d)
decoy=""
cleanup() { [ -n "${job:-}" ] && kill -9 "$job" 2>/dev/null; rm -rf "$tmp"; [ -n "$decoy" ] && rm -f "$decoy"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

FERRY_TRANSPORT=shm "$ferryrun" -n 2 --timeout 60 -- "$bench" pingpong --size 8 --iters 100000000 >"$tmp/out" 2>&1 &
job=$!
ranks=""
for _ in $(seq 1 200); do
  ranks=$(pgrep -P "$job" -f "$bench" | tr '\n' ' ')
  [ "$(echo $ranks | wc -w)" -eq 2 ] && grep -q . /proc/$(echo $ranks | cut -d' ' -f1)/maps 2>/dev/null && break
  sleep 0.05
done
[ "$(echo $ranks | wc -w)" -eq 2 ] || fail "the 2 ranks did not start: $(cat "$tmp/out")"
# Wait until both ranks have mapped their peers' segments (ferry-<pid>-... in their maps).
for _ in $(seq 1 200); do
  n=0
  for p in $ranks; do grep -q "/dev/shm/ferry-" /proc/$p/maps 2>/dev/null && n=$((n + 1)); done
  [ "$n" -eq 2 ] && break
  sleep 0.05
done
[ "$n" -eq 2 ] || fail "the ranks never mapped a ferry segment"
sleep 0.5
for p in $ranks; do
  ls /dev/shm | grep -q "^ferry-$p-" && fail "rank pid $p's segment is still linked while the job runs"
done
first=$(echo $ranks | cut -d' ' -f1)
decoy=/dev/shm/ferry-$first-7-deadbeef
: >"$decoy"
kill -9 "$first"
wait "$job"
rc=$?
job=""
[ "$rc" -ne 0 ] || fail "the job survived a killed rank"
for p in $ranks; do
  ls /dev/shm | grep "^ferry-$p-" && fail "a segment of rank pid $p is left in /dev/shm"
done
decoy=""
echo "ok: no ferry segment outlived the job (rc $rc)"
