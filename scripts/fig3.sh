#!/usr/bin/env bash
# [AMT-LCI] Figure 3 on this machine: installs the Debian packages ferry needs, builds
# ferry-chains (Release), then runs bench/chains/fig3.py with every argument given here.
#   scripts/fig3.sh --quick            # about 2 minutes
#   scripts/fig3.sh                    # the full sweep, 5 reps per point (under ~25 minutes)
#   scripts/fig3.sh --reps 3 --threads 1,2 --chains 1,64,1024 --out results/mine
#   scripts/fig3.sh --parcelports ferry@shm,ferry@ofi,ferry@ucx,mpi,mpi_a   # ferry on each backend
# FERRY_BUILD_DIR (default build) picks the build tree. fig3.py --help lists every knob.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${FERRY_BUILD_DIR:-build}"

scripts/deps.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
# Only what the sweep runs: a broken target elsewhere in the tree must not block the figure.
cmake --build "$build" -j "$(nproc)" --target ferry-chains ferry-c2c ferryrun

# Debian's python3-matplotlib is only visible to the system interpreter, not to a python3
# that may come first on PATH (pyenv, venv).
exec /usr/bin/python3 bench/chains/fig3.py --bin-dir "$build/bin" "$@"
