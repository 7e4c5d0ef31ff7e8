#!/bin/bash
# usage: rate.sh reps [libdir...]: ferry msgrate (per lib) vs ucp_am_bw, alternating
cd /work/main
export UCX_TLS=sm,self
reps=$1; shift
libs=("$@"); [ ${#libs[@]} -eq 0 ] && libs=("")
for i in $(seq 1 $reps); do
  line=""
  for lib in "${libs[@]}"; do
    f=$(FERRY_TRANSPORT=ucx build/bin/ferryrun -n 2 -- env ${lib:+LD_LIBRARY_PATH=$lib} build/bin/ferry-bench msgrate --size 8 --count 2000000 --json 2>/dev/null | grep -o '"msgs_per_s":[0-9.e+]*' | head -1 | cut -d: -f2)
    line="$line ferry[${lib:-cur}] $f"
  done
  ucx_perftest -p 13377 -f -v -t ucp_am_bw -s 8 -n 2000000 -w 1000 -O 64 > /tmp/srv.out 2>&1 &
  sleep 0.5
  u=$(ucx_perftest 127.0.0.1 -p 13377 -f -v -t ucp_am_bw -s 8 -n 2000000 -w 1000 -O 64 2>/dev/null | tail -1 | awk -F, '{print $NF}')
  wait
  echo "$line ucx $u"
done
rm -f /dev/shm/ucx_shm_posix_* 2>/dev/null
