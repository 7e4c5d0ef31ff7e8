#!/usr/bin/env bash
# Builds ferry's fuzz targets (tests/fuzz) with clang, libFuzzer, ASan and UBSan in build-fuzz/
# and fuzzes each, starting from its committed seed corpus (never modified; new inputs go to a
# temporary directory). Any crash, sanitizer report, leak or timeout fails the script and
# leaves the input that caused it in build-fuzz/crashes/.
#   scripts/fuzz.sh                          # about a minute in all (CI)
#   scripts/fuzz.sh --seconds 600            # longer, split over the targets
#   scripts/fuzz.sh --runs 10000000 --out results/fuzz-$(date +%Y%m%d)   # the long run, summary kept
#   scripts/fuzz.sh --targets parcel_header --seconds 30                  # some of the targets
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60 runs="" out=""
# FERRY_FUZZ_BUILD_DIR: another build directory, for a second run beside one in progress.
bdir=${FERRY_FUZZ_BUILD_DIR:-build-fuzz}
targets=(wire notify heartbeat parcel_header mpi_header pmi_server pmi_reply coll_header atomic_request)
while (($#)); do
  case "$1" in
    --seconds) seconds=${2:?--seconds takes a number}; shift 2 ;;
    --runs) runs=${2:?--runs takes a number}; shift 2 ;;
    --out) out=${2:?--out takes a directory}; shift 2 ;;
    --targets) IFS=, read -r -a targets <<<"${2:?--targets takes a comma-separated list}"; shift 2 ;;
    *) echo "fuzz.sh: unknown argument '$1'; valid: --seconds N, --runs N, --out DIR, --targets A,B" >&2; exit 2 ;;
  esac
done
for t in "${targets[@]}"; do
  [ -f "tests/fuzz/${t}_fuzz.cpp" ] || { echo "fuzz.sh: --targets: '$t' is not a target; valid: wire, notify, heartbeat, parcel_header, mpi_header, pmi_server, pmi_reply, coll_header, atomic_request" >&2; exit 2; }
done
scripts/deps.sh
# Line tables only (-g1), as in scripts/test.sh: crash stacks name file and line.
CC=clang CXX=clang++ cmake -S . -B "$bdir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  -DFERRY_SANITIZE=address -DFERRY_FUZZ=ON \
  -DFERRY_BUILD_BENCH=OFF >"$bdir.configure.log" 2>&1 || { cat "$bdir.configure.log"; exit 1; }
cmake --build "$bdir" -j"$(nproc)" --target "${targets[@]/#/ferry-fuzz-}"
# A hostile size may ask for more memory than there is: ferry must see an allocation fail and
# report it, not have the sanitizer abort the process.
export ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
mkdir -p "$bdir/crashes"
[ -n "$out" ] && mkdir -p "$out"
per=$(( seconds / ${#targets[@]} ))
(( per > 0 )) || per=1
status=0
for t in "${targets[@]}"; do
  work=$(mktemp -d)
  limit=(-max_total_time="$per")
  [ -n "$runs" ] && limit=(-runs="$runs")
  log="$bdir/fuzz-$t.log"
  echo "fuzz: $t (${limit[*]})"
  if "$bdir/bin/ferry-fuzz-$t" "${limit[@]}" -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=65536 \
       -print_final_stats=1 -artifact_prefix="$bdir/crashes/$t-" "$work" tests/fuzz/corpus/$t >"$log" 2>&1; then
    echo "fuzz: $t: $(grep -m1 '^stat::number_of_executed_units' "$log" | awk '{print $2}') inputs, no failure"
  else
    status=1
    echo "fuzz: $t FAILED; the last lines of $log:"
    tail -40 "$log"
  fi
  if [ -n "$out" ]; then
    {
      echo "target: $t"
      echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
      echo "limit: ${limit[*]}"
      echo "result: $([ $status = 0 ] && echo 'no crash, sanitizer report, leak or timeout' || echo FAILED)"
      grep '^stat::' "$log"
      grep -m1 -E '^#[0-9]+.*(DONE|INITED)' "$log" || true
      tail -3 "$log"
    } >"$out/$t.txt"
  fi
  rm -rf "$work"
done
exit $status
