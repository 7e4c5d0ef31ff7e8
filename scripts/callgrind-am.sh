#!/usr/bin/env bash
# Instructions per 8-byte active message, sender and receiver, libfabric's share separated.
# The transport is FERRY_TRANSPORT's (default auto: ferry's shared memory on one host);
# FERRY_TRANSPORT=ofi measures the libfabric path (provider FERRY_PROVIDER, default shm).
# Needs valgrind (apt-get install valgrind). Usage: scripts/callgrind-am.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
FERRY_PROVIDER=${FERRY_PROVIDER:-shm} "$build/bin/ferryrun" -n 2 --timeout 300 -- \
  valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$out/cg.%q{PMI_RANK}" \
  "$build/bin/ferry-am-cost" --rounds 20 --batch 200 2>/dev/null | grep am_cost
/usr/bin/python3 bench/callgrind_split.py 4000 "$out/cg.0" "$out/cg.1"
