#!/bin/sh
# Smoke test of bench/chains/factor_study.py: a tiny subset of the study (two families, four
# variants, tiny counts) must run with every run succeeding and write every output.
#   factor_study_smoke.sh <python> <factor_study.py> <bin dir> <out dir>
set -u
python=$1 script=$2 bin=$3 out=$4
rm -rf "$out"
"$python" "$script" --quick --bin-dir "$bin" --out "$out" --timeout 20 \
  --families asynchrony,attentiveness --variants base,sendrecv_sync,att_local,att_steal \
  --rate-chains 5000 --rate-chains-zc 500 --lat-chains 64 --lat-steps 20 --lat-steps-zc 4 \
  --att-chains 1 --att-steps 100 --task-us 20
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "factor_study_smoke: factor_study.py exited $rc"
  exit 1
fi
for f in study.json runs.csv summary.csv summary.md asynchrony.png attentiveness.png; do
  if [ ! -s "$out/$f" ]; then
    echo "factor_study_smoke: $out/$f is missing or empty"
    exit 1
  fi
done
# Every run recorded, every one ok (the script's exit code says so too; this checks the CSV).
runs=$(($(wc -l < "$out/runs.csv") - 1))
ok=$(grep -c ',ok,' "$out/runs.csv")
if [ "$runs" -ne 10 ] || [ "$ok" -ne "$runs" ]; then
  echo "factor_study_smoke: expected 10 runs, all ok; runs.csv has $runs runs, $ok ok"
  exit 1
fi
echo "factor_study_smoke: $runs runs ok, outputs in $out"
