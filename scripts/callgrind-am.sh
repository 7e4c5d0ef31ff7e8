#!/usr/bin/env bash
# Instructions per 8-byte active message, sender and receiver, libfabric's share separated.
# The transport is FERRY_TRANSPORT's (default auto: ferry's shared memory on one host);
# FERRY_TRANSPORT=ofi measures the libfabric path (provider FERRY_PROVIDER, default shm);
# FERRY_TRANSPORT=ucx the UCX path (UCX_TLS, default sm,self), UCX's share separated likewise.
# Needs valgrind (apt-get install valgrind). Usage: scripts/callgrind-am.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ "${FERRY_TRANSPORT:-}" = ucx ]; then
  # The sender posts a whole batch before the receiver polls, without progressing in between:
  # UCX's shared-memory queues must hold the batch (64 cells by default, half of them usable
  # before the receiver releases cells; a send that does not fit waits for the sender's
  # progress). UCX's memory hooks stay off under valgrind.
  export UCX_TLS=${UCX_TLS:-sm,self} UCX_POSIX_FIFO_SIZE=1024 UCX_SYSV_FIFO_SIZE=1024 UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no
fi
FERRY_PROVIDER=${FERRY_PROVIDER:-shm} "$build/bin/ferryrun" -n 2 --timeout 300 -- \
  valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$out/cg.%q{PMI_RANK}" \
  "$build/bin/ferry-am-cost" --rounds 20 --batch 200 2>/dev/null | grep am_cost
/usr/bin/python3 bench/callgrind_split.py 4000 "$out/cg.0" "$out/cg.1"
