#!/bin/sh
# Smoke test of bench/lock_evidence.py: a tiny sweep (two lock models, one queue, one thread
# count, tiny counts) must run with every run succeeding and write every output. Without
# valgrind the driver skips the callgrind part and says so; the test then does not ask for it.
# A sanitizer build (4th argument non-empty) cannot run under valgrind: the part is skipped.
#   lock_evidence_smoke.sh <python> <lock_evidence.py> <bin dir> <out dir> [sanitizer]
set -u
python=$1 script=$2 bin=$3 out=$4 sanitize=${5:-}
rm -rf "$out"
skip=""
if [ -n "$sanitize" ]; then skip="--skip callgrind"; fi
# shellcheck disable=SC2086
"$python" "$script" --quick $skip --bin-dir "$bin" --out "$out" --timeout 30 --cg-timeout 90 --spin-timeout 20 \
  --lock-models lockless,block --queues ring --threads 2 --cg-threads 2 --spin-threads 2 \
  --messages 4000 --cq-ops 20000 --spin-messages 1000 --cg-count 200 --cg-ops 2000
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "lock_evidence_smoke: lock_evidence.py exited $rc"
  exit 1
fi
files="meta.json raw.jsonl oversub_raw.csv oversub.csv summary.md"
if [ -n "$sanitize" ]; then
  echo "lock_evidence_smoke: $sanitize build; the callgrind part was skipped"
elif command -v valgrind >/dev/null 2>&1; then
  files="$files callgrind.csv"
else
  echo "lock_evidence_smoke: valgrind is not installed; the callgrind part was skipped"
fi
for f in $files; do
  if [ ! -s "$out/$f" ]; then
    echo "lock_evidence_smoke: $out/$f is missing or empty"
    exit 1
  fi
done
# 2 contention + 1 cq + 2 spinning runs, each ok (a spinning run may also end as "slow").
runs=$(($(wc -l < "$out/oversub_raw.csv") - 1))
good=$(grep -c -E ',(ok|slow),' "$out/oversub_raw.csv")
if [ "$runs" -ne 5 ] || [ "$good" -ne "$runs" ]; then
  echo "lock_evidence_smoke: expected 5 timed runs, all ok; oversub_raw.csv has $runs, $good ok"
  exit 1
fi
# The context-switch fields ferry-bench adds are in every contention result.
if ! grep -q '"vol_ctx_per_msg"' "$out/raw.jsonl"; then
  echo "lock_evidence_smoke: raw.jsonl has no vol_ctx_per_msg"
  exit 1
fi
echo "lock_evidence_smoke: $runs timed runs ok, outputs in $out"
