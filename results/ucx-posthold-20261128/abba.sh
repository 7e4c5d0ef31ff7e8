#!/bin/bash
cd /work/main
export UCX_TLS=sm,self
one() { FERRY_TRANSPORT=ucx build/bin/ferryrun -n 2 -- env LD_LIBRARY_PATH=$1 build/bin/ferry-bench pingpong --size 8 --iters 100000 --json 2>/dev/null | grep -o '"half_rtt_us":[0-9.]*' | cut -d: -f2; }
for i in $(seq 1 $1); do
  a=$(one /tmp/x-old); b=$(one /tmp/x-new); c=$(one /tmp/x-new); d=$(one /tmp/x-old)
  echo "old $a new $b new $c old $d"
done
