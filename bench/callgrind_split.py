#!/usr/bin/python3
"""Per-message instruction counts from ferry-am-cost's callgrind files, split by library
(ferry, libfabric, UCX, libc/libstdc++, other).

usage: callgrind_split.py MESSAGES SENDER.out RECEIVER.out [--json]
Sums the self cost (Ir) of every function by the object file it belongs to.
"""
import json
import re
import sys
from collections import defaultdict


def by_object(path):
    """Self Ir per object file: the 'ob=' in force for each cost line of an 'fn=' block."""
    names = {}  # callgrind compresses names: "(12) /usr/lib/libfabric.so" then "(12)"
    totals = defaultdict(int)
    ob = "?"
    in_call = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = re.match(r"^(c?ob)=(?:\((\d+)\))?\s*(.*)$", line)
            if m:
                kind, ident, name = m.groups()
                if ident and name:
                    names[ident] = name
                resolved = names.get(ident, name) if ident else name
                if kind == "ob":
                    ob = resolved
                continue
            if line.startswith("calls="):
                in_call = True  # the next cost line is inclusive cost of a call: skip it
                continue
            if line and (line[0].isdigit() or line[0] in "+-*"):
                if in_call:
                    in_call = False
                    continue
                parts = line.split()
                if len(parts) >= 2:
                    totals[ob] += int(parts[1])
    return totals


def group(obj):
    o = obj.lower()
    if "libfabric" in o:
        return "libfabric"
    if re.search(r"libuc[pstm]", o) or "/ucx/libuct" in o:
        return "ucx"
    if "libferry" in o or "ferry-am-cost" in o:
        return "ferry"
    if "libc.so" in o or "ld-linux" in o or "libstdc++" in o:
        return "libc/libstdc++"
    return "other"


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    n = int(sys.argv[1])
    out = {}
    for side, path in (("sender", sys.argv[2]), ("receiver", sys.argv[3])):
        groups = defaultdict(int)
        for obj, ir in by_object(path).items():
            groups[group(obj)] += ir
        total = sum(groups.values())
        out[side] = {"total": round(total / n, 1), **{k: round(v / n, 1) for k, v in sorted(groups.items())}}
    if "--json" in sys.argv:
        print(json.dumps(out))
        return
    print(f"instructions per 8-byte active message ({n} messages)")
    for side, row in out.items():
        rest = ", ".join(f"{k} {v}" for k, v in row.items() if k != "total")
        print(f"  {side:8s} {row['total']:8.1f}   ({rest})")


if __name__ == "__main__":
    main()
