#!/usr/bin/env bash
# Alternating runs over UCX's shared memory (UCX_TLS=sm,self): ferry-bench msgrate (8 B, window 64,
# 500000 messages) under the lockless and the serialized lock models, and ucx_perftest ucp_am_bw
# (-O 64); then the 8 B ping-pong likewise against ucp_am_lat. One line per round, CSV.
# Usage (from the repository, after scripts/bench.sh built build/): results/ucx-serialized-rate-20261127/run.sh ROUNDS
set -u
rounds=${1:-9}
export UCX_TLS=sm,self
bin=build/bin
ferry() {  # ferry MODEL SUBCOMMAND ARGS...: the JSON value of the run
  local model=$1 sub=$2; shift 2
  FERRY_LOCK_MODEL=$model FERRY_TRANSPORT=ucx $bin/ferryrun -n 2 --no-prefix --timeout 60 $bin/ferry-bench "$sub" --size 8 "$@" --json 2>/dev/null |
    grep -o '"\(msgs_per_s\|half_rtt_us\)":[0-9.e+-]*' | cut -d: -f2
}
ucx() {  # ucx TEST FIELD ARGS...: field FIELD of ucx_perftest's CSV line
  local test=$1 field=$2; shift 2
  local port=$((20000 + RANDOM % 20000))
  ucx_perftest -p $port -f -v -t "$test" -s 8 -w 1000 "$@" >/dev/null 2>&1 &
  sleep 0.3
  ucx_perftest 127.0.0.1 -p $port -f -v -t "$test" -s 8 -w 1000 "$@" 2>/dev/null | grep -E '^[0-9]' | tail -1 | cut -d, -f"$field"
  wait
}
echo "round,rate_lockless,rate_serialized,rate_ucp_am_bw,lat_lockless_us,lat_serialized_us,lat_ucp_am_lat_us"
for i in $(seq "$rounds"); do
  a=$(ferry lockless msgrate --count 500000 --window 64)
  b=$(ferry serialized msgrate --count 500000 --window 64)
  c=$(ucx ucp_am_bw 8 -n 500000 -O 64)
  d=$(ferry lockless pingpong --iters 50000)
  e=$(ferry serialized pingpong --iters 50000)
  f=$(ucx ucp_am_lat 4 -n 50000)
  echo "$i,$a,$b,$c,$d,$e,$f"
done
