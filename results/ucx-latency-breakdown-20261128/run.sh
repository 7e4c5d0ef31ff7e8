#!/bin/bash
# Where an 8 B ping-pong's time goes over UCX: ferry-bench pingpong with a library built from
# probe.patch (rdtsc stamps; TSC 2096 MHz on this machine), then ucx_perftest ucp_am_lat and
# ferry over its own shared memory, in one sitting. Usage: run.sh PROBE_LIB_DIR [ROUNDS]
# (build: git apply probe.patch in a worktree; cmake -DCMAKE_BUILD_TYPE=Release
# -DFERRY_BUILD_BENCH=OFF; cmake --build . --target ferry).
cd "$(dirname "$0")/../.."
lib=$1
export UCX_TLS=sm,self
for i in $(seq 1 "${2:-3}"); do
  echo "== round $i"
  FERRY_TRANSPORT=ucx build/bin/ferryrun -n 2 -- env LD_LIBRARY_PATH="$lib" build/bin/ferry-bench pingpong --size 8 --iters 200000 --json 2>&1 |
    grep -o 'PROBE.*\|half_rtt_us":[0-9.]*'
  echo "ferry ucx (no probes): $(FERRY_TRANSPORT=ucx build/bin/ferryrun -n 2 -- build/bin/ferry-bench pingpong --size 8 --iters 200000 --json 2>/dev/null | grep -o '"half_rtt_us":[0-9.]*')"
  echo "ferry shm: $(FERRY_TRANSPORT=shm build/bin/ferryrun -n 2 -- build/bin/ferry-bench pingpong --size 8 --iters 200000 --json 2>/dev/null | grep -o '"half_rtt_us":[0-9.]*')"
  ucx_perftest -p 13377 -t ucp_am_lat -s 8 -n 200000 -w 1000 >/dev/null 2>&1 &
  sleep 0.5
  echo "ucp_am_lat: $(ucx_perftest 127.0.0.1 -p 13377 -f -t ucp_am_lat -s 8 -n 200000 -w 1000 2>/dev/null | tail -1)"
  wait
done
rm -f /dev/shm/ucx_shm_posix_* 2>/dev/null
