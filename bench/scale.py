#!/usr/bin/env python3
"""Start-up time and peak memory per rank of a job of N ranks on this machine: ferry beside
MPICH and Open MPI.

Each job is ferry-startup (ferry::Runtime, one barrier, finalize) or ferry-mpi-startup (MPI_Init,
MPI_Barrier, MPI_Finalize), started by its own launcher: ferryrun, mpiexec.hydra, mpirun.openmpi.
A job's start-up is the launcher's wall time, from its start to the exit of its last rank; its
memory the median rank's peak resident set (getrusage after finalize), and after the barrier
its resident set by kind and its proportional set size (bench/rss_parts.hpp). Repetitions
interleave the implementations, so a slow minute of the machine falls on all of them; the
tables give medians.

Implementations (--impls):
  ferry-shm        FERRY_TRANSPORT=auto on one host: ferry's shared memory.
  ferry-ofi-tcp    --hosts "hosts" by FERRY_HOST (ranks split evenly), libfabric's tcp provider
                   between them (FERRY_NETWORK=ofi, FERRY_OFI_PROVIDER=tcp), shm within each.
  ferry-ucx-tcp    the same with FERRY_NETWORK=ucx, UCX_TLS=tcp,self between hosts.
  mpich            ferry-mpi-startup under mpiexec.hydra, its default devices.
  openmpi          ferry-mpi-startup-openmpi under mpirun.openmpi --oversubscribe, its defaults.

  /usr/bin/python3 bench/scale.py --ranks 2,16,64 --reps 3
Results in results/scale-<stamp>/: raw.jsonl (every job, every rank's line), summary.json,
table.md.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402

IMPLS = ["ferry-shm", "ferry-ofi-tcp", "ferry-ucx-tcp", "mpich", "openmpi"]
NAMES = {"ferry-shm": "ferry shm", "ferry-ofi-tcp": "ferry ofi tcp", "ferry-ucx-tcp": "ferry ucx tcp",
         "mpich": "MPICH", "openmpi": "Open MPI"}


def command(impl, n, args, bin_dir):
    """(argv, extra environment) of one job."""
    env = {}
    if impl.startswith("ferry"):
        prog = [str(bin_dir / "ferry-startup")]
        if impl != "ferry-shm":
            per_host = max(1, -(-n // args.hosts))  # ceil: --hosts hosts at most
            env["FERRY_SCALE_RANKS_PER_HOST"] = str(per_host)
            env["FERRY_TRANSPORT"] = "auto"
            if impl == "ferry-ofi-tcp":
                env.update({"FERRY_NETWORK": "ofi", "FERRY_OFI_PROVIDER": "tcp"})
            else:
                env.update({"FERRY_NETWORK": "ucx", "UCX_TLS": "tcp,self"})
            prog = ["sh", "-c", 'FERRY_HOST="host$((PMI_RANK / FERRY_SCALE_RANKS_PER_HOST))" exec "$0" "$@"'] + prog
        return [str(bin_dir / "ferryrun"), "-n", str(n), "--timeout", str(args.timeout), "--no-prefix", "--"] + prog, env
    if impl == "mpich":
        env["MPIEXEC_TIMEOUT"] = str(args.timeout)
        return [args.mpiexec, "-n", str(n), str(bin_dir / "ferry-mpi-startup")], env
    return [args.mpirun_openmpi, "--allow-run-as-root", "--oversubscribe", "-n", str(n),
            str(bin_dir / "ferry-mpi-startup-openmpi")], env


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=lambda t: benchkit.int_list(t, "--ranks", 1), default=[2, 16, 64])
    ap.add_argument("--reps", type=benchkit.positive, default=3)
    ap.add_argument("--impls", type=benchkit.name_list(IMPLS), default=IMPLS)
    ap.add_argument("--hosts", type=benchkit.positive, default=8, help="FERRY_HOST groups of the network runs")
    ap.add_argument("--timeout", type=benchkit.positive, default=300, help="seconds per job")
    ap.add_argument("--bin", default=str(benchkit.ROOT / "build" / "bin"))
    ap.add_argument("--mpiexec", default="mpiexec.hydra")
    ap.add_argument("--mpirun-openmpi", default="mpirun.openmpi")
    ap.add_argument("--out", help="results folder (default results/scale-<stamp>)")
    args = ap.parse_args()
    bin_dir = Path(args.bin)
    progs = ["ferryrun", "ferry-startup"] if any(i.startswith("ferry") for i in args.impls) else []
    progs += ["ferry-mpi-startup"] if "mpich" in args.impls else []
    progs += ["ferry-mpi-startup-openmpi"] if "openmpi" in args.impls else []
    missing = benchkit.missing_program(bin_dir, progs, "cmake --build build")
    if missing:
        ap.error(missing)
    out = benchkit.results_dir(args.out, "scale", "%Y%m%d-%H%M%S")
    raw = open(out / "raw.jsonl", "w")
    jobs = {}  # (impl, n) -> list of (wall, median rss KiB, median init s)
    load_start = os.getloadavg()[0]
    c2c_start = benchkit.c2c_probe(bin_dir)  # the vCPUs' placement (see benchkit.c2c_probe)
    total = len(args.ranks) * len(args.impls) * args.reps
    k = 0
    for rep in range(args.reps):
        for n in args.ranks:
            order = args.impls if rep % 2 == 0 else list(reversed(args.impls))
            for impl in order:
                k += 1
                cmd, extra = command(impl, n, args, bin_dir)
                env = dict(os.environ)
                env.update(extra)
                rc, stdout, stderr, wall = benchkit.run_in_group(cmd, env, args.timeout + 15)
                rows = benchkit.all_json(stdout, "startup")
                ok = rc == 0 and len(rows) == n
                rec = {"impl": impl, "ranks": n, "rep": rep + 1, "exit": rc, "wall_s": round(wall, 4), "ok": ok,
                       "rank_lines": rows, "env": extra}
                if not ok:  # the first lines name the first failure, the last how the job ended
                    err = stderr or ""
                    rec["stderr_head"] = err[:3000]
                    rec["stderr_tail"] = err[-2000:] if len(err) > 3000 else ""
                raw.write(json.dumps(rec) + "\n")
                raw.flush()
                if ok:
                    rss = statistics.median(r["maxrss_kib"] for r in rows)
                    init = statistics.median(r["init_s"] for r in rows)
                    parts = tuple(statistics.median(r.get(k, -1) for r in rows)
                                  for k in ("rss_anon_kib", "rss_file_kib", "rss_shmem_kib", "pss_kib",
                                            # ferry's own account (Runtime::footprint); -1 for MPI
                                            "bootstrap_reads", "peers_connected", "packet_bytes", "keepalive_links",
                                            "address_reads"))
                    jobs.setdefault((impl, n), []).append((wall, rss, init) + parts)
                    print(f"[{k:3}/{total}] {NAMES[impl]:14} n={n:<4} rep {rep + 1}  {wall:6.2f} s  "
                          f"rss {rss / 1024:6.1f} MiB  init {init:6.3f} s", flush=True)
                else:
                    print(f"[{k:3}/{total}] {NAMES[impl]:14} n={n:<4} rep {rep + 1}  FAILED (exit {rc}, "
                          f"{len(rows)} of {n} ranks reported)", flush=True)
                time.sleep(0.2)
    raw.close()
    rows = []
    for n in args.ranks:
        for impl in args.impls:
            v = jobs.get((impl, n), [])
            rows.append({"impl": impl, "ranks": n, "runs": len(v),
                         "wall_s": statistics.median(x[0] for x in v) if v else None,
                         "rss_mib": statistics.median(x[1] for x in v) / 1024 if v else None,
                         "init_s": statistics.median(x[2] for x in v) if v else None,
                         # the resident set after the barrier by kind, median rank, median job
                         "anon_mib": statistics.median(x[3] for x in v) / 1024 if v else None,
                         "file_mib": statistics.median(x[4] for x in v) / 1024 if v else None,
                         "shmem_mib": statistics.median(x[5] for x in v) / 1024 if v else None,
                         "pss_mib": statistics.median(x[6] for x in v) / 1024 if v else None,
                         "bootstrap_reads": statistics.median(x[7] for x in v) if v else None,
                         "peers_connected": statistics.median(x[8] for x in v) if v else None,
                         "packet_mib": statistics.median(x[9] for x in v) / 2**20 if v else None,
                         "keepalive_links": statistics.median(x[10] for x in v) if v else None,
                         "address_reads": statistics.median(x[11] for x in v) if v else None})
    summary = {"timestamp": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "reps": args.reps,
               "hosts": args.hosts, "load_start": load_start, "load_end": os.getloadavg()[0],
               "c2c_ns_start": c2c_start, "c2c_ns_end": benchkit.c2c_probe(bin_dir),
               "commit": benchkit.git_rev(), "rows": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    def cell(impl, n, key, fmt):
        r = next(x for x in rows if x["impl"] == impl and x["ranks"] == n)
        return fmt % r[key] if r[key] is not None else "failed"

    lines = [f"# Start-up and memory per rank, {os.cpu_count()} CPUs, medians of {args.reps}",
             "",
             f"Run {summary['timestamp']} at {summary['commit']}; load average {load_start:.2f} at the start, "
             f"{summary['load_end']:.2f} at the end; cache-line round trip between cores 0 and 1 (ferry-c2c) "
             f"{summary['c2c_ns_start']} ns at the start, {summary['c2c_ns_end']} ns at the end. "
             f"Network runs: {args.hosts} FERRY_HOST groups.",
             "",
             "Start-up: the launcher's wall time (launch, init, one barrier, finalize, exit), seconds.",
             "",
             "| ranks | " + " | ".join(NAMES[i] for i in args.impls) + " |",
             "|---|" + "---|" * len(args.impls)]
    for n in args.ranks:
        lines.append(f"| {n} | " + " | ".join(cell(i, n, "wall_s", "%.2f") for i in args.impls) + " |")
    lines += ["", "Peak resident set of the median rank, MiB.", "",
              "| ranks | " + " | ".join(NAMES[i] for i in args.impls) + " |",
              "|---|" + "---|" * len(args.impls)]
    for n in args.ranks:
        lines.append(f"| {n} | " + " | ".join(cell(i, n, "rss_mib", "%.1f") for i in args.impls) + " |")
    lines += ["", "Resident set after the barrier by kind (median rank), MiB: anonymous / files (libraries) / "
              "shared memory.", "",
              "| ranks | " + " | ".join(NAMES[i] for i in args.impls) + " |",
              "|---|" + "---|" * len(args.impls)]
    for n in args.ranks:
        lines.append(f"| {n} | " + " | ".join(
            " / ".join(cell(i, n, k, "%.1f") for k in ("anon_mib", "file_mib", "shmem_mib")) for i in args.impls) + " |")
    lines += ["", "Proportional set size after the barrier (median rank), MiB: each shared page divided among "
              "the processes mapping it (libraries and shared-memory segments alike; see bench/rss_parts.hpp).", "",
              "| ranks | " + " | ".join(NAMES[i] for i in args.impls) + " |",
              "|---|" + "---|" * len(args.impls)]
    for n in args.ranks:
        lines.append(f"| {n} | " + " | ".join(cell(i, n, "pss_mib", "%.1f") for i in args.impls) + " |")
    ferry_impls = [i for i in args.impls if i.startswith("ferry")]
    if ferry_impls:
        lines += ["", "ferry's account of itself after the barrier (Runtime::footprint, median rank): bootstrap "
                  "reads / of them peers' addresses / peers connected / MiB of packets made / keepalive links.", "",
                  "| ranks | " + " | ".join(NAMES[i] for i in ferry_impls) + " |",
                  "|---|" + "---|" * len(ferry_impls)]
        for n in args.ranks:
            lines.append(f"| {n} | " + " | ".join(
                " / ".join(cell(i, n, k, f) for k, f in (("bootstrap_reads", "%d"), ("address_reads", "%d"),
                                                          ("peers_connected", "%d"),
                                                          ("packet_mib", "%.1f"), ("keepalive_links", "%d")))
                for i in ferry_impls) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nresults in {out}")
    return 0 if all(r["runs"] == args.reps for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
