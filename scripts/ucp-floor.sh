#!/usr/bin/env bash
# The floor under ferry's 8 B latency over UCX. In alternating rounds on this host: ucx_perftest
# ucp_am_lat; ferry-ucp-pingpong (a bare UCP ping-pong set up as ferry's ucx backend, 24-byte
# messages answered inside UCX's callback) with increasing --work before each answer; and
# ferry-bench pingpong --inbox reply over UCX under FERRY_LOCK_MODEL=serialized (the handler
# answers inside UCX's callback). Each round first measures the cache-line round trip between
# the two CPUs (ferry-c2c), which tells where the hypervisor placed them this time.
#
# --ucx system,DIR,... runs every round over each UCX in turn: `system` is the one on the
# default paths, DIR a UCX installed under DIR (its bin/ucx_perftest, and its lib/ put first on
# LD_LIBRARY_PATH, so ferry and the bare ping-pong load it: it must be the version ferry was
# built against, such as scripts/ucx-build.sh makes). A cache-line round trip after the round
# too tells whether the CPUs moved during it; such a round is left out of the medians.
#
# Usage: scripts/ucp-floor.sh [--rounds 5] [--iters 1000000] [--work 0,20,40,60,100,200]
#                             [--ucx system] [--build build] [--out results/ucp-floor-<timestamp>]
# Needs a build with UCX (cmake -S . -B build && cmake --build build) and ucx_perftest
# (ucx-utils). Writes raw.jsonl (one line per run) and summary.md (ratios per round).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5 iters=1000000 work=0,20,40,60,100,200 ucx=system build=build out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds|--iters|--work|--ucx|--build|--out)
      [ $# -ge 2 ] || { echo "ucp-floor.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;
  esac
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --ucx) ucx=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
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
ucx_list=()
IFS=, read -r -a ucx_list <<< "$ucx"
[ ${#ucx_list[@]} -gt 0 ] || { echo "ucp-floor.sh: --ucx takes a list like system,build/ucx-noassert, not '$ucx'" >&2; exit 2; }
for u in "${ucx_list[@]}"; do
  if [ "$u" = system ]; then
    command -v ucx_perftest > /dev/null || { echo "ucp-floor.sh: ucx_perftest is missing (apt-get install ucx-utils)" >&2; exit 1; }
  elif [ ! -x "$u/bin/ucx_perftest" ] || [ ! -e "$u/lib/libucp.so.0" ]; then
    echo "ucp-floor.sh: --ucx $u is not a UCX installation (no $u/bin/ucx_perftest or $u/lib/libucp.so.0)" >&2; exit 2
  fi
done
ucx_label() { if [ "$1" = system ]; then echo system; else basename "$(realpath "$1")"; fi; }
labels=$(for u in "${ucx_list[@]}"; do ucx_label "$u"; done)
dup=$(sort <<< "$labels" | uniq -d | head -1)
[ -z "$dup" ] || { echo "ucp-floor.sh: --ucx names '$dup' twice (entries are told apart by their last path component)" >&2; exit 2; }
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
c2c() { "$build/bin/ferry-c2c" 2>/dev/null | sed -n 's/.*"round_trip_ns":\([0-9.]*\).*/\1/p'; }
for r in $(seq 1 "$rounds"); do
  c2c_before=$(c2c)
  echo "{\"round\":$r,\"implementation\":\"c2c\",\"round_trip_ns\":${c2c_before:-null}}" >> "$raw"
  for u in "${ucx_list[@]}"; do
    # The environment this UCX runs in: nothing added for `system`, its bin/ and lib/ first for a DIR.
    if [ "$u" = system ]; then
      E=(env)
    else
      d=$(realpath "$u")
      E=(env "PATH=$d/bin:$PATH" "LD_LIBRARY_PATH=$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
    fi
    label=$(ucx_label "$u")
    # ucx_perftest: server in the background, client on 127.0.0.1; field 5 of "Final:" is the
    # overall mean one-way latency (us).
    timeout 120 "${E[@]}" ucx_perftest -p "$port" -t ucp_am_lat -s 8 -n "$iters" > /dev/null 2>&1 &
    server=$!
    sleep 0.5
    lat=$(timeout 120 "${E[@]}" ucx_perftest -p "$port" -t ucp_am_lat -s 8 -n "$iters" 127.0.0.1 2>/dev/null | awk '/Final:/ {print $5}')
    wait "$server" || true
    server=""
    echo "{\"round\":$r,\"ucx\":\"$label\",\"implementation\":\"ucp_am_lat\",\"half_rtt_us\":${lat:-null}}" >> "$raw"
    for w in ${work//,/ }; do
      line=$(timeout 120 "${E[@]}" "$build/bin/ferry-ucp-pingpong" --iters "$iters" --work "$w" --json 2>/dev/null | tail -1 || true)
      echo "{\"round\":$r,\"ucx\":\"$label\",\"implementation\":\"ucp_pingpong\",\"result\":${line:-null}}" >> "$raw"
    done
    line=$(timeout 120 "${E[@]}" FERRY_TRANSPORT=ucx FERRY_LOCK_MODEL=serialized "$build/bin/ferryrun" -n 2 -- \
             "$build/bin/ferry-bench" pingpong --size 8 --iters "$iters" --inbox reply --json 2>/dev/null | grep -o '{.*}' | tail -1 || true)
    echo "{\"round\":$r,\"ucx\":\"$label\",\"implementation\":\"ferry_ucx_serialized_reply\",\"result\":${line:-null}}" >> "$raw"
  done
  c2c_after=$(c2c)
  echo "{\"round\":$r,\"implementation\":\"c2c_after\",\"round_trip_ns\":${c2c_after:-null}}" >> "$raw"
  echo "ucp-floor.sh: round $r of $rounds done (cache-line round trip ${c2c_before:-?} ns before, ${c2c_after:-?} ns after)" >&2
done

/usr/bin/env python3 - "$raw" "$out/summary.md" "$commit" "$iters" <<'EOF'
import json, statistics, sys
raw, dest, commit, iters = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rounds, ucxs = {}, []
for line in open(raw):
    d = json.loads(line)
    r = rounds.setdefault(d["round"], {"runs": {}})
    impl = d["implementation"]
    if impl in ("c2c", "c2c_after"):
        r[impl] = d.get("round_trip_ns")
        continue
    u = d.get("ucx", "system")
    if u not in ucxs:
        ucxs.append(u)
    runs = r["runs"].setdefault(u, {})
    if impl == "ucp_am_lat":
        runs["ucp_am_lat"] = d.get("half_rtt_us")
    elif impl == "ucp_pingpong" and d.get("result"):
        res = d["result"]
        runs["work %d" % res["work"]] = res["half_rtt_us"]
        r.setdefault("work_ns", {})[res["work"]] = res["work_ns"]
    elif impl.startswith("ferry") and d.get("result"):
        runs["ferry"] = d["result"].get("half_rtt_us")


def placement(r):
    """close, apart or moved, from the cache-line round trips before and after the round."""
    a, b = r.get("c2c"), r.get("c2c_after")
    if a is None:
        return None
    sides = {x < 250 for x in (a, b) if x is not None}
    return "moved" if len(sides) > 1 else ("close" if a < 250 else "apart")


cols = []
for r in rounds.values():
    for runs in r["runs"].values():
        for k in runs:
            if k != "ucp_am_lat" and k not in cols:
                cols.append(k)
cols.sort(key=lambda k: (k == "ferry", int(k.split()[1]) if k.startswith("work") else 0))
out = ["# ferry-ucp-pingpong and ferry over UCX against ucp_am_lat, per round", "",
       "ferry at %s; %s round trips per run; UCX: %s." % (commit, iters, ", ".join(ucxs)), "",
       "One-way latency (half round trip) over ucp_am_lat's in the same round and over the same UCX. "
       "`work N`: the bare UCP ping-pong with N empty-loop iterations before each answer (their own "
       "time in the last table); `ferry`: ferry-bench pingpong --inbox reply, "
       "FERRY_LOCK_MODEL=serialized. Placement: both cache-line round trips (before and after the "
       "round) under 250 ns is `close`, both over is `apart`, else `moved` (left out of the medians)."]
medians = {}
for u in ucxs:
    out += ["", "## UCX: %s" % u, "",
            "| round | cache-line round trip (ns) | placement | ucp_am_lat (us) | " + " | ".join(cols) + " |",
            "|---" * (4 + len(cols)) + "|"]
    for n, r in sorted(rounds.items()):
        runs = r["runs"].get(u, {})
        base, place = runs.get("ucp_am_lat"), placement(r)
        cells = []
        for k in cols:
            v = runs.get(k)
            cells.append("%.3fx" % (v / base) if v and base else "n/a")
            if v and base and place in ("close", "apart"):
                medians.setdefault((u, place), {}).setdefault(k, []).append(v / base)
        if base and place in ("close", "apart"):
            medians.setdefault((u, place), {}).setdefault("ucp_am_lat", []).append(base)
        trips = "/".join("%.0f" % r[x] for x in ("c2c", "c2c_after") if r.get(x) is not None) or "n/a"
        out.append("| %d | %s | %s | %s | %s |" % (n, trips, place or "n/a", "%.3f" % base if base else "n/a",
                                                   " | ".join(cells)))
out += ["", "Median ratio by UCX and placement (ucp_am_lat: its median latency):", "",
        "| UCX | placement | rounds | ucp_am_lat (us) | " + " | ".join(cols) + " |", "|---" * (4 + len(cols)) + "|"]
for (u, place), d in sorted(medians.items(), key=lambda kv: (ucxs.index(kv[0][0]), kv[0][1])):
    lat = d.get("ucp_am_lat", [])
    out.append("| %s | %s | %d | %s | %s |" % (u, place, len(lat), "%.3f" % statistics.median(lat) if lat else "n/a",
                                             " | ".join("%.3fx" % statistics.median(d[k]) if k in d else "n/a" for k in cols)))
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
