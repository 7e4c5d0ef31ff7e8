#!/usr/bin/env bash
# Runs "$@" as if on host "host<PMI_RANK / FERRY_TEST_RANKS_PER_HOST>": splits one machine into
# "hosts" for FERRY_TRANSPORT=auto (shared memory inside each, the network backend between).
set -eu
export FERRY_HOST="host$(( ${PMI_RANK:?split_hosts.sh runs under ferryrun} / ${FERRY_TEST_RANKS_PER_HOST:-2} ))"
exec "$@"
