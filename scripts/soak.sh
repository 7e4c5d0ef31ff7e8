#!/usr/bin/env bash
# The soak: ferry-soak (tests/soak/soak.cpp) with every lock model in turn, 4 ranks of 8
# threads, 10^6 random operations per rank (active messages, sends to wildcard receives, puts
# with notification read back by gets; 0 B to 1 MiB), every byte checked and every message
# delivered exactly once. Writes each run's per-rank JSON and a summary (operations, bytes,
# errors, lost, duplicates) to the output directory; exits non-zero if any run failed.
#   scripts/soak.sh                                   # results/soak-<date>/, ferry's shm
#   scripts/soak.sh --ops 100000 --transports shm,ofi:shm,ofi:tcp --out /tmp/soak
set -euo pipefail
cd "$(dirname "$0")/.."
ops=1000000 threads=8 ranks=4 max_size=1048576
transports=shm
models=(lockless trylock block lockq csync offload)
out="results/soak-$(date +%Y%m%d)"
while (($#)); do
  case "$1" in
    --ops) ops=${2:?--ops takes a number}; shift 2 ;;
    --threads) threads=${2:?--threads takes a number}; shift 2 ;;
    --ranks) ranks=${2:?--ranks takes a number}; shift 2 ;;
    --max-size) max_size=${2:?--max-size takes a number of bytes}; shift 2 ;;
    --transports) transports=${2:?--transports takes a comma-separated list}; shift 2 ;;
    --models) IFS=, read -r -a models <<<"${2:?--models takes a comma-separated list}"; shift 2 ;;
    --out) out=${2:?--out takes a directory}; shift 2 ;;
    *) echo "soak.sh: unknown argument '$1'; valid: --ops N, --threads N, --ranks N, --max-size BYTES," \
            "--transports shm,ofi:shm,ofi:tcp, --models A,B, --out DIR" >&2; exit 2 ;;
  esac
done
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >build.configure.log 2>&1 || { cat build.configure.log; exit 1; }
cmake --build build -j"$(nproc)" --target ferry-soak ferryrun
mkdir -p "$out"
status=0
IFS=, read -r -a transport_list <<<"$transports"
for transport in "${transport_list[@]}"; do
  case "$transport" in
    shm) env_t=(FERRY_TRANSPORT=shm) ;;
    ofi:*) env_t=(FERRY_TRANSPORT=ofi "FERRY_PROVIDER=${transport#ofi:}") ;;
    *) echo "soak.sh: --transports: '$transport' is not one of shm, ofi:shm, ofi:tcp" >&2; exit 2 ;;
  esac
  for model in "${models[@]}"; do
    name="${transport/:/-}-$model"
    echo "== soak: $transport, lock model $model: $ranks ranks x $threads threads, $ops operations per rank"
    start=$SECONDS
    if env "${env_t[@]}" FERRY_LOCK_MODEL="$model" build/bin/ferryrun -n "$ranks" --timeout 3600 -- \
        build/bin/ferry-soak --ops "$ops" --threads "$threads" --max-size "$max_size" \
        >"$out/$name.out" 2>"$out/$name.err"; then
      rc=0
    else
      rc=$?
      status=1
    fi
    # One JSON object per rank (ferryrun prefixes each line with "[rank] "), in rank order.
    { sed 's/^\[[0-9]*\] //' "$out/$name.out" | grep '^{' || true; } | /usr/bin/python3 -c '
import json, sys
rows = sorted((json.loads(l) for l in sys.stdin), key=lambda r: r["rank"])
print(json.dumps(rows, indent=1))' >"$out/$name.json"
    echo "   exit $rc after $((SECONDS - start)) s; $(grep -c '"ok": *true\|"ok":true' "$out/$name.out" || true) of $ranks ranks ok"
    [ -s "$out/$name.err" ] || rm -f "$out/$name.err"
    rm -f "$out/$name.out"
  done
done
/usr/bin/python3 - "$out" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
runs = []
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    if os.path.basename(path) == "summary.json":
        continue
    rows = json.load(open(path))
    if not rows:
        runs.append({"run": os.path.basename(path)[:-5], "ok": False, "ranks_reporting": 0})
        continue
    run = {"run": os.path.basename(path)[:-5], "transport": rows[0]["transport"], "lock_model": rows[0]["lock_model"],
           "ranks_reporting": len(rows), "threads": rows[0]["threads"]}
    for k in ("operations", "operations_am", "operations_send", "operations_put", "bytes", "errors", "corrupt",
              "duplicates", "lost", "unannounced"):
        run[k] = sum(r[k] for r in rows)
    run["seconds"] = max(r["seconds"] for r in rows)
    run["ok"] = all(r["ok"] for r in rows) and len(rows) == rows[0]["ranks"]
    runs.append(run)
total = {k: sum(r.get(k, 0) for r in runs) for k in ("operations", "bytes", "errors", "corrupt", "duplicates", "lost")}
summary = {"runs": runs, "total": total, "ok": all(r["ok"] for r in runs)}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print("soak: %d runs, %d operations, %.1f GB, errors %d, corrupt %d, duplicates %d, lost %d: %s" % (
    len(runs), total["operations"], total["bytes"] / 1e9, total["errors"], total["corrupt"], total["duplicates"],
    total["lost"], "ok" if summary["ok"] else "FAILED"))
EOF
exit $status
