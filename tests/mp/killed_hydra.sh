#!/usr/bin/env bash
# killed_hydra.sh MPIEXEC BENCH WHAT — MPICH's launcher ended by SIGKILL mid-ping-pong must leave
# no rank: WHAT=mpiexec kills mpiexec.hydra (its proxy sees the control connection close and
# ends the ranks); WHAT=proxy kills the hydra_pmi_proxy that forked the ranks, which nothing of
# MPICH's cleans up after, so ferry's ranks must end themselves when progress sees their parent
# gone (FERRY_LAUNCHER_WATCH; with it off they keep running). No rank may be left 3 s after the
# kill, nor any ferry segment. The ranks are found by pid, as children of this test's own proxy.
set -u
. "$(dirname "$0")/rank_cleanup.sh"
mpiexec=$1 bench=$2 what=$3
case "$what" in mpiexec | proxy) ;; *) echo "killed_hydra.sh: WHAT is mpiexec or proxy, not '$what'" >&2; exit 2 ;; esac
job_scratch
job="" proxy=""
trap '[ -n "$job" ] && kill -9 "$job" 2>/dev/null; [ -n "$proxy" ] && kill -9 "$proxy" 2>/dev/null
      for p in $pids; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT

FERRY_BOOTSTRAP=pmi1 "$mpiexec" -n 2 "$bench" pingpong --size 8 --iters 1000000000 >"$tmp/out" 2>&1 &
job=$!
proxy=$(children_of "$job" hydra_pmi_proxy 1)
proxy=${proxy%% *}
[ -n "$proxy" ] || fail "no hydra_pmi_proxy started under $mpiexec"
pids=$(children_of "$proxy" "$bench" 2)
[ "$(wc -w <<<"$pids")" -eq 2 ] || fail "the 2 ranks did not start under $mpiexec"
sleep 2  # past start-up: in the ping-pong
for p in $pids; do kill -0 "$p" 2>/dev/null || fail "rank pid $p ended before the launcher was killed"; done

if [ "$what" = mpiexec ]; then
  kill -9 "$job"
else
  kill -9 "$proxy"
fi
killed=$SECONDS
left=$(still_running_after 3 "$pids")
[ -z "$left" ] || fail "rank pid(s)$left still running 3 s after the $what was killed"
ranks_gone_and_clean "$pids"
pids=""
echo "ok: both ranks ended within $((SECONDS - killed)) s of the SIGKILL of the $what"
