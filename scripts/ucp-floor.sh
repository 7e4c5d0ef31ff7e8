#!/usr/bin/env bash
# The floor under ferry's 8 B latency over UCX. In alternating rounds on this host: ucx_perftest
# ucp_am_lat; ferry-ucp-pingpong (a bare UCP ping-pong set up as ferry's ucx backend, 24-byte
# messages answered inside UCX's callback) with increasing --work before each answer; and
# ferry-bench pingpong --inbox reply over UCX under FERRY_LOCK_MODEL=serialized (the handler
# answers inside UCX's callback). Each round first measures the cache-line round trip between
# the two CPUs (ferry-c2c), which tells where the hypervisor placed them this time.
#
# Usage: scripts/ucp-floor.sh [--rounds 5] [--iters 1000000] [--work 0,20,40,60,100,200]
#                             [--build build] [--out results/ucp-floor-<timestamp>]
# Needs a build with UCX (cmake -S . -B build && cmake --build build) and ucx_perftest
# (ucx-utils). Writes raw.jsonl (one line per run) and summary.md (ratios per round).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5 iters=1000000 work=0,20,40,60,100,200 build=build out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
    *) echo "ucp-floor.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for n in "$rounds" "$iters"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "ucp-floor.sh: --rounds and --iters take a positive integer, not '$n'" >&2; exit 2; }
