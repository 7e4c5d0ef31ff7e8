#!/usr/bin/env python3
"""The proxy applications across parcelports, progress strategies and worker counts.

octree: ferry-octree's time per step over the ferry parcelport and the MPI ones (mpi, mpi_a,
mpix), at each worker count; the table gives ferry's speed-up over the best MPI parcelport.
bspmm:  ferry-bspmm's stage times over the ferry parcelport with each progress strategy
(FERRY_PROGRESS=explicit, thread:1, steal), over the MPI parcelports, and ferry-bspmm-mpi (MPI-3
RMA, one process per core, without and with MPICH's progress thread); the table says how
stealing compares with the best static strategy in each stage.

Each point is the median of --reps runs, taken in rounds (every configuration once per round,
so drifts of the machine spread over all of them). Every run checks its result (--verify) and
has a timeout; a failed or timed-out run is recorded as such. Results go to one folder:
raw.jsonl, points.csv, summary.md and the plots octree.png, bspmm.png.

Standard library + matplotlib only (Debian's python3-matplotlib, seen by /usr/bin/python3).
Run through scripts/apps.sh, which builds first.
"""
import argparse
import csv
import json
import os
import platform
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from benchkit import (check_env, git_rev, int_list, last_json, missing_program, name_list,  # noqa: E402
                      positive, results_dir, run_in_group)

