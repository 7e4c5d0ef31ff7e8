#!/usr/bin/env python3
"""Figure 3 of [AMT-LCI] (§4.2.1) on this machine: ferry-chains over every parcelport.

(a) message rate: flood runs (nsteps = 1, many chains) at 8 B and 16 KiB over thread counts;
(b) latency: long chains (many steps) at 8 B and 16 KiB over the number of concurrent chains.

Each point is the median of --reps runs; every run has a timeout, and a failed or timed-out run
is recorded as such while the sweep carries on. Results go into one folder: raw.jsonl (every
run), points.csv (one row per point), summary.md (the tables, with ferry's speedups), and
fig3a_rate.png / fig3b_latency.png.

Standard library + matplotlib only; on Debian matplotlib is python3-matplotlib, which only
/usr/bin/python3 sees. Run through scripts/fig3.sh to build first.
"""
import argparse
import csv
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from benchkit import c2c_probe, c2c_summary, git_rev, int_list, positive, run_chains  # noqa: E402
PARCELPORTS = ["ferry", "mpi", "mpi_a", "mpix"]
MPI_KINDS = {"mpi", "mpi_a", "mpix"}
# The paper's baselines are mpi and mpi_a; mpix is this project's extra variant, shown but kept
# out of "best MPI" so the headline ratio means what the paper's does.
PAPER_MPI = ["mpi", "mpi_a"]
ZC_THRESHOLD = 8192  # ferry::amt::Options::zc_threshold: at or above it a payload travels zero-copy
COLORS = {"ferry": "tab:red", "mpi": "tab:blue", "mpi_a": "tab:green", "mpix": "tab:purple",
          "ferry@shm": "tab:orange", "ferry@ofi": "tab:olive", "ferry@ucx": "tab:brown"}
# The ferry parcelport on one backend: "ferry@ucx" runs it with FERRY_TRANSPORT=ucx, beside
# plain "ferry" (FERRY_TRANSPORT as the environment has it), so one table compares backends.
FERRY_BACKENDS = ["ferry@shm", "ferry@ofi", "ferry@ucx"]

# {prog} is the ferry-chains binary, {args} its arguments, {timeout} the per-run timeout (s),
# {bin} the build's bin directory. Tokens are split with shlex before substitution.
LAUNCH = {
    "local": {
        # ferryrun serves PMI-1 and kills the job itself on --timeout (exit 124).
        "ferry": "{bin}/ferryrun -n 2 --timeout {timeout} --no-prefix {prog} {args}",
        # The MPI parcelports need MPICH's own launcher; MPIEXEC_TIMEOUT is set in the environment.
        "mpi": "mpiexec.hydra -n 2 {prog} {args}",
    },
    "srun": {
        # One rank per node; ferry bootstraps over PMIx under srun.
        "ferry": "srun -N 2 -n 2 --ntasks-per-node=1 --mpi=pmix {prog} {args}",
        "mpi": "srun -N 2 -n 2 --ntasks-per-node=1 --mpi=pmix {prog} {args}",
    },
}