done
[[ "$work" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "ucp-floor.sh: --work takes a list like 0,20,60, not '$work'" >&2; exit 2; }
for prog in ferry-ucp-pingpong ferry-bench ferryrun ferry-c2c; do
  [ -x "$build/bin/$prog" ] || { echo "ucp-floor.sh: $build/bin/$prog is missing (build ferry with UCX first)" >&2; exit 1; }
done
command -v ucx_perftest > /dev/null || { echo "ucp-floor.sh: ucx_perftest is missing (apt-get install ucx-utils)" >&2; exit 1; }
out=${out:-results/ucp-floor-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)

# ucx_perftest's shared-memory files: the ones this script's runs leave are removed at the end.
shm_before=$(mktemp)
ls /dev/shm > "$shm_before" 2>/dev/null || true
server=""
cleanup() {
  set +e  # clean-up must not turn a finished run into a failed one
  [ -n "$server" ] && kill "$server" 2> /dev/null
  comm -13 "$shm_before" <(ls /dev/shm 2>/dev/null | sort) 2>/dev/null | grep '^ucx_' | sed 's|^|/dev/shm/|' | xargs -r rm -f
  rm -f "$shm_before"
}
trap cleanup EXIT
sort -o "$shm_before" "$shm_before"

port=$((20000 + RANDOM % 20000))
for r in $(seq 1 "$rounds"); do
  c2c=$("$build/bin/ferry-c2c" 2>/dev/null | sed -n 's/.*"round_trip_ns":\([0-9.]*\).*/\1/p')
  echo "{\"round\":$r,\"implementation\":\"c2c\",\"round_trip_ns\":${c2c:-null}}" >> "$raw"
  # ucx_perftest: server in the background, client on 127.0.0.1; field 5 of "Final:" is the
  # overall mean one-way latency (us).
  timeout 120 ucx_perftest -p "$port" -t ucp_am_lat -s 8 -n "$iters" > /dev/null 2>&1 &
  server=$!
  sleep 0.5
  lat=$(timeout 120 ucx_perftest -p "$port" -t ucp_am_lat -s 8 -n "$iters" 127.0.0.1 2>/dev/null | awk '/Final:/ {print $5}')
  wait "$server" || true
  server=""
  echo "{\"round\":$r,\"implementation\":\"ucp_am_lat\",\"half_rtt_us\":${lat:-null}}" >> "$raw"
  for w in ${work//,/ }; do
    line=$(timeout 120 "$build/bin/ferry-ucp-pingpong" --iters "$iters" --work "$w" --json 2>/dev/null | tail -1 || true)
    echo "{\"round\":$r,\"implementation\":\"ucp_pingpong\",\"result\":${line:-null}}" >> "$raw"
  done
  line=$(FERRY_TRANSPORT=ucx FERRY_LOCK_MODEL=serialized timeout 120 "$build/bin/ferryrun" -n 2 -- \
           "$build/bin/ferry-bench" pingpong --size 8 --iters "$iters" --inbox reply --json 2>/dev/null | grep -o '{.*}' | tail -1 || true)
  echo "{\"round\":$r,\"implementation\":\"ferry_ucx_serialized_reply\",\"result\":${line:-null}}" >> "$raw"
  echo "ucp-floor.sh: round $r of $rounds done (cache-line round trip ${c2c:-?} ns)" >&2
done

/usr/bin/env python3 - "$raw" "$out/summary.md" "$commit" "$iters" <<'EOF'
import json, statistics, sys
raw, dest, commit, iters = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rounds = {}
for line in open(raw):
    d = json.loads(line)
    r = rounds.setdefault(d["round"], {})
    impl = d["implementation"]
    if impl == "c2c":
        r["c2c"] = d.get("round_trip_ns")
    elif impl == "ucp_am_lat":
        r["ucp_am_lat"] = d.get("half_rtt_us")
    elif impl == "ucp_pingpong" and d.get("result"):
        res = d["result"]
        r["work %d" % res["work"]] = res["half_rtt_us"]
        r.setdefault("work_ns", {})[res["work"]] = res["work_ns"]
    elif impl.startswith("ferry") and d.get("result"):
        r["ferry"] = d["result"].get("half_rtt_us")
cols = []
for r in rounds.values():
    for k in r:
        if k not in ("c2c", "ucp_am_lat", "work_ns") and k not in cols:
            cols.append(k)
cols.sort(key=lambda k: (k == "ferry", int(k.split()[1]) if k.startswith("work") else 0))
out = ["# ferry-ucp-pingpong and ferry over UCX against ucp_am_lat, per round", "",
       "ferry at %s; %s round trips per run." % (commit, iters), "",
       "One-way latency (half round trip) over ucp_am_lat's in the same round. `work N`: the bare UCP "
       "ping-pong with N empty-loop iterations before each answer (their own time in the last table); "
       "`ferry`: ferry-bench pingpong --inbox reply, FERRY_LOCK_MODEL=serialized.", "",
       "| round | cache-line round trip (ns) | ucp_am_lat (us) | " + " | ".join(cols) + " |",
       "|---" * (3 + len(cols)) + "|"]
by_place = {}
for n, r in sorted(rounds.items()):
    base = r.get("ucp_am_lat")
    cells = []
    for k in cols:
        v = r.get(k)
        cells.append("%.3fx" % (v / base) if v and base else "n/a")
        if v and base and r.get("c2c"):
            by_place.setdefault("close" if r["c2c"] < 250 else "apart", {}).setdefault(k, []).append(v / base)
    out.append("| %d | %s | %s | %s |" % (n, "%.0f" % r["c2c"] if r.get("c2c") else "n/a",
                                         "%.3f" % base if base else "n/a", " | ".join(cells)))
out += ["", "Median ratio by placement (cache-line round trip under 250 ns: the CPUs close):", "",
        "| placement | rounds | " + " | ".join(cols) + " |", "|---" * (2 + len(cols)) + "|"]
for place, d in sorted(by_place.items()):
    n = max(len(v) for v in d.values())
    out.append("| %s | %d | %s |" % (place, n, " | ".join("%.3fx" % statistics.median(d[k]) if k in d else "n/a" for k in cols)))
wns = {}
for r in rounds.values():
    for w, ns in r.get("work_ns", {}).items():
        wns.setdefault(w, []).append(ns)
out += ["", "The work loop alone (median ns per answer): " +
        ", ".join("%d: %.1f" % (w, statistics.median(v)) for w, v in sorted(wns.items()))]
open(dest, "w").write("\n".join(out) + "\n")
print("\n".join(out))
EOF
echo "ucp-floor.sh: $raw, $out/summary.md" >&2
