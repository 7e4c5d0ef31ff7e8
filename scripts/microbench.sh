#!/usr/bin/env bash
# [Combining]'s micro-benchmarks on this machine: ferry's device lock models under thread
# contention (all sending, all receiving, all putting, latency) and the completion queues.
# Installs the Debian packages ferry needs, builds ferry-bench and ferryrun (Release), then
# runs bench/microbench.py with every argument given here.
#   scripts/microbench.sh --quick          # under 2 minutes
#   scripts/microbench.sh                  # 3 repetitions of every point
#   scripts/microbench.sh --reps 5 --threads 1,2,4,8,16 --lock-models block,lockq,csync
# FERRY_BUILD_DIR (default build) picks the build tree. microbench.py --help lists every knob.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${FERRY_BUILD_DIR:-build}"

scripts/deps.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
# Only what the sweep runs: a broken target elsewhere in the tree must not block it.
cmake --build "$build" -j "$(nproc)" --target ferry-bench ferryrun

# Debian's python3-matplotlib is only visible to the system interpreter, not to a python3
# that may come first on PATH (pyenv, venv).
exec /usr/bin/python3 bench/microbench.py --bin-dir "$build/bin" "$@"
