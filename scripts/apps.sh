#!/usr/bin/env bash
# The proxy applications (apps/README.md) on this machine: installs the Debian packages ferry
# needs, builds ferry-octree, ferry-bspmm and ferry-bspmm-mpi (Release), then runs apps/apps.py
# with every argument given here.
#   scripts/apps.sh --quick        # under 3 minutes
#   scripts/apps.sh                # 5 reps per point, 1 and 2 workers (about 10 minutes here)
#   scripts/apps.sh --apps bspmm --threads 2 --reps 3 --out results/mine
# FERRY_BUILD_DIR (default build) picks the build tree. apps.py --help lists every knob.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${FERRY_BUILD_DIR:-build}"

scripts/deps.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)" --target ferry-octree ferry-bspmm ferry-bspmm-mpi ferryrun

exec /usr/bin/python3 apps/apps.py --bin-dir "$build/bin" "$@"