def size_name(n):
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024} KiB"
    return f"{n} B"


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="[AMT-LCI] Figure 3 (task-chain message rate and latency) for ferry vs the MPI parcelports.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--reps", type=positive, default=None, help="runs per point (median reported); default 5, --quick 1")
    p.add_argument("--quick", action="store_true", help="1 rep, fewer points, small counts: about 2 minutes")
    p.add_argument("--threads", default=None, help="rate sweep: worker threads per rank (default 1,2,4; quick 1,2)")
    p.add_argument("--chains", default=None,
                   help="latency sweep: concurrent chains (default 1,4,16,64,256,1024; quick 1,16,256)")
    p.add_argument("--sizes", default="8,16384", help="payload bytes")
    p.add_argument("--parcelports", default=",".join(PARCELPORTS), help="which parcelports, in plot order")
    p.add_argument("--rate-chains", type=positive, default=None,
                   help="flood: chains (= messages) below the zero-copy threshold (default 100000; quick 50000)")
    p.add_argument("--rate-chains-zc", type=positive, default=None,
                   help="flood: chains at or above it (default 10000; quick 5000)")
    p.add_argument("--lat-budget", type=positive, default=None,
                   help="latency: about this many messages per run below the zero-copy threshold: nsteps = "
                        "budget / chains, clamped to [--min-steps, --max-steps] (default 100000; quick 20000)")
    p.add_argument("--lat-budget-zc", type=positive, default=None,
                   help="latency: the same at or above the threshold (default 20000; quick 5000)")
    p.add_argument("--min-steps", type=positive, default=32, help="latency: fewest hops per chain")
    p.add_argument("--max-steps", type=positive, default=None, help="latency: most hops per chain (default 20000; quick 5000)")
    p.add_argument("--lat-threads", type=positive, default=None,
                   help="latency: worker threads per rank (default: the cores of this machine, as in the paper)")
    p.add_argument("--batch-size", type=positive, default=64, help="chains started by one spawn task")
    p.add_argument("--bidirectional", action="store_true",
                   help="flood from both ranks (default: one sender, one receiver, as in the paper)")
    p.add_argument("--timeout", type=positive, default=None, help="seconds per run (default 60; quick 30)")
    p.add_argument("--out", default=None, help="results folder (default results/fig3-<timestamp>)")
    p.add_argument("--bin-dir", default=str(ROOT / "build" / "bin"), help="where ferry-chains and ferryrun are")
    p.add_argument("--launcher", choices=sorted(LAUNCH), default="local",
                   help="local: ferryrun for ferry, mpiexec.hydra for MPI kinds; srun: both under srun (2 nodes)")
    p.add_argument("--ferry-launch", default=None,
                   help="command template for the ferry parcelport ({prog} {args} {timeout} {bin}); overrides --launcher")
    p.add_argument("--mpi-launch", default=None, help="the same for the MPI parcelports")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every run (repeatable), e.g. FERRY_PROVIDER=tcp")
    p.add_argument("--extra-args", default="", help="appended to every ferry-chains command line, e.g. '--pin'")
    p.add_argument("--ferry-devices", default=None,
                   help="devices of the ferry parcelport: a number, or 'threads' (one per worker thread, each "
                        "worker polling its own: [AMT-LCI] §5.5); default: the parcelport's (FERRY_DEVICES, "
                        "else 1). Measured here: one per worker halves the 16 KiB latency at 1024 chains but "
                        "raises the 1-chain latency (a hop waits for the worker owning its device)")
    p.add_argument("--replot", metavar="DIR", default=None,
                   help="no runs: rebuild points.csv, summary.md and the plots from DIR/raw.jsonl")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    a = p.parse_args(argv)

    if a.ferry_devices not in (None, "threads") and not (a.ferry_devices.isdigit() and int(a.ferry_devices) >= 1):
        p.error(f"--ferry-devices '{a.ferry_devices}': expected 'threads' or a number >= 1")
    q = a.quick
    a.reps = a.reps or (1 if q else 5)
    try:
        a.threads = int_list(a.threads or ("1,2" if q else "1,2,4"), "--threads")
        a.chains = int_list(a.chains or ("1,16,256" if q else "1,4,16,64,256,1024"), "--chains")
        a.sizes = int_list(a.sizes, "--sizes")
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    if 0 in a.threads or 0 in a.chains:
        p.error("--threads and --chains values must be at least 1")
    a.parcelports = [x for x in a.parcelports.split(",") if x]
    bad = [x for x in a.parcelports if x not in PARCELPORTS + FERRY_BACKENDS]
    if bad or not a.parcelports:
        p.error(f"--parcelports: '{','.join(bad)}' is not among {','.join(PARCELPORTS + FERRY_BACKENDS)}")
    a.rate_chains = a.rate_chains or (50000 if q else 100000)
    a.rate_chains_zc = a.rate_chains_zc or (5000 if q else 10000)
    a.lat_budget = a.lat_budget or (20000 if q else 100000)
    a.lat_budget_zc = a.lat_budget_zc or (5000 if q else 20000)
    a.max_steps = a.max_steps or (5000 if q else 20000)
    if a.min_steps > a.max_steps:
        p.error(f"--min-steps {a.min_steps} exceeds --max-steps {a.max_steps}")
    a.lat_threads = a.lat_threads or (os.cpu_count() or 2)
    a.timeout = a.timeout or (30 if q else 60)
    for kv in a.env:
        if "=" not in kv or kv.startswith("="):
            p.error(f"--env '{kv}': expected KEY=VALUE")
    return a


# ---- the sweep --------------------------------------------------------------------------------

