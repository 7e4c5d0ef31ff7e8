#!/usr/bin/env bash
# Installs what is missing, builds ferry from scratch and runs the whole test suite.
#   scripts/test.sh                      # the full suite (build/)
#   scripts/test.sh --sanitize address   # ASan+UBSan build (build-asan/), all but what its case below leaves out
#   scripts/test.sh --sanitize thread    # TSan build (build-tsan/), the concurrency tests
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=""
if [ "${1:-}" = "--sanitize" ]; then sanitize="${2:?--sanitize takes address or thread}"; fi
case "$sanitize" in
  ""|address|thread) ;;
  *) echo "test.sh: --sanitize '$sanitize' is not a sanitizer; valid: address, thread" >&2; exit 2 ;;
esac
scripts/deps.sh
dir=build${sanitize:+-$( [ "$sanitize" = address ] && echo asan || echo tsan )}
# The TSan job runs no benchmark program (none of its tests is one): it does not build them.
bench=ON
if [ "$sanitize" = thread ]; then bench=OFF; fi
# The sanitizer builds use clang: the same checks, built in about 40% less time than with gcc
# (whose UBSan instrumentation makes header-heavy programs, CLI11's users, slow to compile),
# and a second compiler's warnings. The plain build keeps the system's default compiler.
compilers=()
if [ -n "$sanitize" ]; then compilers=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++); fi
# Line tables only (-g1): a failure's stack still names file and line, and the three builds take
# about a quarter less time than with full debug information.
cmake -S . -B "$dir" "${compilers[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DFERRY_SANITIZE="$sanitize" -DFERRY_BUILD_BENCH=$bench >"$dir.configure.log" 2>&1 ||
  { cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" -j"$(nproc)"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
export TSAN_OPTIONS="suppressions=$PWD/scripts/tsan.supp:halt_on_error=1:second_deadlock_stack=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
args=(--test-dir "$dir" --output-on-failure --timeout 600)
# Each job in two passes: the unit tests (single processes, one per gtest case) side by side on
# every core, then the rest one at a time (multi-process tests already fill the cores, and
# two of them at once would only oversubscribe them).
run() {  # run LABEL-EXCLUDE-REGEX [ctest args...]: the unit pass, then the rest
  local exclude=$1; shift
  ctest "${args[@]}" -j"$(nproc)" -L '^unit$' -LE "$exclude" "$@"
  ctest "${args[@]}" -LE "^unit\$|$exclude" "$@"
}
case "$sanitize" in
  "") run tsan_only ;;
  # 2 GiB under ASan needs 3x the memory (the large runs' 64 MiB data path goes with it; the
  # suite's own runs stop at 5 MiB + 3, past every window); the lock-model variants are the
  # TSan job's (the soak keeps the models with code of their own: lockless, lockq, csync, offload);
  # libfabric's tcp provider runs the same ofi backend code as its shm provider does, and
  # UCX's tcp the same ucx backend code as UCX's shared memory. UCX's malloc hooks and memory
  # events stay off under the sanitizers, whose allocators they would patch.
  # The design-space variants over UCX repeat, on the same backend code, what the shm ones check.
  # The whole suites' four-rank runs repeat their two-rank runs with more peers: the four-rank
  # tests that need them (departure, peer failure, pushed rendezvous, hybrid over UCX) stay.
  # The parcel layer's design-space variants run the same settings as the AMT runtime's, which
  # stay. The core suite on two "hosts" joined by libfabric's tcp (mp_hybrid_4, mp_netns_hosts_4)
  # runs ofi tcp code, as above; mp_hybrid_ucx_4 keeps the core suite's routing between "hosts",
  # mp_netns_link_cut_4 the keepalive, and the parcel and AMT hybrid jobs stay.
  # amt_ucx_sm_2_peer_failure: at the survivor's exit LeakSanitizer's tracer crashes (signal 11)
  # scanning the threads since UCX comes in a dlopen'ed module: it runs apart, under ASan and
  # UBSan with the leak check off. So does mp_interop_openmpi_mpirun: under Open MPI's launcher
  # (libpmix and its dlopen'ed plugins) the tracer reads a garbage entry of the main thread's
  # dynamic TLS ("DTLS 10 at 0x000000000a68-0x002400001b6a" with LSAN_OPTIONS=verbosity=1:
  # log_threads=1) and crashes the same way, as the libraries' layout falls; its leak check with
  # verbosity on reports only libpmix's own allocations, which lsan.supp suppresses.
  address) export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no
           run "large|tsan_only|lock_model|ofi_tcp|ucx_tcp|ucx_design" \
             -E "^(amt_ucx_sm_2_peer_failure|mp_interop_openmpi_mpirun|mp_(shm|ofi_shm|ucx_sm)_4|parcel_(mpi|mpi_a|mpix|ferry_plain|ferry_iovec)_4|mp_hybrid_4|mp_netns_hosts_4|parcel_ferry_(am|sendrecv|progress|polling|queues|sync)_.*)$"
           ASAN_OPTIONS=detect_leaks=0 ctest "${args[@]}" -R '^(amt_ucx_sm_2_peer_failure|mp_interop_openmpi_mpirun)$' ;;
  # The concurrent data structures (the shared-memory cell queue and transport included), the
  # stress tests over both shared-memory paths and UCX's, and the combining lock models.
  # libferry links UCX, whose memory hooks (libucm, installed at load) crash TSan's runtime:
  # off, as for the ASan job.
  thread) export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no FERRY_TEST_MESSAGES=20000 FERRY_TEST_SCALE=1
          ctest "${args[@]}" -j"$(nproc)" -L '^unit$'
          ctest "${args[@]}" -L tsan -LE '^unit$' ;;
esac
