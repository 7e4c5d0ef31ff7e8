#!/usr/bin/env bash
# The main job: installs what is missing, builds ferry, and runs the local 2-rank benchmark
# table — ferry's ping-pong and message rate beside libfabric's fi_pingpong, a raw-libfabric
# message rate and an MPI ping-pong (MPICH), all on the same provider (FERRY_PROVIDER, default
# shm). Arguments go to bench/compare.py (--reps, --quick, --provider, --out ...).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >build.configure.log 2>&1 || { cat build.configure.log; exit 1; }
cmake --build build -j"$(nproc)" --target ferry-bench ferry-fi-msgrate ferry-mpi-pingpong ferryrun
exec /usr/bin/python3 bench/compare.py --bin-dir build/bin "$@"
