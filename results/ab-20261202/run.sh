#!/bin/bash
# Paired ferry-bench runs, two Release builds: OLD and NEW (checkouts with build/), OUT the folder for the JSON lines.
# run.sh PAIRS "size:count:threads ..." (shm msgrate); writes ab.jsonl
out=${OUT:-.}/ab.jsonl; : > $out
for i in $(seq 1 $1); do
  c2c=$(${NEW:-/tmp/benchclone}/build/bin/ferry-c2c 2>/dev/null | grep -o '"round_trip_ns":[0-9.]*' | cut -d: -f2)
  if (( i % 2 )); then order="old new"; else order="new old"; fi
  for m in $2; do
    IFS=: read s c t <<< "$m"
    for b in $order; do
      d=${NEW:-/tmp/benchclone}; [ $b = old ] && d=${OLD:-/tmp/benchold}
      r=$(FERRY_TRANSPORT=shm $d/build/bin/ferryrun -n 2 --timeout 60 --no-prefix -- $d/build/bin/ferry-bench msgrate --size $s --count $c --window 64 --threads $t --json 2>/dev/null | grep '"bench"' | tail -1)
      echo "{\"i\":$i,\"build\":\"$b\",\"size\":$s,\"threads\":$t,\"c2c\":${c2c:-0},\"r\":${r:-null}}" >> $out
    done
  done
done
