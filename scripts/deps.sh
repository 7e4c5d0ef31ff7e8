#!/usr/bin/env bash
# Installs, from Debian's packages, everything ferry builds, tests and benchmarks with.
# Idempotent: does nothing when every package is present. Needs root (or sudo) to install.
set -euo pipefail
packages=(
  build-essential cmake pkg-config
  libfabric-dev libfabric-bin          # the network layer, and fi_info / fi_pingpong
  libpmix-dev                          # PMIx bootstrap (mpirun, srun --mpi=pmix)
  mpich libmpich-dev                   # MPI baseline and PMI-1 interop (mpiexec.hydra)
  openmpi-bin libopenmpi-dev           # PMIx interop (mpirun), and the Open MPI baseline of bench.sh
  libucx-dev ucx-utils                 # the ucx backend; ucx_perftest / ucx_info, the UCX baseline of bench.sh
  libcli11-dev nlohmann-json3-dev      # command lines, JSON output
  googletest libgtest-dev libgmock-dev # tests
  python3-matplotlib                   # plots (used by /usr/bin/python3)
  procps psmisc                        # ps / pkill for the launcher tests
  iproute2 util-linux                  # ip netns / unshare: the two-host tests in network namespaces
  valgrind                             # instruction counts (callgrind-am.sh, lock-evidence.sh)
  libopenblas-dev                      # DGEMM for the block-sparse multiply proxy (apps/bspmm)
  clang libclang-rt-14-dev             # the sanitizer builds and fuzz targets: clang, its sanitizer runtimes and libFuzzer
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps: done"
