# rank_cleanup.sh — sourced by the multi-process test scripts that kill ranks.
#
# job_scratch: makes $tmp (a scratch directory, its job output in $tmp/out) and $pids (rank
# pids, SIGKILLed on exit if still set), both cleaned up on every exit path; and fail MESSAGE,
# which prints the message and the job's output and exits 1.
job_scratch() {
  tmp=$(mktemp -d)
  pids=""
  trap 'for p in $pids; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
}
fail() { echo "FAIL: $*"; cat "$tmp/out"; exit 1; }
#
# ranks_gone_and_clean PIDS: fails (via the caller's `fail`) when a rank pid is still running
# or left a ferry segment in /dev/shm. libfabric's shm provider keeps its region
# ("<pid>:<n>:<n>") until its endpoint closes, which a SIGKILLed process never does: a known
# limit of that provider, not of ferry's segments; the test removes its own ranks' regions,
# by pid, and says so.
ranks_gone_and_clean() {
  local p f
  for p in $1; do
    kill -0 "$p" 2>/dev/null && fail "rank pid $p is still running"
    ls /dev/shm | grep -q "^ferry-$p-" && fail "a segment of rank pid $p is left in /dev/shm"
    for f in /dev/shm/"$p":*; do
      [ -e "$f" ] || continue
      echo "note: removing libfabric's region $f of the killed rank pid $p"
      rm -f "$f"
    done
  done
  return 0
}
#
# still_running_after SECONDS PIDS: waits up to SECONDS for every pid to end; prints those still
# running then (nothing when all ended).
still_running_after() {
  local p left i
  for ((i = 0; i < $1 * 10; i++)); do
    left=""
    for p in $2; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  echo "$left"
}
#
# children_of PARENT PATTERN N: waits up to 10 s for N children of PARENT whose command line
# matches PATTERN; prints the pids found by then (fewer than N when they did not come).
children_of() {
  local found="" i
  for ((i = 0; i < 200; i++)); do
    found=$(pgrep -P "$1" -f "$2" | tr '\n' ' ')
    [ "$(wc -w <<<"$found")" -ge "$3" ] && break
    sleep 0.05
  done
  echo "$found"
}
