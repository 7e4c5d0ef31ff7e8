#!/usr/bin/env bash
# link_cut.sh FERRYRUN PROG THREADS — a 4-rank job on two hosts made of network namespaces
# (netns_hosts.sh), whose link is taken down mid-flood (see link_cut.cpp). Passes when every
# rank prints its verdict, the job exits 0, libfabric's tcp carried the traffic between the
# hosts, every rank's process is gone, no segment is left and both namespaces are removed.
# Exits 77 (skip) where namespaces cannot be made.
set -u
. "$(dirname "$0")/rank_cleanup.sh"
ferryrun=$1 prog=$2 threads=$3
job_scratch
name="ferrycut$$"

start=$SECONDS
FERRY_NETNS_NAME=$name FERRY_NETNS_CUT_DIR=$tmp FERRY_TEST_CUT_DIR=$tmp FERRY_NETNS_TIMEOUT=100 \
  bash "$(dirname "$0")/netns_hosts.sh" "$ferryrun" "$prog" "$threads" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
[ "$rc" = 77 ] && exit 77
pids=$(sed -n 's/.*rank [0-9]* pid \([0-9]*\)$/\1/p' "$tmp/out" | tr '\n' ' ')
[ "$rc" = 0 ] || fail "the job exited with $rc"
grep -q "the link between the hosts is down" "$tmp/out" || fail "the link was never cut"
[ "$(grep -c "transport ofi/tcp;ofi_rxm+shm" "$tmp/out")" = 4 ] || fail "the hosts did not talk through libfabric's tcp"
ok=$(grep -c "link cut OK" "$tmp/out")
[ "$ok" = 4 ] || fail "$ok of 4 ranks passed"
[ "$(wc -w <<<"$pids")" = 4 ] || fail "expected 4 ranks to print their pids, got: $pids"
ranks_gone_and_clean "$pids"
pids=""
ip netns list 2>/dev/null | grep -q "^$name-" && fail "a namespace $name-* is left"
echo "ok: every rank reported the other host's ranks after the cut; job took $((SECONDS - start)) s"
