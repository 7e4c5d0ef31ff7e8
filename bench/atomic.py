#!/usr/bin/python3
"""Remote atomics beside UCX: ferry-bench atomic (rank 0 on rank 1's word) against ucx_perftest's
ucp_fadd, ucp_cswap and ucp_swap, on this host, 2 processes. ferry runs over its own shared
memory and over UCX (UCX_TLS=sm,self), on an allocated word (Device::allocate_memory: mapped by
the peer, a CPU atomic in the post) and on a registered one (the application's memory: the
atomic goes by message and the owner's progress performs it); ucx_perftest over UCX_TLS=sm,self
on the memory it maps itself. Latency: one atomic at a time, the full time per operation (what
ucx_perftest reports for these tests, its "overall" average). Each (op, configuration) runs
alternately --reps times; the table shows the median over runs and ferry's ratio to UCX.
Writes table.md, results.csv and raw.jsonl under --out.

  scripts/bench.sh --coll           # the collectives, then this (atomics), 5 alternating runs
  /usr/bin/python3 bench/atomic.py --reps 3 --out results/x
"""
import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import c2c_probe, git_rev, last_json, missing_program, name_list, positive, results_dir, run_in_group  # noqa: E402
from compare import free_port, listening  # noqa: E402

OPS = {"fetch_add": "ucp_fadd", "cswap": "ucp_cswap", "swap": "ucp_swap"}
# (name, environment, ferry-bench --memory); None: ucx_perftest.
CONFIGS = [
    ("ferry shm, allocated", {"FERRY_TRANSPORT": "shm"}, "allocated"),
    ("ferry shm, registered", {"FERRY_TRANSPORT": "shm"}, "registered"),
    ("ferry ucx sm, allocated", {"FERRY_TRANSPORT": "ucx", "UCX_TLS": "sm,self"}, "allocated"),
    ("ferry ucx sm, registered", {"FERRY_TRANSPORT": "ucx", "UCX_TLS": "sm,self"}, "registered"),
    ("ucx_perftest sm", {"UCX_TLS": "sm,self"}, None),
]


def ucx_perftest(test, iters, env):
    """ucx_perftest server and client on localhost; the client's CSV result line (-f -v:
    iterations, percentile, average and overall latency, ...), or None."""
    port = free_port()
    common = ["-p", str(port), "-f", "-v", "-t", test, "-n", str(iters), "-w", str(max(100, iters // 10))]
    server = subprocess.Popen(["ucx_perftest"] + common, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.time() + 20
        while not listening(port) and time.time() < deadline and server.poll() is None:
            time.sleep(0.02)
        rc, out, _, _ = run_in_group(["ucx_perftest", "127.0.0.1"] + common, env, 120)
    finally:
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()
    if rc != 0:
        return None
    rows = []
    for line in out.splitlines():
        fields = line.strip().split(",")
        try:
            rows.append([float(x) for x in fields])
        except ValueError:
            continue
    rows = [r for r in rows if len(r) == 8]
    if not rows:
        return None
    f = rows[-1]
    return {"bench": "ucx_perftest", "test": test, "latency_us": f[3], "latency_percentile_us": f[1], "ops_per_s": f[7]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default="build/bin")
    ap.add_argument("--ops", type=name_list(list(OPS)), default=list(OPS))
    ap.add_argument("--reps", type=positive, default=5)
    ap.add_argument("--iters", type=positive, default=100000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.quick:
        a.reps, a.iters = 1, 10000
    missing = missing_program(a.bin_dir, ["ferryrun", "ferry-bench", "ferry-c2c"], "scripts/bench.sh --coll")
    if missing:
        sys.exit(f"atomic.py: {missing}")
    have_ucx = shutil.which("ucx_perftest") is not None
    out = str(results_dir(a.out, "atomic", "%Y%m%d-%H%M%S"))
    c2c = c2c_probe(a.bin_dir)
    raw = open(os.path.join(out, "raw.jsonl"), "w")
    rows = []
    for op in a.ops:
        got = {name: [] for name, _, _ in CONFIGS}
        for rep in range(a.reps):
            order = CONFIGS if rep % 2 == 0 else list(reversed(CONFIGS))
            for name, extra, memory in order:
                env = dict(os.environ)
                env.update(extra)
                if memory is None:
                    if not have_ucx:
                        continue
                    j = ucx_perftest(OPS[op], a.iters, env)
                else:
                    cmd = [f"{a.bin_dir}/ferryrun", "-n", "2", "--timeout", "120", "--", f"{a.bin_dir}/ferry-bench", "atomic",
                           "--op", op, "--memory", memory, "--iters", str(a.iters // 5), "--json"]
                    rc, text, _, _ = run_in_group(cmd, env, 180)
                    j = last_json(text, op, key="op") if rc == 0 else None
                if j is None:
                    print(f"atomic.py: {name} {op} run {rep} failed", file=sys.stderr)
                    continue
                j.update(config=name, run=rep, op=op, env=extra)
                raw.write(json.dumps(j) + "\n")
                raw.flush()
                got[name].append(j)
        ucx = [j["latency_us"] for j in got["ucx_perftest sm"]]
        ucx_lat = statistics.median(ucx) if ucx else None
        for name, _, memory in CONFIGS:
            if not got[name]:
                continue
            lat = statistics.median(j["latency_us"] for j in got[name])
            rate = statistics.median(j["ops_per_s"] for j in got[name])
            row = {"op": op, "config": name, "path": got[name][0].get("path", "UCX"), "latency_us": lat, "ops_per_s": rate,
                   "ratio_to_ucx": lat / ucx_lat if ucx_lat else None, "runs": len(got[name])}
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("# Remote atomics: ferry beside ucx_perftest, one host, 2 processes\n\n")
        placed = f"vCPUs' cache-line round trip {c2c:.0f} ns at the start" if c2c else "placement not measured"
        f.write(f"Commit {git_rev()}. Median over {a.reps} alternating runs; latency is the full time per 64-bit "
                f"atomic, one at a time (µs); rate with 64 in flight for ferry, ucx_perftest's own for UCX; {placed}.\n\n")
        f.write("| op | configuration | path | latency (µs) | rate (M/s) | latency / UCX's |\n|---|---|---|---|---|---|\n")
        for r in rows:
            ratio = f"{r['ratio_to_ucx']:.2f}" if r["ratio_to_ucx"] else "—"
            f.write(f"| {r['op']} | {r['config']} | {r['path']} | {r['latency_us']:.3f} | {r['ops_per_s'] / 1e6:.2f} | {ratio} |\n")
    print(f"atomic.py: wrote {out}/table.md, results.csv, raw.jsonl")


if __name__ == "__main__":
    main()