MPI_KINDS = ["mpi", "mpi_a", "mpix"]
PROGRESS = ["explicit", "thread:1", "steal"]
MPI_ENV = {"UCX_MEM_EVENTS": "no", "UCX_MEM_MALLOC_HOOKS": "no"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 rep, one worker count, small problems: under 3 minutes")
    p.add_argument("--reps", type=positive, default=None, help="runs per point (median reported); default 5, --quick 1")
    p.add_argument("--apps", type=name_list(["octree", "bspmm"]), default=["octree", "bspmm"], help="which proxies")
    p.add_argument("--threads", default=None, help="worker threads per rank (default 1,2; --quick 2)")
    p.add_argument("--ranks", type=positive, default=2, help="ranks (processes) per run")
    p.add_argument("--parcelports", type=name_list(["ferry"] + MPI_KINDS), default=["ferry"] + MPI_KINDS,
                   help="parcelports to run")
    p.add_argument("--progress", type=name_list(PROGRESS + ["implicit"]), default=PROGRESS,
                   help="bspmm: the ferry parcelport's progress strategies (FERRY_PROGRESS)")
    p.add_argument("--octree-args", default=None,
                   help="ferry-octree's problem (default '--steps 100'; --quick '--steps 20')")
    p.add_argument("--bspmm-args", default=None,
                   help="ferry-bspmm's and ferry-bspmm-mpi's problem (default: the programs' own; --quick smaller)")
    p.add_argument("--launch", choices=["local", "srun"], default="local",
                   help="local: ferryrun / mpiexec.hydra on this host; srun: one rank per node of a Slurm allocation")
    p.add_argument("--timeout", type=positive, default=300, help="seconds per run")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for every run (repeatable)")
    p.add_argument("--bin-dir", default=str(ROOT / "build" / "bin"))
    p.add_argument("--out", default=None, help="results folder (default results/apps-<time>)")
    p.add_argument("--replot", default=None, metavar="DIR", help="only redraw DIR's plots from its points.csv")
    a = p.parse_args(argv)
    check_env(p, a.env)
    try:
        a.threads = int_list(a.threads or ("2" if a.quick else "1,2"), "--threads", 1)
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    a.reps = a.reps or (1 if a.quick else 5)
    if a.octree_args is None:
        a.octree_args = "--steps 20" if a.quick else "--steps 100"
    if a.bspmm_args is None:
        a.bspmm_args = ("--stage1-blocks 6 --stage1-block-size 192 --stage2-blocks 24 --stage2-block-size 32"
                        if a.quick else "")
    return a


def configurations(a):
    """(app, label, parcelport, progress, threads, program, extra env) for every point."""
    out = []
    for t in a.threads:
        if "octree" in a.apps:
            for pp in a.parcelports:
                out.append(("octree", pp, pp, "explicit" if pp == "ferry" else "mpi", t, "ferry-octree", {}))
        if "bspmm" in a.apps:
            if "ferry" in a.parcelports:
                for pr in a.progress:
                    out.append(("bspmm", f"ferry {pr}", "ferry", pr, t, "ferry-bspmm", {"FERRY_PROGRESS": pr}))
            for pp in a.parcelports:
                if pp != "ferry":
                    out.append(("bspmm", pp, pp, "mpi", t, "ferry-bspmm", {}))
    if "bspmm" in a.apps:
        # One process per core and one thread each: the paper's MPI baseline, whatever --threads.
        out.append(("bspmm", "mpi_rma", "mpi_rma", "mpi", 1, "ferry-bspmm-mpi", {}))
        out.append(("bspmm", "mpi_rma async", "mpi_rma", "mpi_async_thread", 1, "ferry-bspmm-mpi",
                    {"MPIR_CVAR_ASYNC_PROGRESS": "1"}))
    return out


def command(a, cfg):
    app, _label, pp, _progress, threads, prog, _env = cfg
    binp = Path(a.bin_dir)
    args = shlex.split(a.octree_args if app == "octree" else a.bspmm_args) + ["--verify", "--json"]
    if prog != "ferry-bspmm-mpi":
        args += ["--threads", str(threads), "--parcelport", pp]
    if a.launch == "srun":
        # One rank per node; ferry bootstraps over PMIx, the MPI programs through the same plugin
        # (set SRUN_MPI for a site MPI that needs another, e.g. pmi2 or cray_shasta).
        plugin = os.environ.get("SRUN_MPI", "pmix")
        return ["srun", "-N", str(a.ranks), "-n", str(a.ranks), "--ntasks-per-node=1", f"--mpi={plugin}",
                str(binp / prog)] + args
    if pp == "ferry":
        return [str(binp / "ferryrun"), "-n", str(a.ranks), "--timeout", str(a.timeout), "--no-prefix",
                str(binp / prog)] + args
    return ["mpiexec.hydra", "-n", str(a.ranks), str(binp / prog)] + args


def run_one(a, cfg):
    env = dict(os.environ)
    env.update(MPI_ENV)
    env["MPIEXEC_TIMEOUT"] = str(a.timeout)
    for kv in a.env:
        k, v = kv.split("=", 1)
        env[k] = v
    env.update(cfg[6])
    rc, out, err, wall = run_in_group(command(a, cfg), env, a.timeout + 15)
    result = last_json(out, cfg[0], key="app")
    if rc is None or rc == 124:
        status = "timeout"
    elif rc != 0 or result is None or result.get("errors", 0) != 0 or result.get("verified") is not True:
        status = "failed"
    else:
        status = "ok"
    return status, rc, wall, result, (err or "").strip()[-2000:]


def metrics(app, result):
    if app == "octree":
        return {"time_per_step_ms": result["time_per_step_ms"], "time_s": result["time_s"],
                "progress_calls": result.get("progress_calls")}
    s1, s2 = result["stages"]
    return {"stage1_s": s1["time_s"], "stage2_s": s2["time_s"], "time_s": result["time_s"],
            "stage1_gflops": s1["gflops"], "stage2_gflops": s2["gflops"],
            "stage1_wait_s": s1["wait_s"], "stage2_wait_s": s2["wait_s"],
            "stage1_progress_calls": s1.get("progress_calls"), "stage2_progress_calls": s2.get("progress_calls")}


def median(values):
    return statistics.median(values) if values else None


def fmt(v, digits=3):
    return "—" if v is None else f"{v:.{digits}f}"


def summarize(a, points, out_dir, meta):
    lines = [f"# Proxy applications ({meta['date']})", "",
             f"Commit {meta['commit']}, {meta['host']}, {meta['cpus']} CPUs; {a.ranks} ranks; medians of "
             f"{a.reps} run(s) per point, taken in rounds; every run verified its result.", ""]
    oct_pts = [p for p in points if p["app"] == "octree"]
    if oct_pts:
        lines += ["## Octree proxy: time per step (ms)", "",
                  f"ferry-octree {a.octree_args}; lower is better. Speed-up: best MPI parcelport's time / ferry's.", "",
                  "| workers | " + " | ".join(a.parcelports) + " | ferry speed-up vs best MPI |",
                  "|---|" + "---|" * (len(a.parcelports) + 1)]
        for t in a.threads:
            row = {p["label"]: p.get("time_per_step_ms") for p in oct_pts if p["threads"] == t}
            mpis = [row.get(k) for k in MPI_KINDS if row.get(k) is not None]
            speedup = (min(mpis) / row["ferry"]) if mpis and row.get("ferry") else None
            lines.append(f"| {t} | " + " | ".join(fmt(row.get(pp)) for pp in a.parcelports) +
                         f" | {fmt(speedup, 2)}{'x' if speedup else ''} |")
        lines.append("")
    bs_pts = [p for p in points if p["app"] == "bspmm"]
    if bs_pts:
        lines += ["## BSPMM: stage times (s)", "",
                  f"ferry-bspmm / ferry-bspmm-mpi {a.bspmm_args or '(default sizes)'}; stage 1 compute-heavy, "
                  "stage 2 communication-heavy. 'wait' is the time tasks waited for their blocks, summed over "
                  "tasks and ranks.", "",
                  "| configuration | workers | stage 1 | stage 2 | total | stage 1 wait | stage 2 wait | failed runs |",
                  "|---|---|---|---|---|---|---|---|"]
        for p in bs_pts:
            lines.append(f"| {p['label']} | {p['threads']} | {fmt(p.get('stage1_s'))} | {fmt(p.get('stage2_s'))} | "
                         f"{fmt(p.get('time_s'))} | {fmt(p.get('stage1_wait_s'))} | {fmt(p.get('stage2_wait_s'))} | "
                         f"{p['failed']} of {p['runs']} |")
        lines.append("")
        statics = [pr for pr in a.progress if pr != "steal"]
        if "steal" in a.progress and statics:
            lines += ["Stealing against the best static strategy of the ferry parcelport (ratio of times; "
                      "at most 1.00 means stealing is no slower):", ""]
            for t in a.threads:
                by = {p["progress"]: p for p in bs_pts if p["parcelport"] == "ferry" and p["threads"] == t}
                for stage in ("stage1_s", "stage2_s"):
                    st = [by[pr].get(stage) for pr in statics if pr in by and by[pr].get(stage) is not None]
                    steal = by.get("steal", {}).get(stage)
                    if st and steal:
                        best = min(st)
                        which = [pr for pr in statics if by.get(pr, {}).get(stage) == best][0]
                        lines.append(f"- {t} worker(s), {stage[:6]}: steal {steal:.3f} s vs {which} {best:.3f} s: "
                                     f"{steal / best:.2f}")
            lines.append("")
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


def plot(a, points, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("apps: matplotlib not found (python3-matplotlib, /usr/bin/python3): no plots", file=sys.stderr)
        return
    oct_pts = [p for p in points if p["app"] == "octree"]
    if oct_pts:
        fig, ax = plt.subplots(figsize=(6, 4))
        width = 0.8 / max(1, len(a.parcelports))
        for i, pp in enumerate(a.parcelports):
            ys = [next((p.get("time_per_step_ms") or 0 for p in oct_pts if p["label"] == pp and p["threads"] == t), 0)
                  for t in a.threads]
            ax.bar([x + i * width for x in range(len(a.threads))], ys, width, label=pp)
        ax.set_xticks([x + width * (len(a.parcelports) - 1) / 2 for x in range(len(a.threads))])
        ax.set_xticklabels([f"{t} worker(s)" for t in a.threads])
        ax.set_ylabel("time per step (ms), lower is better")
        ax.set_title("Octree proxy")
        ax.set_ylim(0, max((p.get("time_per_step_ms") or 0) for p in oct_pts) * 1.3 or 1)
        ax.legend(loc="upper left", ncol=2)
        fig.tight_layout()
        fig.savefig(out_dir / "octree.png", dpi=120)
        plt.close(fig)
    bs_pts = [p for p in points if p["app"] == "bspmm"]
    if bs_pts:
        fig, ax = plt.subplots(figsize=(8, 4))
        labels = [f"{p['label']}\n{p['threads']}w" for p in bs_pts]
        xs = range(len(bs_pts))
        s1 = [p.get("stage1_s") or 0 for p in bs_pts]
        s2 = [p.get("stage2_s") or 0 for p in bs_pts]
        ax.bar(xs, s1, label="stage 1 (compute-heavy)")
        ax.bar(xs, s2, bottom=s1, label="stage 2 (communication-heavy)")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=7, rotation=45, ha="right")
        ax.set_ylabel("time (s), lower is better")
        ax.set_title("Two-stage BSPMM")
        ax.set_ylim(0, max(a + b for a, b in zip(s1, s2)) * 1.3 or 1)
        ax.legend(loc="upper left", ncol=2)
        fig.tight_layout()
        fig.savefig(out_dir / "bspmm.png", dpi=120)
        plt.close(fig)


def replot(a):
    d = Path(a.replot)
    points = []
    with open(d / "points.csv") as f:
        for row in csv.DictReader(f):
            p = {k: (float(v) if v not in ("", None) and k not in ("app", "label", "parcelport", "progress") else v)
                 for k, v in row.items()}
            p["threads"] = int(p["threads"])
            points.append(p)
    a.threads = sorted({p["threads"] for p in points if p["app"] == "octree"}) or a.threads
    a.parcelports = [pp for pp in ["ferry"] + MPI_KINDS if any(p["label"] == pp for p in points if p["app"] == "octree")]
    plot(a, points, d)
    print(f"apps: plots redrawn in {d}")
    return 0


def main(argv):
    a = parse_args(argv)
    if a.replot:
        return replot(a)
    progs = ["ferryrun"] + (["ferry-octree"] if "octree" in a.apps else []) + \
        (["ferry-bspmm", "ferry-bspmm-mpi"] if "bspmm" in a.apps else [])
    missing = missing_program(a.bin_dir, progs, "scripts/apps.sh")
    if missing:
        print(f"apps: {missing}", file=sys.stderr)
        return 2
    out_dir = results_dir(a.out, "apps", "%Y%m%d-%H%M%S")
    import datetime
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": git_rev(),
            "host": platform.node(), "cpus": os.cpu_count()}
    cfgs = configurations(a)
    runs = {i: [] for i in range(len(cfgs))}
    with open(out_dir / "raw.jsonl", "w") as raw:
        for rep in range(a.reps):
            for i, cfg in enumerate(cfgs):
                status, rc, wall, result, err = run_one(a, cfg)
                rec = {"app": cfg[0], "label": cfg[1], "parcelport": cfg[2], "progress": cfg[3], "threads": cfg[4],
                       "rep": rep, "status": status, "rc": rc, "wall_s": round(wall, 3), "result": result}
                if status != "ok":
                    rec["stderr"] = err
                raw.write(json.dumps(rec) + "\n")
                raw.flush()
                runs[i].append(rec)
                print(f"apps: [{rep + 1}/{a.reps}] {cfg[0]} {cfg[1]} {cfg[4]}w: {status}"
                      + (f" {result['time_s']:.3f} s" if result else ""), flush=True)
    points = []
    for i, cfg in enumerate(cfgs):
        ok = [r for r in runs[i] if r["status"] == "ok"]
        p = {"app": cfg[0], "label": cfg[1], "parcelport": cfg[2], "progress": cfg[3], "threads": cfg[4],
             "runs": len(runs[i]), "failed": len(runs[i]) - len(ok)}
        if ok:
            ms = [metrics(cfg[0], r["result"]) for r in ok]
            for k in ms[0]:
                p[k] = median([m[k] for m in ms if m[k] is not None])
        points.append(p)
    keys = ["app", "label", "parcelport", "progress", "threads", "runs", "failed", "time_per_step_ms", "time_s",
            "stage1_s", "stage2_s", "stage1_gflops", "stage2_gflops", "stage1_wait_s", "stage2_wait_s", "progress_calls",
            "stage1_progress_calls", "stage2_progress_calls"]
    with open(out_dir / "points.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for p in points:
            w.writerow(p)
    (out_dir / "meta.json").write_text(json.dumps({**meta, "args": vars(a)}, indent=1, default=str) + "\n")
    text = summarize(a, points, out_dir, meta)
    plot(a, points, out_dir)
    print(text)
    print(f"apps: results in {out_dir}")
    return 1 if any(p["failed"] for p in points) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
