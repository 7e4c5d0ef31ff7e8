#!/usr/bin/env bash
# The main comparison, from a fresh clone: installs what is missing (scripts/deps.sh), builds
# ferry and the baselines (Release), and runs bench/compare.py — 2 ranks on this machine, ferry
# on each of its transports beside raw libfabric (fi_pingpong, ferry-fi-msgrate), MPICH, Open MPI
# and UCX (ucx_perftest): 8 B latency, 8 B message rate with 1 and T threads, 16 KiB and 1 MiB
# streamed bandwidth. Results in results/bench-<timestamp>/ (table.md, results.csv, raw.jsonl,
# plot.png). Arguments go to compare.py:
#   scripts/bench.sh --quick                        # one repetition, small counts: a smoke test
#   scripts/bench.sh                                # medians of 5 interleaved repetitions
#   scripts/bench.sh --transports shm,shm@handler,ofi:shm,ofi:tcp --threads 4 --reps 7 --out results/mine
# With --coll first, the collectives instead (bench/coll.py: ferry-bench coll beside ferry-mpi-coll
# under MPICH and Open MPI; 2, 4 and 8 ranks, 8 B to 4 MiB; results/coll-<timestamp>/):
#   scripts/bench.sh --coll [--quick] [--ranks 2,4] [--ops barrier,allreduce] [--reps 5]
# then the remote atomics (bench/atomic.py: ferry-bench atomic beside ucx_perftest's ucp_fadd,
# ucp_cswap and ucp_swap; results/atomic-<timestamp>/; --quick and --reps pass on to it).
# With --atomic first, the atomics alone: scripts/bench.sh --atomic [--quick] [--reps 5]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >build.configure.log 2>&1 || { cat build.configure.log; exit 1; }
# The MPI programs exist only when their MPI was found at configure time; build what there is.
coll=no atomic=no
if [ "${1:-}" = --coll ]; then coll=yes; shift; fi
if [ "${1:-}" = --atomic ]; then atomic=yes; shift; fi
wanted=(ferry-bench ferryrun ferry-info ferry-c2c ferry-fi-msgrate ferry-mpi-pingpong ferry-mpi-pingpong-openmpi
        ferry-mpi-coll ferry-mpi-coll-openmpi)
available=$(cmake --build build --target help 2>/dev/null | sed -n 's/^\.\.\. \([^ ]*\).*/\1/p')
targets=()
for t in "${wanted[@]}"; do
  if grep -qx "$t" <<<"$available"; then targets+=("$t"); else echo "bench: target $t is not configured; its column will say so"; fi
done
cmake --build build -j"$(nproc)" --target "${targets[@]}"
if [ "$coll" = yes ] || [ "$atomic" = yes ]; then
  atomic_args=()
  args=("$@")
  for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
      --quick) atomic_args+=(--quick) ;;
      --reps) atomic_args+=(--reps "${args[i + 1]:-}") ;;
    esac
  done
  if [ "$coll" = yes ]; then /usr/bin/python3 bench/coll.py --bin-dir build/bin "$@"; fi
  exec /usr/bin/python3 bench/atomic.py --bin-dir build/bin "${atomic_args[@]}"
fi
exec /usr/bin/python3 bench/compare.py --bin-dir build/bin "$@"
