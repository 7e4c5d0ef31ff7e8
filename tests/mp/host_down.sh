#!/usr/bin/env bash
# host_down.sh FERRYRUN PROG HOSTS PER_HOST stop|kill [VICTIMS] — the last host's ranks (or the
# last VICTIMS ranks) stop or die at once (see host_down.cpp) in a job split into HOSTS "hosts"
# of PER_HOST ranks (split_hosts.sh; one host: not split);
# ferryrun --keep-going lets the survivors run on. Passes when every survivor prints its
# verdict, ferryrun reports the victims' SIGKILL (exit 137: a stopped victim is killed here,
# by its pid, once the survivors are done), and every rank's process is gone. The network
# backend comes from the environment.
set -u
. "$(dirname "$0")/rank_cleanup.sh"
ferryrun=$1 prog=$2 hosts=$3 per_host=$4 how=$5 victims=${6:-$4}
ranks=$((hosts * per_host)) survivors=$((hosts * per_host - victims))
split=("$(dirname "$0")/split_hosts.sh")
[ "$hosts" = 1 ] && split=()
job_scratch

start=$SECONDS
FERRY_TEST_RANKS_PER_HOST=$per_host FERRY_TEST_VICTIMS=$victims "$ferryrun" -n "$ranks" --keep-going --timeout 90 -- \
  "${split[@]}" "$prog" "$how" >"$tmp/out" 2>&1 &
job=$!
# The survivors' verdicts, then the stopped victims' end.
for ((i = 0; i < 900; i++)); do
  pids=$(sed -n 's/.*rank [0-9]* pid \([0-9]*\)$/\1/p' "$tmp/out" | tr '\n' ' ')
  done_count=$(grep -c "host down OK\|FAIL" "$tmp/out")
  [ "$done_count" -ge "$survivors" ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
for ((r = survivors; r < ranks; r++)); do
  p=$(grep -E "(^|[^0-9])rank $r pid [0-9]+$" "$tmp/out" | sed 's/.* pid //')
  [ -n "$p" ] && kill -9 "$p" 2>/dev/null
done
wait "$job"
rc=$?
cat "$tmp/out"
pids=$(sed -n 's/.*rank [0-9]* pid \([0-9]*\)$/\1/p' "$tmp/out" | tr '\n' ' ')
grep -q "FAIL" "$tmp/out" && fail "a rank failed"
[ "$rc" = 137 ] || fail "expected exit code 137 (the victims' SIGKILL), got $rc"
grep -q "exited with code" "$tmp/out" && fail "a survivor exited non-zero"
ok=$(grep -c "host down OK" "$tmp/out")
[ "$ok" = "$survivors" ] || fail "$ok of $survivors survivors passed"
[ "$(wc -w <<<"$pids")" = "$ranks" ] || fail "expected $ranks ranks to print their pids, got: $pids"
ranks_gone_and_clean "$pids"
pids=""
echo "ok: $survivors survivors reported the last $victims ranks ($how) failed; job took $((SECONDS - start)) s"
