#!/usr/bin/python3
"""Collectives beside MPI: ferry-bench coll against ferry-mpi-coll under MPICH (mpiexec.hydra) and
Open MPI (mpirun.openmpi), every operation and size at 2, 4 and 8 ranks on this host. Each
(ranks, op, size) runs the implementations alternately --reps times; a run reports the median
time per operation of its own repetitions (the slowest rank's, OSU-style), and the table shows
the median over the runs and ferry's ratio to the better MPI. Ranks beyond the cores are
oversubscribed, and the table says so. Writes table.md, results.csv, raw.jsonl and plot.png
under --out.

  scripts/bench.sh --coll                       # 2, 4, 8 ranks; 8 B to 4 MiB; 5 alternating runs
  scripts/bench.sh --coll --quick               # one run, fewer sizes: a smoke test
  /usr/bin/python3 bench/coll.py --ranks 2,4 --ops barrier,allreduce --sizes 8 --reps 3 --out results/x
"""
import argparse
import csv
import datetime
import json
import os
import statistics
import subprocess
import sys

OPS = ["barrier", "bcast", "reduce", "allreduce", "allgather", "alltoall", "reduce_scatter"]
SIZES = [8, 1024, 65536, 1 << 20, 4 << 20]


def command(impl, bin_dir, ranks, op, size, iters):
    args = ["--op", op, "--size", str(size), "--json", "--reps", "5", "--iters", str(iters), "--warmup", str(max(10, iters // 10))]
    if impl == "ferry":
        return [f"{bin_dir}/ferryrun", "-n", str(ranks), "--timeout", "300", "--", f"{bin_dir}/ferry-bench", "coll"] + args
    if impl == "mpich":
        return ["mpiexec.hydra", "-n", str(ranks), f"{bin_dir}/ferry-mpi-coll"] + args
    return ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-n", str(ranks), f"{bin_dir}/ferry-mpi-coll-openmpi"] + args


def run(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stdout
    except subprocess.TimeoutExpired:
        return None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("[0] "):
            line = line[4:]
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                pass
    return None


def placement(bin_dir):
    out = subprocess.run([f"{bin_dir}/ferry-c2c"], capture_output=True, text=True).stdout
    try:
        return json.loads(out.strip().splitlines()[-1])["round_trip_ns"]
    except (IndexError, KeyError, json.JSONDecodeError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default="build/bin")
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--impls", default="ferry,mpich,openmpi")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.quick:
        a.reps, a.iters, a.sizes = 1, 100, "8,65536"
    ranks = [int(r) for r in a.ranks.split(",")]
    ops = a.ops.split(",")
    sizes = [int(s) for s in a.sizes.split(",")]
    impls = a.impls.split(",")
    for op in ops:
        if op not in OPS:
            sys.exit(f"coll.py: --ops: '{op}' is not one of {', '.join(OPS)}")
    out = a.out or "results/coll-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    os.makedirs(out, exist_ok=True)
    cores = os.cpu_count() or 1
    c2c = placement(a.bin_dir)
    raw = open(os.path.join(out, "raw.jsonl"), "w")
    rows = []
    for n in ranks:
        for op in ops:
            for size in sizes if op != "barrier" else [0]:
                got = {i: [] for i in impls}
                for rep in range(a.reps):
                    for impl in (impls if rep % 2 == 0 else list(reversed(impls))):
                        j = run(command(impl, a.bin_dir, n, op, size, a.iters))
                        if j is not None:
                            j.update(impl=impl, run=rep)
                            raw.write(json.dumps(j) + "\n")
                            raw.flush()
                            got[impl].append(j["latency_us"])
                row = {"ranks": n, "op": op, "size": size, "oversubscribed": n > cores}
                for impl in impls:
                    row[impl] = statistics.median(got[impl]) if got[impl] else None
                mpis = [row[i] for i in impls if i != "ferry" and row.get(i) is not None]
                row["ratio"] = row["ferry"] / min(mpis) if row.get("ferry") and mpis else None
                rows.append(row)
                print(json.dumps(row), flush=True)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(f"# Collectives: ferry beside MPICH and Open MPI, one host\n\n")
        f.write(f"Median over {a.reps} alternating runs of each run's median time per operation (µs, the "
                f"slowest rank's); {cores} cores, so more ranks are oversubscribed; vCPUs' cache-line "
                f"round trip {c2c:.0f} ns at the start. ferry over its default transport (shm).\n\n" if c2c else "\n")
        f.write("| ranks | op | size (B) | ferry | MPICH | Open MPI | ferry / better MPI |\n|---|---|---|---|---|---|---|\n")
        for r in rows:
            cell = lambda v: f"{v:.2f}" if v is not None else "—"
            f.write(f"| {r['ranks']}{' (oversubscribed)' if r['oversubscribed'] else ''} | {r['op']} | {r['size']} | "
                    f"{cell(r.get('ferry'))} | {cell(r.get('mpich'))} | {cell(r.get('openmpi'))} | "
                    f"{cell(r['ratio'])} |\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(len(ranks), len(ops), figsize=(3 * len(ops), 2.6 * len(ranks)), squeeze=False)
        for i, n in enumerate(ranks):
            for k, op in enumerate(ops):
                ax = axes[i][k]
                for impl in impls:
                    pts = [(r["size"] or 1, r[impl]) for r in rows if r["ranks"] == n and r["op"] == op and r.get(impl)]
                    if pts:
                        ax.loglog(*zip(*pts), marker="o", label=impl)
                ax.set_title(f"{op}, {n} ranks", fontsize=8)
                ax.tick_params(labelsize=6)
        axes[0][0].legend(fontsize=6)
        fig.supylabel("µs per operation")
        fig.supxlabel("bytes")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "plot.png"), dpi=110)
    except ImportError:
        print("coll.py: no matplotlib for /usr/bin/python3: no plot", file=sys.stderr)
    print(f"coll.py: wrote {out}/table.md, results.csv, raw.jsonl, plot.png")


if __name__ == "__main__":
    main()
