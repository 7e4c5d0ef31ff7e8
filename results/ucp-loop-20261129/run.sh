#!/usr/bin/env bash
# Does the length of a runtime's polling loop, or its bookkeeping after an answer, move UCX's
# 8 B latency on this host? Alternating rounds of ferry-ucp-pingpong (answers inside UCX's
# callback) with --idle N (empty-loop iterations after each ucp_worker_progress call),
# --after N (after each answer) and --work N (before it), each round after a cache-line round
# trip (ferry-c2c) before and after each run that tells the vCPUs' placement (the hypervisor
# moves them now and then; a run whose two round trips disagree is left out), and ucp_am_lat.
# Then one idle turn of ferry's loop (ferry_idle.cpp) and of a bare UCP loop (ucp_idle.cpp),
# built here against the checkout's headers and the build's libferry (idle.txt).
# Usage: results/ucp-loop-20261129/run.sh [build] [rounds]   (from the checkout's root)
set -u
build=${1:-build} rounds=${2:-8}
here=$(dirname "$0")
raw=$here/raw.jsonl
: > "$raw"
port=13391
for r in $(seq 1 "$rounds"); do
  c2c=$("$build/bin/ferry-c2c" 2>/dev/null | sed -n 's/.*"round_trip_ns":\([0-9.]*\).*/\1/p')
  timeout 120 ucx_perftest -p $port -t ucp_am_lat -s 8 -n 1000000 > /dev/null 2>&1 &
  server=$!
  sleep 0.5
  lat=$(timeout 120 ucx_perftest -p $port -t ucp_am_lat -s 8 -n 1000000 127.0.0.1 2>/dev/null | awk '/Final:/ {print $5}')
  wait "$server"
  echo "{\"round\":$r,\"c2c_ns\":${c2c:-null},\"ucp_am_lat_us\":${lat:-null}}" >> "$raw"
  for arg in "--idle 0" "--idle 40" "--idle 160" "--after 100" "--after 400" "--work 40" "--work 60"; do
    line=$(timeout 120 "$build/bin/ferry-ucp-pingpong" --iters 1000000 $arg --json 2>/dev/null | tail -1)
    c2c_after=$("$build/bin/ferry-c2c" 2>/dev/null | sed -n 's/.*"round_trip_ns":\([0-9.]*\).*/\1/p')
    echo "{\"round\":$r,\"c2c_ns\":${c2c:-null},\"c2c_after_ns\":${c2c_after:-null},\"run\":\"$arg\",\"result\":${line:-null}}" >> "$raw"
    c2c=$c2c_after
  done
done
tmp=$(mktemp -d)
g++ -O2 -std=c++20 -Iinclude "$here/ferry_idle.cpp" -o "$tmp/ferry_idle" -L"$build/lib" -lferry -Wl,-rpath,"$PWD/$build/lib"
g++ -O2 "$here/ucp_idle.cpp" -o "$tmp/ucp_idle" -lucp -lucs
{ FERRY_TRANSPORT=ucx FERRY_LOCK_MODEL=serialized timeout 120 "$build/bin/ferryrun" -n 2 "$tmp/ferry_idle"
  timeout 120 "$tmp/ucp_idle"; } > "$here/idle.txt" 2>&1
rm -rf "$tmp"
rm -f /dev/shm/ucx_shm_posix_* 2>/dev/null
/usr/bin/python3 - "$raw" "$here/summary.md" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
runs = ["--idle 0", "--idle 40", "--idle 160", "--after 100", "--after 400", "--work 40", "--work 60"]
by = {}
ns = {}
for d in rows:
    if "run" not in d or not d.get("result") or d["c2c_ns"] is None or d["c2c_after_ns"] is None:
        continue
    place = "close" if d["c2c_ns"] < 250 else "apart"
    if place != ("close" if d["c2c_after_ns"] < 250 else "apart"):
        continue  # the vCPUs moved during the run
    by.setdefault(place, {}).setdefault(d["run"], []).append(d["result"]["half_rtt_us"])
    res = d["result"]
    key = d["run"].split()[0][2:]
    ns.setdefault(d["run"], []).append(res.get(key + "_ns", 0.0))
out = ["# ferry-ucp-pingpong: polling-loop length, work after and before the answer", "",
       "At %s." % sys.argv[3], "",
       "Median half round trip (us) per placement of the two vCPUs (cache-line round trip under 250 ns: close);",
       "in brackets, over --idle 0 of the same placement. The loop's own time per run in the last line.", "",
       "| placement | runs kept | " + " | ".join(runs) + " |", "|---" * (2 + len(runs)) + "|"]
for place, d in sorted(by.items()):
    if "--idle 0" not in d:
        continue
    base = statistics.median(d["--idle 0"])
    cells = ["%.3f (%.2fx)" % (statistics.median(d[k]), statistics.median(d[k]) / base) if k in d else "n/a" for k in runs]
    out.append("| %s | %s | %s |" % (place, "/".join(str(len(d.get(k, []))) for k in runs), " | ".join(cells)))
out += ["", "Loop time alone (median ns): " + ", ".join("%s: %.1f" % (k, statistics.median(v)) for k, v in ns.items())]
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
