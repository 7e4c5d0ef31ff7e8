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
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import c2c_probe, git_rev, int_list, last_json, missing_program, name_list, positive, results_dir, run_in_group  # noqa: E402

OPS = ["barrier", "bcast", "reduce", "allreduce", "allgather", "alltoall", "reduce_scatter"]
SIZES = [8, 1024, 65536, 1 << 20, 4 << 20]
IMPLS = ["ferry", "mpich", "openmpi"]
PROGRAMS = {"ferry": "ferry-bench", "mpich": "ferry-mpi-coll", "openmpi": "ferry-mpi-coll-openmpi"}


def command(impl, bin_dir, ranks, op, size, iters):
    args = ["--op", op, "--size", str(size), "--json", "--reps", "5", "--iters", str(iters), "--warmup", str(max(10, iters // 10))]
    if impl == "ferry":
        return [f"{bin_dir}/ferryrun", "-n", str(ranks), "--timeout", "300", "--", f"{bin_dir}/ferry-bench", "coll"] + args
    if impl == "mpich":
        return ["mpiexec.hydra", "-n", str(ranks), f"{bin_dir}/ferry-mpi-coll"] + args
    return ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-n", str(ranks), f"{bin_dir}/ferry-mpi-coll-openmpi"] + args


def run(cmd, op):
    """One job's result (its last JSON line naming `op`), or None; a job past 10 minutes is
    killed with its whole process group (launcher and ranks)."""
    rc, out, _, _ = run_in_group(cmd, dict(os.environ), 600)
    return last_json(out, op, key="op") if rc == 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default="build/bin")
    ap.add_argument("--ranks", type=lambda t: int_list(t, "--ranks", 1), default=[2, 4, 8])
    ap.add_argument("--ops", type=name_list(OPS), default=OPS)
    ap.add_argument("--sizes", type=lambda t: int_list(t, "--sizes", 0), default=SIZES)
    ap.add_argument("--impls", type=name_list(IMPLS), default=IMPLS)
    ap.add_argument("--reps", type=positive, default=5)
    ap.add_argument("--iters", type=positive, default=500)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.quick:
        a.reps, a.iters, a.sizes = 1, 100, [8, 65536]
    ranks, ops, sizes, impls = a.ranks, a.ops, a.sizes, a.impls
    missing = missing_program(a.bin_dir, ["ferryrun", "ferry-c2c"] + [PROGRAMS[i] for i in impls], "scripts/bench.sh --coll")
    if missing:
        sys.exit(f"coll.py: {missing}")
    out = str(results_dir(a.out, "coll", "%Y%m%d-%H%M%S"))
    cores = os.cpu_count() or 1
    c2c = c2c_probe(a.bin_dir)
    raw = open(os.path.join(out, "raw.jsonl"), "w")
    rows = []
    for n in ranks:
        for op in ops:
            for size in sizes if op != "barrier" else [0]:
                got = {i: [] for i in impls}
                for rep in range(a.reps):
                    for impl in (impls if rep % 2 == 0 else list(reversed(impls))):
                        j = run(command(impl, a.bin_dir, n, op, size, a.iters), op)
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
        f.write("# Collectives: ferry beside MPICH and Open MPI, one host\n\n")
        placed = f"vCPUs' cache-line round trip {c2c:.0f} ns at the start" if c2c else "placement not measured"
        f.write(f"Commit {git_rev()}. Median over {a.reps} alternating runs of each run's median time per operation "
                f"(µs, the slowest rank's); {cores} cores, so more ranks are oversubscribed; {placed}. ferry over "
                f"its default transport (shm).\n\n")
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
