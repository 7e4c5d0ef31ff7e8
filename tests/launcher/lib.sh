# lib.sh — shared helpers for the ferryrun test scripts. Sourced, never run.
#
# Every script is called as: script.sh FERRYRUN PROBE [ARGS...]
# and leaves FERRYRUN, PROBE, TMP and the remaining ARGS for the test body.
set -u

FERRYRUN=$1
PROBE=$2
shift 2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/ferryrun-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in out err; do
    if [ -s "$TMP/$f" ]; then
      echo "--- ferryrun std$f:" >&2
      cat "$TMP/$f" >&2
    fi
  done
  exit 1
}

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# run ARGS... : runs ferryrun with ARGS, capturing stdout/stderr in $TMP/out, $TMP/err,
# the exit code in RC and the wall time in ELAPSED_MS.
run() {
  local t0
  t0=$(now_ms)
  "$FERRYRUN" "$@" >"$TMP/out" 2>"$TMP/err"
  RC=$?
  ELAPSED_MS=$(( $(now_ms) - t0 ))
}

expect_rc() {
  [ "$RC" -eq "$1" ] || fail "expected exit code $1, got $RC${2:+ ($2)}"
}

# expect_out / expect_err PATTERN : an extended regex that must match a line.
expect_out() { grep -Eq -- "$1" "$TMP/out" || fail "stdout has no line matching '$1'"; }
expect_err() { grep -Eq -- "$1" "$TMP/err" || fail "stderr has no line matching '$1'"; }

# The pids the probe reported ("rank R pid P"), one per line.
probe_pids() { grep -Eo 'rank [0-9]+ pid [0-9]+' "$TMP/out" | awk '{print $4}'; }

# expect_gone PID... : none of them may still exist, not even as a zombie.
expect_gone() {
  local pid
  for pid in "$@"; do
    if kill -0 "$pid" 2>/dev/null; then
      fail "process $pid ($(cat /proc/"$pid"/cmdline 2>/dev/null | tr '\0' ' ')) outlived ferryrun"
    fi
  done
}

# expect_no_shm PID... : no /dev/shm/<pid>:* (libfabric shm) or ferry-<pid>-* (ferry shm) entry may remain.
expect_no_shm() {
  local pid f
  for pid in "$@"; do
    for f in /dev/shm/"$pid":* /dev/shm/ferry-"$pid"-*; do
      [ -e "$f" ] && fail "ferryrun left $f behind"
    done
  done
  return 0
}

# wait_for_pids N : waits (up to 20 s) until $TMP/out holds N probe pid lines.
wait_for_pids() {
  local n=$1 i
  for i in $(seq 200); do
    [ "$(probe_pids | wc -l)" -ge "$n" ] && return 0
    sleep 0.1
  done
  fail "the probes did not all start within 20 s"
}
