#!/bin/bash
# Paired ferry-bench runs over UCX, two Release builds: OLD and NEW, LM the lock model; run-ucx.sh PAIRS
out=${OUT:-.}/ucx-${LM:-serialized}.jsonl; : > $out
for i in $(seq 1 $1); do
  c2c=$(${NEW:-/tmp/benchclone}/build/bin/ferry-c2c 2>/dev/null | grep -o '"round_trip_ns":[0-9.]*' | cut -d: -f2)
  if (( i % 2 )); then order="old new"; else order="new old"; fi
  for m in "msgrate --size 8 --count 200000 --window 64" "pingpong --size 8 --iters 20000 --inbox reply"; do
    for b in $order; do
      d=${NEW:-/tmp/benchclone}; [ $b = old ] && d=${OLD:-/tmp/benchold}
      r=$(FERRY_TRANSPORT=ucx FERRY_LOCK_MODEL=${LM:-serialized} $d/build/bin/ferryrun -n 2 --timeout 60 --no-prefix -- $d/build/bin/ferry-bench $m --json 2>/dev/null | grep '"bench"' | tail -1)
      echo "{\"i\":$i,\"build\":\"$b\",\"c2c\":${c2c:-0},\"r\":${r:-null}}" >> $out
    done
  done
done
