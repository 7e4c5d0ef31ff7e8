#!/usr/bin/env bash
# Alternating rounds: ucp_am_lat, then ferry's 8 B ping-pong (ferry-bench pingpong --inbox reply
# over UCX under FERRY_LOCK_MODEL=serialized) from each checkout given, in reversed order every
# other round; the cache-line round trip between the vCPUs (ferry-c2c) before and after each
# round tells their placement. One JSON line per round.
# Usage: run.sh ROUNDS ITERS OUT label=checkout[:VAR=VAL]...   (each checkout built in its build/)
rounds=$1; iters=$2; out=$3; shift 3; specs=("$@")
: > "$out"
c2c() { "${C2C:-build/bin/ferry-c2c}" 2>/dev/null | sed -n 's/.*"round_trip_ns":\([0-9.]*\).*/\1/p'; }
port=$((20000 + RANDOM % 20000))
for r in $(seq 1 "$rounds"); do
  b=$(c2c)
  timeout 120 ucx_perftest -p $port -t ucp_am_lat -s 8 -n "$iters" > /dev/null 2>&1 & s=$!
  sleep 0.5
  lat=$(timeout 120 ucx_perftest -p $port -t ucp_am_lat -s 8 -n "$iters" 127.0.0.1 2>/dev/null | awk '/Final:/ {print $5}')
  wait $s
  line="{\"round\":$r,\"c2c\":$b,\"ucp\":${lat:-null}"
  order=("${specs[@]}"); if [ $((r % 2)) = 0 ]; then order=($(printf '%s\n' "${specs[@]}" | tac)); fi
  for sp in "${order[@]}"; do
    label=${sp%%=*}; rest=${sp#*=}; tree=${rest%%:*}; envs=""; [ "$rest" != "$tree" ] && envs=${rest#*:}
    v=$(cd "$tree" && timeout 120 env $envs FERRY_TRANSPORT=ucx FERRY_LOCK_MODEL=serialized build/bin/ferryrun -n 2 -- build/bin/ferry-bench pingpong --size 8 --iters "$iters" --inbox reply --json 2>/dev/null | grep -o '{.*}' | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["half_rtt_us"])')
    line="$line,\"$label\":${v:-null}"
  done
  a=$(c2c)
  echo "$line,\"c2c_after\":$a}" >> "$out"
done
rm -f /dev/shm/ucx_* 2>/dev/null
