#!/usr/bin/env bash
# departure.sh FERRYRUN HELLO — a rank that finalized and exited is not a failed peer. With the
# process watch checking every millisecond (FERRY_PEER_CHECK_MS=1), the first ranks to leave
# the finalize barrier end while the last are still in it; without the departure message
# those took them for failed (2 runs in 20 threw PeerFailed). 20 jobs of 4 ranks must all
# end cleanly, with no failure reported. The transport comes from the environment.
set -u
ferryrun=$1 hello=$2
for i in $(seq 1 20); do
  out=$(FERRY_PEER_CHECK_MS=1 "$ferryrun" -n 4 --timeout 30 "$hello" 2>&1)
  rc=$?
  if [ "$rc" != 0 ] || grep -qi "failed" <<<"$out"; then
    echo "$out"
    echo "FAIL: job $i ended with exit code $rc or reported a failure"
    exit 1
  fi
done
echo "ok: 20 jobs of 4 ranks finalized and left without a failure reported"