def plan(a):
    """Every point: (kind, nbytes, x, chains-args). Kinds: rate (x = threads), latency (x = chains)."""
    points = []
    for nbytes in a.sizes:
        zc = nbytes >= ZC_THRESHOLD
        for t in a.threads:
            n = a.rate_chains_zc if zc else a.rate_chains
            args = ["--nchains", n, "--nsteps", 1, "--nbytes", nbytes, "--threads", t]
            if not a.bidirectional:
                args.append("--single-source")
            points.append(("rate", nbytes, t, args))
    for nbytes in a.sizes:
        budget = a.lat_budget_zc if nbytes >= ZC_THRESHOLD else a.lat_budget
        for c in a.chains:
            steps = max(a.min_steps, min(a.max_steps, budget // c))
            points.append(("latency", nbytes, c, ["--nchains", c, "--nsteps", steps, "--nbytes", nbytes,
                                                  "--threads", a.lat_threads]))
    return points


def command(a, pp, args):
    family = "mpi" if pp in MPI_KINDS else "ferry"
    template = (a.mpi_launch if family == "mpi" else a.ferry_launch) or LAUNCH[a.launcher][family]
    prog = str(Path(a.bin_dir) / "ferry-chains")
    full = [str(x) for x in args] + ["--batch-size", str(a.batch_size), "--parcelport", pp.split("@")[0], "--json"]
    if family == "ferry" and a.ferry_devices:
        threads = str(args[args.index("--threads") + 1])
        full += ["--devices", threads if a.ferry_devices == "threads" else a.ferry_devices]
    full += shlex.split(a.extra_args)
    out = []
    for tok in shlex.split(template):
        if tok == "{args}":
            out += full
        else:
            out.append(tok.format(prog=prog, timeout=a.timeout, bin=a.bin_dir, args=" ".join(full)))
    return out


def value_of(kind, result):
    """The plotted quantity. Rate: messages per second that one sending rank achieves — the
    total rate with a single source (the paper's flood), the per-rank rate when both send."""
    if kind == "rate":
        return result.get("total_rate", 2 * result["msg_rate"]) if result.get("single_source") else result["msg_rate"]
    return result["latency_us"]


UNIT = {"rate": "msg/s", "latency": "us"}


def sweep(a, out_dir):
    env = dict(os.environ)
    for kv in a.env:
        k, v = kv.split("=", 1)
        env[k] = v
    env["MPIEXEC_TIMEOUT"] = str(a.timeout)  # hydra kills the job after this many seconds
    prog = Path(a.bin_dir) / "ferry-chains"
    if not prog.exists():
        sys.exit(f"fig3: {prog} not found: build first (scripts/fig3.sh does), or pass --bin-dir")
    if a.launcher == "local" and not a.mpi_launch and any(pp in MPI_KINDS for pp in a.parcelports) \
            and shutil.which("mpiexec.hydra") is None:
        print("fig3: mpiexec.hydra not found: the MPI parcelports will be recorded as failed", flush=True)

    points = plan(a)
    total = len(points) * len(a.parcelports) * a.reps
    print(f"fig3: {len(points)} points x {len(a.parcelports)} parcelports x {a.reps} reps = {total} runs; "
          f"results in {out_dir}", flush=True)
    unsupported = {}  # parcelport -> why (this build lacks it): its remaining runs are skipped
    records = []
    k = 0
    started = time.monotonic()
    with open(out_dir / "raw.jsonl", "w") as raw:
        # Reps outermost: drift in the machine's state spreads over every point instead of
        # landing on whichever point happened to run at that time.
        for rep in range(a.reps):
            for kind, nbytes, x, args in points:
                for pp in a.parcelports:
                    k += 1
                    cmd = command(a, pp, args)
                    rec = {"kind": kind, "nbytes": nbytes, "x": x, "parcelport": pp, "rep": rep,
                           "cmd": " ".join(shlex.quote(c) for c in cmd)}
                    if pp in unsupported:
                        rec.update(status="skipped", reason=unsupported[pp])
                    else:
                        rec["c2c_ns"] = c2c_probe(a.bin_dir)
                        try:
                            pp_env = dict(env)
                            if "@" in pp:
                                pp_env["FERRY_TRANSPORT"] = pp.split("@", 1)[1]
                            status, rc, wall, result, err = run_chains(cmd, pp_env, a.timeout)
                        except OSError as e:  # the launcher itself is missing
                            status, rc, wall, result, err = "failed", None, 0.0, None, str(e)
                        rec.update(status=status, exit=rc, wall_s=round(wall, 3), result=result)
                        if status != "ok":
                            rec["stderr"] = err[-2000:]
                            if rc == 2 and "not one this build supports" in err:
                                unsupported[pp] = err.splitlines()[-1] if err else "unsupported"
                    records.append(rec)
                    raw.write(json.dumps(rec) + "\n")
                    raw.flush()
                    label = "threads" if kind == "rate" else "chains"
                    head = (f"[{k:>{len(str(total))}}/{total}] {kind:<7} {size_name(nbytes):>6} {label}={x:<5} "
                            f"{pp:<6} rep {rep + 1}/{a.reps}: ")
                    if rec["status"] == "ok":
                        v = value_of(kind, rec["result"])
                        c2c = f", c2c {rec['c2c_ns']:.0f} ns" if rec.get("c2c_ns") is not None else ""
                        extra = f"  (nchains {rec['result']['nchains']}, nsteps {rec['result']['nsteps']}, " \
                                f"wall {rec['wall_s']:.1f} s{c2c})"
                        print(head + (f"{v:12.4g} msg/s" if kind == "rate" else f"{v:10.2f} us/hop") + extra,
                              flush=True)
                    else:
                        why = rec.get("reason") or (rec.get("stderr") or "").splitlines()[-1:] or [""]
                        why = why if isinstance(why, str) else why[0]
                        print(head + f"{rec['status'].upper()} (exit {rec.get('exit')}) {why[:160]}", flush=True)
    print(f"fig3: sweep done in {time.monotonic() - started:.0f} s", flush=True)
    return records


# ---- analysis -----------------------------------------------------------------------------------

def aggregate(records):
    """(kind, nbytes, x, pp) -> dict(median, min, max, reps, failed, nchains, nsteps, threads)."""
    pts = {}
    for r in records:
        key = (r["kind"], r["nbytes"], r["x"], r["parcelport"])
        p = pts.setdefault(key, {"values": [], "failed": 0, "nchains": None, "nsteps": None, "threads": None})
        if r["status"] == "ok":
            res = r["result"]
            p["values"].append(value_of(r["kind"], res))
            p["nchains"], p["nsteps"], p["threads"] = res["nchains"], res["nsteps"], res["threads"]
        else:
            p["failed"] += 1
    for p in pts.values():
        v = p["values"]
        p["median"] = statistics.median(v) if v else None
        p["min"] = min(v) if v else None
        p["max"] = max(v) if v else None
        p["reps"] = len(v)
    return pts


def axes_of(pts):
    kinds = {}
    for kind, nbytes, x, pp in pts:
        d = kinds.setdefault(kind, {"sizes": set(), "xs": set(), "pps": []})
        d["sizes"].add(nbytes)
        d["xs"].add(x)
        if pp not in d["pps"]:
            d["pps"].append(pp)
    for d in kinds.values():
        d["sizes"] = sorted(d["sizes"])
        d["xs"] = sorted(d["xs"])
        d["pps"] = [pp for pp in PARCELPORTS + FERRY_BACKENDS if pp in d["pps"]]
    return kinds


def speedup(kind, ferry, other):
    """ferry's advantage: rate ferry/other, latency other/ferry; > 1 means ferry is better."""
    if ferry is None or other is None or ferry <= 0 or other <= 0:
        return None
    return ferry / other if kind == "rate" else other / ferry


def best_mpi(kind, row):
    vals = [row[pp] for pp in PAPER_MPI if row.get(pp) is not None]
    if not vals:
        return None
    return max(vals) if kind == "rate" else min(vals)


def write_csv(pts, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "size_bytes", "threads", "chains", "nsteps", "parcelport", "median", "min", "max",
                    "unit", "reps", "failed"])
        for (kind, nbytes, x, pp), p in sorted(pts.items(), key=lambda kv: (kv[0][0] != "rate", kv[0][1], kv[0][2],
                                                                              (PARCELPORTS + FERRY_BACKENDS).index(kv[0][3]))):
            threads = x if kind == "rate" else p["threads"]
            chains = p["nchains"] if kind == "rate" else x
            fmt = (lambda v: "" if v is None else f"{v:.6g}")
            w.writerow([kind, nbytes, threads if threads is not None else "", chains if chains is not None else "",
                        p["nsteps"] if p["nsteps"] is not None else "", pp, fmt(p["median"]), fmt(p["min"]),
                        fmt(p["max"]), UNIT[kind], p["reps"], p["failed"]])


def tables(pts):
    """Markdown tables, one per kind: medians per parcelport and ferry's speedups."""
    lines = []
    for kind, d in axes_of(pts).items():
        pps = d["pps"]
        if kind == "rate":
            lines.append("### (a) Message rate (msg/s per sending rank, median; higher is better)\n")
            xlabel, ratio_head = "threads", "ferry / best MPI"
        else:
            lines.append("### (b) Latency (us per hop of a chain, median; lower is better)\n")
            xlabel, ratio_head = "chains", "best MPI / ferry"
        cols = ["size", xlabel] + pps
        has_ferry = "ferry" in pps
        if has_ferry and any(pp in PAPER_MPI for pp in pps):
            cols.append(f"{ratio_head} (of {'/'.join(pp for pp in PAPER_MPI if pp in pps)})")
        if has_ferry and "mpix" in pps:
            cols.append("vs mpix")
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "---|" * len(cols))
        for nbytes in d["sizes"]:
            for x in d["xs"]:
                row = {}
                cells = [size_name(nbytes), str(x)]
                for pp in pps:
                    p = pts.get((kind, nbytes, x, pp))
                    row[pp] = p["median"] if p else None
                    if p is None:
                        cells.append("")
                    elif p["median"] is None:
                        cells.append(f"failed ({p['failed']})")
                    else:
                        s = f"{p['median']:.4g}" if kind == "rate" else f"{p['median']:.2f}"
                        if p["failed"]:
                            s += f" ({p['failed']} failed)"
                        cells.append(s)
                if has_ferry and any(pp in PAPER_MPI for pp in pps):
                    s = speedup(kind, row.get("ferry"), best_mpi(kind, row))
                    cells.append("" if s is None else f"{s:.2f}x")
                if has_ferry and "mpix" in pps:
                    s = speedup(kind, row.get("ferry"), row.get("mpix"))
                    cells.append("" if s is None else f"{s:.2f}x")
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(pts, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import ticker
    except ImportError:
        print(f"fig3: matplotlib is not available to {sys.executable}: no plots (on Debian use /usr/bin/python3 "
              "with python3-matplotlib; --replot DIR redraws later)", flush=True)
        return []
    written = []
    for kind, d in axes_of(pts).items():
        sizes = d["sizes"]
        fig, axs = plt.subplots(1, len(sizes), figsize=(6.2 * len(sizes), 4.6), squeeze=False)
        handles, labels = [], []
        for ax, nbytes in zip(axs[0], sizes):
            ax2 = ax.twinx()
            for pp in d["pps"]:
                xs, ys, lo, hi = [], [], [], []
                for x in d["xs"]:
                    p = pts.get((kind, nbytes, x, pp))
                    if p and p["median"] is not None:
                        xs.append(x), ys.append(p["median"])
                        lo.append(p["median"] - p["min"]), hi.append(p["max"] - p["median"])
                if xs:
                    ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", ms=4, lw=1.8, capsize=3,
                                color=COLORS.get(pp, "tab:gray"), label=pp)
                if pp == "ferry" or "ferry" not in d["pps"]:
                    continue
                sx, sy = [], []
                for x in d["xs"]:
                    f, o = pts.get((kind, nbytes, x, "ferry")), pts.get((kind, nbytes, x, pp))
                    s = speedup(kind, f and f["median"], o and o["median"])
                    if s is not None:
                        sx.append(x), sy.append(s)
                if sx:
                    ax2.plot(sx, sy, ls=":", marker="x", ms=4, lw=1.4, color=COLORS.get(pp, "tab:gray"), label=f"ferry vs {pp}")
            ax2.axhline(1.0, color="0.6", lw=0.8, ls="--")
            ax.set_xscale("log", base=2)
            ax.set_xticks(d["xs"])
            ax.set_xticklabels([str(x) for x in d["xs"]])
            ax.set_yscale("log")
            ax2.set_yscale("log")
            # Plain "2x", "0.5x" labels: the default "2 x 10^0" on a log axis reads badly.
            ax2.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax2.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
            ax2.yaxis.set_minor_formatter(ticker.NullFormatter())
            ax2.set_ylabel("ferry speedup (dotted, x)")
            if kind == "rate":
                ax.set_xlabel("worker threads per rank")
                ax.set_ylabel("message rate (msg/s, solid)")
                ax.set_title(f"(a) message rate, {size_name(nbytes)}")
            else:
                ax.set_xlabel("concurrent chains")
                ax.set_ylabel("latency per hop (us, solid)")
                ax.set_title(f"(b) latency, {size_name(nbytes)}")
            ax.grid(True, which="major", alpha=0.3)
            h1, l1 = ax.get_legend_handles_labels()
            h2, l2 = ax2.get_legend_handles_labels()
            if len(h1 + h2) > len(handles):
                handles, labels = h1 + h2, l1 + l2
        fig.suptitle("ferry-chains, [AMT-LCI] Figure 3 " + ("(a): flood, nsteps = 1" if kind == "rate"
                                                              else "(b): long chains"), fontsize=11)
        # One legend for both panels, below them, so it hides no data point.
        fig.legend(handles, labels, loc="lower center", ncol=max(1, len(handles)), fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.07, 1, 1))
        name = "fig3a_rate.png" if kind == "rate" else "fig3b_latency.png"
        fig.savefig(out_dir / name, dpi=120)
        plt.close(fig)
        written.append(name)
    return written


