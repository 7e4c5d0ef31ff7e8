#!/bin/bash
cd /work/main
export UCX_TLS=sm,self
for i in $(seq 1 $1); do
  line=""
  for lib in ${LIBS:-/tmp/x-old /tmp/x-new}; do
    f=$(FERRY_TRANSPORT=ucx build/bin/ferryrun -n 2 -- env LD_LIBRARY_PATH=$lib build/bin/ferry-bench pingpong --size 8 --iters 100000 --json 2>/dev/null | grep -o '"half_rtt_us":[0-9.]*' | cut -d: -f2)
    line="$line $(basename $lib) $f"
  done
  ucx_perftest -p 13377 -f -v -t ucp_am_lat -s 8 -n 100000 -w 1000 > /tmp/srv.out 2>&1 &
  sleep 0.5
  u=$(ucx_perftest 127.0.0.1 -p 13377 -f -v -t ucp_am_lat -s 8 -n 100000 -w 1000 2>/dev/null | tail -1 | cut -d, -f3)
  wait
  echo "$line ucx $u"
done
rm -f /dev/shm/ucx_shm_posix_* 2>/dev/null
