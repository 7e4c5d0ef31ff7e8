#!/usr/bin/env bash
# killed_rank_ucx.sh FERRYRUN BENCH PYTHON — UCX's shared-memory segments never outlive a job
# whose rank was killed. UCX (in its default mode) unlinks a POSIX segment soon after creating it
# and marks a System V segment for removal once attached; a rank killed in between leaves the
# segment for good, named by no pid. Stood for here by:
#  - a "ucx_shm_posix_" file made while a UCX job runs and held by nobody: removed by ferryrun
#    once a SIGKILLed rank ends the job; one held open by another process, one made before the
#    job started, one made during a job whose ranks all exit cleanly, and one left under
#    --keep-ucx-segments stay;
#  - a System V segment that a rank creates and never attaches before it SIGKILLs itself: removed;
#    one that another process created meanwhile stays.
set -u
. "$(dirname "$0")/rank_cleanup.sh"
ferryrun=$1 bench=$2 python=$3
tmp=$(mktemp -d)
tag="ferrytest_$$_"
held_pid="" job="" other_id=""
cleanup() {
  [ -n "$job" ] && kill -9 "$job" 2>/dev/null
  [ -n "$held_pid" ] && kill -9 "$held_pid" 2>/dev/null
  [ -n "$other_id" ] && ipcrm -m "$other_id" 2>/dev/null
  rm -f /dev/shm/ucx_shm_posix_"$tag"*
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/out" ] && cat "$tmp/out"; exit 1; }
segment_exists() { awk -v id="$1" 'NR > 1 && $2 == id { found = 1 } END { exit !found }' /proc/sysvipc/shm; }

# Waits until the job's two ranks run and have mapped UCX's shared memory; prints their pids.
ranks_of() {
  local ranks n p
  ranks=$(children_of "$1" "$bench" 2)
  for _ in $(seq 1 300); do
    n=0
    for p in $ranks; do grep -q "ucx_shm_posix\|SYSV" /proc/$p/maps 2>/dev/null && n=$((n + 1)); done
    [ "$n" -eq 2 ] && break
    sleep 0.05
  done
  [ "$n" -eq 2 ] || fail "the 2 ranks did not start over UCX"
  echo "$ranks"
}

old=/dev/shm/ucx_shm_posix_${tag}old
: >"$old"
sleep 1.1  # its change time is now before the jobs' start (whole seconds)

# 1. A clean job: nothing of UCX's is swept, not even a stray file made during it.
FERRY_TRANSPORT=ucx "$ferryrun" -n 2 --timeout 60 -- "$bench" pingpong --size 8 --iters 1500000 >"$tmp/out" 2>&1 &
job=$!
ranks_of "$job" >/dev/null
stray=/dev/shm/ucx_shm_posix_${tag}stray
: >"$stray"
wait "$job" || fail "the clean job failed"
job=""
[ -e "$stray" ] || fail "ferryrun removed a UCX file after a job whose ranks exited cleanly"
rm -f "$stray"

# 2. A rank SIGKILLed over UCX.
FERRY_TRANSPORT=ucx "$ferryrun" -n 2 --timeout 60 -- "$bench" pingpong --size 8 --iters 100000000 >"$tmp/out" 2>&1 &
job=$!
ranks=$(ranks_of "$job")
left=/dev/shm/ucx_shm_posix_${tag}left
held=/dev/shm/ucx_shm_posix_${tag}held
: >"$left"
sleep 60 9<>"$held" &
held_pid=$!
first=$(echo $ranks | cut -d' ' -f1)
kill -9 "$first"
wait "$job"
rc=$?
job=""
[ "$rc" -ne 0 ] || fail "the job survived a killed rank"
[ -e "$left" ] && fail "$left (held by nobody, made during the job) outlived the job"
grep -q "removed $left: a segment of UCX's" "$tmp/out" || fail "ferryrun did not say it removed $left"
[ -e "$held" ] || fail "ferryrun removed $held, which another process holds open"
[ -e "$old" ] || fail "ferryrun removed $old, made before the job started"
for p in $ranks; do
  ls /dev/shm | grep -q "^ferry-$p-" && fail "a ferry segment of rank pid $p is left in /dev/shm"
done

# 3. --keep-ucx-segments: a file a killed rank made stays.
kept=/dev/shm/ucx_shm_posix_${tag}kept
"$ferryrun" --keep-ucx-segments -n 1 --timeout 30 -- /bin/sh -c ": > $kept; kill -9 \$\$" >"$tmp/out" 2>&1
[ -e "$kept" ] || fail "ferryrun --keep-ucx-segments removed $kept"
rm -f "$kept"

# 4. A System V segment a rank created and left unattached when it was killed; another
# process's segment made meanwhile stays. (With kernel.shm_rmid_forced=1 the kernel removes an
# unattached segment when its creator ends: there is nothing to leave behind.)
if [ "$(cat /proc/sys/kernel/shm_rmid_forced 2>/dev/null)" = 1 ]; then
  echo "ok: the killed rank's POSIX stand-in was removed, the others kept (System V part skipped: shm_rmid_forced=1)"
  exit 0
fi
other_id=$("$python" -c 'import ctypes; print(ctypes.CDLL(None).shmget(0, 4096, 0o1600))')
[ "${other_id:--1}" -ge 0 ] || fail "could not create the test's own System V segment"
"$ferryrun" -n 1 --timeout 30 -- "$python" -c '
import ctypes, os, signal
print("segment", ctypes.CDLL(None).shmget(0, 4096, 0o1600), flush=True)
os.kill(os.getpid(), signal.SIGKILL)' >"$tmp/out" 2>&1
rc=$?
[ "$rc" -ne 0 ] || fail "the self-killing rank's job exited 0"
id=$(sed -n 's/.*segment \([0-9-]*\).*/\1/p' "$tmp/out" | head -1)
[ -n "$id" ] && [ "$id" -ge 0 ] || fail "the rank did not create a System V segment"
segment_exists "$id" && { ipcrm -m "$id" 2>/dev/null; fail "the killed rank's System V segment $id outlived the job"; }
grep -q "removed System V segment $id: rank pid" "$tmp/out" || fail "ferryrun did not say it removed segment $id"
segment_exists "$other_id" || fail "ferryrun removed System V segment $other_id, which no rank created"
echo "ok: the killed ranks' UCX segments were removed, the others kept"