def report(records, out_dir, a, header):
    pts = aggregate(records)
    write_csv(pts, out_dir / "points.csv")
    body = tables(pts)
    failed = sum(1 for r in records if r["status"] not in ("ok",))
    md = ["# ferry-chains: [AMT-LCI] Figure 3\n", header, "", body]
    if failed:
        md.append(f"{failed} of {len(records)} runs did not succeed (see raw.jsonl: status, exit, stderr).\n")
    (out_dir / "summary.md").write_text("\n".join(md))
    print()
    print(body)
    if failed:
        print(f"{failed} of {len(records)} runs did not succeed (see {out_dir / 'raw.jsonl'})")
    pngs = [] if a.no_plots else plot(pts, out_dir)
    print(f"fig3: wrote {out_dir}: raw.jsonl points.csv summary.md {' '.join(pngs)}", flush=True)


def main(argv):
    a = parse_args(argv)
    if a.replot:
        out_dir = Path(a.replot)
        with open(out_dir / "raw.jsonl") as f:
            records = [json.loads(line) for line in f if line.strip()]
        # Keep the original run's setup lines (everything before the first table).
        header = []
        if (out_dir / "summary.md").exists():
            for line in (out_dir / "summary.md").read_text().splitlines()[1:]:
                if line.startswith("###"):
                    break
                if not line.startswith("Replotted from"):
                    header.append(line)
        header.append(f"Replotted from {out_dir / 'raw.jsonl'} on {datetime.datetime.now():%Y-%m-%d %H:%M}.")
        report(records, out_dir, a, "\n".join(header).strip())
        return 0
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(a.out) if a.out else ROOT / "results" / f"fig3-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    header = "\n".join([
        f"- date: {datetime.datetime.now():%Y-%m-%d %H:%M}, host {platform.node()}, {os.cpu_count()} cores, "
        f"ferry {git_rev()}",
        f"- command: `{' '.join(shlex.quote(x) for x in ['fig3.py'] + argv)}`",
        f"- reps {a.reps} (median; min..max in points.csv), timeout {a.timeout} s per run, launcher "
        f"{'custom' if (a.ferry_launch or a.mpi_launch) else a.launcher}",
        f"- (a) flood: nsteps 1, {a.rate_chains} chains below {ZC_THRESHOLD} B, {a.rate_chains_zc} at or above; "
        f"{'both ranks send' if a.bidirectional else 'all chains start on rank 0 (one sender)'}; "
        f"rate = messages per second per sending rank",
        f"- (b) latency: {a.lat_threads} threads per rank, nsteps = message budget "
        f"({a.lat_budget} / {a.lat_budget_zc} zero-copy) / chains, within [{a.min_steps}, {a.max_steps}]; "
        f"latency = run time / nsteps",
        f"- ferry parcelport devices: "
        f"{'one per worker thread' if a.ferry_devices == 'threads' else (a.ferry_devices or 'default')}",
        f"- best MPI = the better of {' and '.join(PAPER_MPI)} (the paper's two variants); mpix is compared "
        f"separately; ratios > 1 mean ferry is better",
        "- environment: " + (", ".join(a.env) if a.env else "inherited") +
        (f"; FERRY_PROVIDER={os.environ['FERRY_PROVIDER']}" if "FERRY_PROVIDER" in os.environ else ""),
    ])
    records = sweep(a, out_dir)
    header += "\n- " + c2c_summary([r.get("c2c_ns") for r in records if r.get("status") != "skipped"])
    report(records, out_dir, a, header)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit("fig3: interrupted (raw.jsonl holds the runs so far; --replot DIR tabulates them)")
