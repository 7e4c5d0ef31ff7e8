#!/usr/bin/env python3
"""[Combining]'s micro-benchmarks on this machine: ferry's device thread-safety models under
thread contention, latency per model, and completion-queue throughput per queue algorithm.

For every lock model (FERRY_LOCK_MODEL: lockless, trylock, block, lockq, csync, offload) and
thread count it runs, with all threads of a rank on ONE device:
  - `ferry-bench contention --pattern send|recv|put` (message rate: all sending, all
    receiving, all putting),
  - `ferry-bench pingpong` (latency; T threads each run their own ping-pong on the device),
and for every queue algorithm `ferry-bench cq --queue ring|faa|ms|lock` (completions/s
through one CompletionQueue shared by T threads).

Every run has a timeout (ferryrun --timeout, and a subprocess timeout above it). A failed run
is recorded and reported, the sweep carries on, and the script exits 1 at the end. The whole
list is repeated --reps times, repetitions outermost, so that a noisy neighbour hits every
configuration alike; points are medians over the repetitions.

Output folder: raw.csv (every run), raw.jsonl (every JSON line the benchmark printed),
summary.csv (one row per point: median, min, max), summary.md (tables and the checks of the
expected outcomes), rate_send.png, rate_recv.png, rate_put.png, latency.png, cq.png, and
logs/ (the output of failed runs).

Standard library + matplotlib only; on Debian matplotlib is python3-matplotlib, which only
/usr/bin/python3 sees. Run through scripts/microbench.sh to build first.
"""
import argparse
import csv
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from benchkit import check_env, git_rev, missing_program, results_dir, int_list, name_list, positive, run_in_group  # noqa: E402
LOCK_MODELS = ["lockless", "trylock", "block", "lockq", "csync", "offload"]
PATTERNS = ["send", "recv", "put"]
QUEUES = ["ring", "faa", "ms", "lock"]
COLORS = {
    "lockless": "tab:blue", "trylock": "tab:orange", "block": "tab:red", "lockq": "tab:green",
    "csync": "tab:purple", "offload": "tab:brown",
    "ring": "tab:blue", "faa": "tab:green", "ms": "tab:orange", "lock": "tab:red",
}
UNITS = {"contention": "msgs/s", "latency": "us", "cq": "completions/s"}
# load1: the machine's 1-minute load average just before the run (the machine is shared: a
# high value flags a run that competed with other work).
RAW_FIELDS = ["rep", "kind", "variant", "pattern", "threads", "size", "status", "value", "unit", "bench_seconds",
              "wall_seconds", "load1", "deferred", "combined", "max_combined_batch", "yield", "error", "command"]


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Thread-contention micro-benchmarks of ferry's lock models and completion queues ([Combining]).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--reps", type=positive, default=None, help="runs per point, median reported (default 3; quick 1)")
    p.add_argument("--quick", action="store_true", help="one repetition, threads 1 and 8, small counts: under 2 minutes")
    p.add_argument("--threads", type=lambda t: int_list(t, minimum=1), default=None,
                   help="thread counts (default 1,2,4,8; quick 1,8)")
    p.add_argument("--lock-models", type=name_list(LOCK_MODELS), default=LOCK_MODELS, help="comma-separated")
    p.add_argument("--patterns", type=name_list(PATTERNS), default=PATTERNS, help="comma-separated")
    p.add_argument("--queues", type=name_list(QUEUES), default=QUEUES, help="comma-separated")
    p.add_argument("--skip", type=name_list(["contention", "latency", "cq"]), default=[],
                   help="leave out whole parts: contention, latency, cq")
    p.add_argument("--size", type=int, default=8, help="message and put size in bytes")
    p.add_argument("--window", type=positive, default=64, help="messages between acknowledgements")
    p.add_argument("--count", type=positive, default=None,
                   help="send/recv: messages per thread (default 100000; quick 10000)")
    p.add_argument("--put-count", type=positive, default=None, help="puts per thread (default 20000; quick 2000)")
    p.add_argument("--iters", type=positive, default=None, help="ping-pong round trips per thread (default 5000; quick 1000)")
    p.add_argument("--cq-ops", type=positive, default=None, help="cq: completions per thread (default 500000; quick 50000)")
    p.add_argument("--yield", dest="yield_mode", choices=["on", "auto", "off"], default="on",
                   help="ferry-bench --yield: waiters yield after an empty poll. on (default): the same waiting at "
                        "every thread count, and a machine busy with other work cannot stall a spinning waiter "
                        "for a whole time slice; auto: only when the benchmark's threads outnumber the cores")
    p.add_argument("--timeout", type=positive, default=None, help="seconds per run (default 60; quick 30)")
    p.add_argument("--out", default=None, help="results folder (default results/microbench-<timestamp>)")
    p.add_argument("--bin-dir", default=str(ROOT / "build" / "bin"), help="where ferry-bench and ferryrun are")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every run (repeatable), e.g. FERRY_PROVIDER=tcp")
    p.add_argument("--replot", metavar="DIR", default=None,
                   help="run nothing: rebuild summary.csv, summary.md and the plots from DIR/raw.csv")
    a = p.parse_args(argv)
    quick = a.quick
    a.reps = a.reps or (1 if quick else 3)
    a.threads = a.threads or ([1, 8] if quick else [1, 2, 4, 8])
    a.count = a.count or (10000 if quick else 100000)
    a.put_count = a.put_count or (2000 if quick else 20000)
    a.iters = a.iters or (1000 if quick else 5000)
    a.cq_ops = a.cq_ops or (50000 if quick else 500000)
    a.timeout = a.timeout or (30 if quick else 60)
    # Runs start in the output's logs folder: the binaries are named by absolute path.
    a.bin_dir = str(Path(a.bin_dir).resolve())
    if a.size < 0:
        p.error(f"--size: {a.size} must be 0 or more")
    check_env(p, a.env)
    return a


def log(msg):
    print(msg, flush=True)


# ---- running --------------------------------------------------------------------------------

def plan(a):
    """Every run of one repetition, as (kind, variant, pattern, threads)."""
    runs = []
    for t in a.threads:
        if "contention" not in a.skip:
            for pattern in a.patterns:
                for m in a.lock_models:
                    runs.append(("contention", m, pattern, t))
        if "latency" not in a.skip:
            for m in a.lock_models:
                runs.append(("latency", m, "pingpong", t))
        if "cq" not in a.skip:
            for q in a.queues:
                runs.append(("cq", q, "pushpop", t))
    return runs


def command(a, kind, variant, pattern, threads):
    b = Path(a.bin_dir)
    # cq needs no peer, but runs under ferryrun too so that its timeout is enforced the same way.
    ranks = "1" if kind == "cq" else "2"
    launch = [str(b / "ferryrun"), "-n", ranks, "--timeout", str(a.timeout), "--no-prefix", "--", str(b / "ferry-bench")]
    t = ["--threads", str(threads), "--yield", a.yield_mode, "--json"]
    if kind == "contention":
        count = a.put_count if pattern == "put" else a.count
        return launch + ["contention", "--pattern", pattern, "--lock-model", variant, "--size", str(a.size),
                         "--count", str(count), "--window", str(a.window)] + t
    if kind == "latency":
        return launch + ["pingpong", "--lock-model", variant, "--size", str(a.size), "--iters", str(a.iters)] + t
    return launch + ["cq", "--queue", variant, "--ops", str(a.cq_ops)] + t


def value_of(kind, result):
    if kind == "latency":
        return result["half_rtt_us"]
    return result["msgs_per_s"]


def sweep(a, out_dir):
    env = dict(os.environ)
    for kv in a.env:
        k, v = kv.split("=", 1)
        env[k] = v
    # The benchmark picks the model from --lock-model; a stray FERRY_LOCK_MODEL must not leak
    # into the cq runs' runtime either.
    env.pop("FERRY_LOCK_MODEL", None)
    runs = plan(a)
    total = len(runs) * a.reps
    rows = []
    raw_json = open(out_dir / "raw.jsonl", "w")
    logs = out_dir / "logs"
    logs.mkdir(exist_ok=True)
    started = time.monotonic()
    n = 0
    for rep in range(a.reps):
        for kind, variant, pattern, threads in runs:
            n += 1
            cmd = command(a, kind, variant, pattern, threads)
            load1 = os.getloadavg()[0]
            rc, out, err, wall = run_in_group(cmd, env, a.timeout + 15, logs)
            result = None
            for line in out.splitlines():
                line = line.strip()
                if line.startswith("{"):
                    try:
                        j = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if "bench" in j:
                        result = j
                        raw_json.write(json.dumps({"rep": rep, "kind": kind, "variant": variant, "pattern": pattern,
                                                   "threads": threads, "result": j}) + "\n")
            row = {"rep": rep, "kind": kind, "variant": variant, "pattern": pattern, "threads": threads,
                   "size": a.size if kind != "cq" else 0, "unit": UNITS[kind], "wall_seconds": f"{wall:.2f}",
                   "load1": f"{load1:.1f}",
                   "command": " ".join(cmd)}
            if rc == 0 and result is not None:
                row["status"] = "ok"
                row["value"] = value_of(kind, result)
                row["bench_seconds"] = result.get("seconds", "")
                row["yield"] = result.get("yield", "")
                for key in ("deferred", "combined", "max_combined_batch"):
                    if key in result:
                        row[key] = "/".join(str(x) for x in result[key])
                shown = f"{row['value']:.3f} us" if kind == "latency" else f"{row['value'] / 1e6:.3f} M{UNITS[kind]}"
            else:
                row["status"] = "timeout" if rc is None else ("failed" if rc != 0 else "no-result")
                tail = (err.strip().splitlines() or ["(no output)"])[-1]
                row["error"] = f"exit {rc}: {tail}" if rc is not None else f"timeout: {tail}"
                name = f"{kind}-{variant}-{pattern}-t{threads}-rep{rep}.log"
                (logs / name).write_text(f"$ {' '.join(cmd)}\n# exit {rc}\n--- stdout\n{out}\n--- stderr\n{err}\n")
                shown = f"FAILED ({row['error']}; logs/{name})"
            rows.append(row)
            elapsed = time.monotonic() - started
            log(f"[{n}/{total} {elapsed:5.0f}s] rep {rep + 1} {kind:10s} {variant:8s} {pattern:8s} T={threads}: {shown}")
    raw_json.close()
    if not any(logs.iterdir()):
        logs.rmdir()
    with open(out_dir / "raw.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RAW_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in RAW_FIELDS})
    return rows


# ---- summarising ----------------------------------------------------------------------------

def read_raw(out_dir):
    with open(out_dir / "raw.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["threads"] = int(r["threads"])
        r["value"] = float(r["value"]) if r["status"] == "ok" else None
    return rows


def summarise(rows):
    """{(kind, variant, pattern, threads): point} with median, min, max over the ok runs."""
    points = {}
    for r in rows:
        key = (r["kind"], r["variant"], r["pattern"], int(r["threads"]))
        p = points.setdefault(key, {"values": [], "failed": 0, "unit": r["unit"]})
        if r["status"] == "ok":
            p["values"].append(float(r["value"]))
        else:
            p["failed"] += 1
    for p in points.values():
        v = p["values"]
        p["median"] = statistics.median(v) if v else None
        p["min"] = min(v) if v else None
        p["max"] = max(v) if v else None
    for (kind, *_), p in points.items():
        # The least disturbed run: on a shared machine the other runs lost time to other work.
        p["best"] = p["min"] if kind == "latency" else p["max"]
    return points


def write_summary_csv(points, out_dir):
    with open(out_dir / "summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "variant", "pattern", "threads", "unit", "median", "min", "max", "runs_ok", "runs_failed"])
        for (kind, variant, pattern, threads), p in sorted(points.items(), key=sort_key):
            fmt = (lambda x: "" if x is None else f"{x:.6g}")
            w.writerow([kind, variant, pattern, threads, p["unit"], fmt(p["median"]), fmt(p["min"]), fmt(p["max"]),
                        len(p["values"]), p["failed"]])


def sort_key(item):
    (kind, variant, pattern, threads), _ = item
    order = {"contention": 0, "latency": 1, "cq": 2}
    var = LOCK_MODELS.index(variant) if variant in LOCK_MODELS else (QUEUES.index(variant) if variant in QUEUES else 99)
    pat = PATTERNS.index(pattern) if pattern in PATTERNS else 0
    return (order.get(kind, 9), pat, var, threads)


def axes_of(points, kind, pattern=None):
    variants, threads = [], set()
    for (k, v, p, t) in points:
        if k == kind and (pattern is None or p == pattern):
            if v not in variants:
                variants.append(v)
            threads.add(t)
    ref = LOCK_MODELS if kind != "cq" else QUEUES
    variants.sort(key=lambda v: ref.index(v) if v in ref else 99)
    return variants, sorted(threads)


def plot(points, out_dir, cores, size):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("microbench: matplotlib is missing (Debian: python3-matplotlib, seen by /usr/bin/python3); no plots")
        return []
    made = []
    figures = [("contention", p, f"rate_{p}.png") for p in PATTERNS] + [("latency", "pingpong", "latency.png"),
                                                                        ("cq", "pushpop", "cq.png")]
    titles = {
        "send": f"all sending: T threads post active messages ({size} B) on one device",
        "recv": "all receiving: T threads progress one device and pop one inbox",
        "put": f"all putting: T threads put ({size} B) through one device",
        "pingpong": "latency: T concurrent ping-pongs on one device",
        "pushpop": "CompletionQueue: T threads push and pop one queue",
    }
    for kind, pattern, name in figures:
        variants, threads = axes_of(points, kind, pattern)
        if not variants:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        scale = 1.0 if kind == "latency" else 1e6
        drawn = 0
        for v in variants:
            xs, ys, lo, hi = [], [], [], []
            for t in threads:
                p = points.get((kind, v, pattern, t))
                if p is None or p["median"] is None:
                    continue
                xs.append(t)
                ys.append(p["median"] / scale)
                lo.append((p["median"] - p["min"]) / scale)
                hi.append((p["max"] - p["median"]) / scale)
            if xs:
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=v, color=COLORS.get(v))
                drawn += 1
        ax.set_xscale("log", base=2)
        ax.set_xticks(threads)
        ax.set_xticklabels([str(t) for t in threads])
        ax.axvline(cores, color="grey", linestyle=":", linewidth=1)
        ax.text(cores, ax.get_ylim()[1], f" {cores} cores", color="grey", va="top", fontsize=8)
        ax.set_xlabel("threads per rank" if kind != "cq" else "threads")
        ax.set_ylabel({"contention": "million messages/s", "latency": "half round trip (us)",
                       "cq": "million completions/s"}[kind])
        if kind == "latency":
            ax.set_yscale("log")
        ax.set_title(titles[pattern], fontsize=10)
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend(fontsize=8, title="lock model" if kind != "cq" else "queue", title_fontsize=8)
        fig.text(0.01, 0.01, "median of the repetitions; bars: min to max", fontsize=7, color="grey")
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        made.append(name)
    return made


def fmt_value(kind, x):
    if x is None:
        return "failed"
    if kind == "latency":
        return f"{x:.1f}"
    return f"{x / 1e6:.2f}"


def table(points, kind, pattern, stat="median"):
    variants, threads = axes_of(points, kind, pattern)
    if not variants:
        return []
    head = "| " + ("queue" if kind == "cq" else "lock model") + " | " + " | ".join(f"T={t}" for t in threads) + " |"
    lines = [head, "|---" * (len(threads) + 1) + "|"]
    for v in variants:
        cells = []
        for t in threads:
            p = points.get((kind, v, pattern, t))
            if p is None:
                cells.append("")
                continue
            c = fmt_value(kind, p[stat])
            if p["failed"]:
                c += f" ({p['failed']} failed)"
            cells.append(c)
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return lines


def checks(points, cores, stat="median"):
    """The expected outcomes of the issue, each stated with the numbers it rests on."""
    def med(points, kind, variant, pattern, t):
        p = points.get((kind, variant, pattern, t))
        return None if p is None else p[stat]
    out = []
    _, threads = axes_of(points, "contention")
    if threads:
        lo, hi = min(threads), max(threads)
        over = [t for t in threads if t > cores]
        out.append(f"Oversubscription: with T threads per rank, `send` runs 2T busy threads, `recv` and `put` "
                   f"T+1, on {cores} cores" + (f"; at T={hi} that is {2 * hi} and {hi + 1}." if hi > 1 else "."))
        for pattern in PATTERNS:
            ratios = {}
            for m in ("block", "lockless", "trylock", "lockq", "csync", "offload"):
                a, b = med(points, "contention", m, pattern, lo), med(points, "contention", m, pattern, hi)
                if a and b:
                    ratios[m] = b / a
            if not ratios:
                continue
            parts = ", ".join(f"{m} {r:.2f}" for m, r in ratios.items())
            out.append(f"- `{pattern}`: rate at T={hi} / rate at T={lo}: {parts}.")
        # block collapses while lockless/trylock do not
        verdicts = []
        for pattern in PATTERNS:
            b, l, t = (med(points, "contention", m, pattern, hi) for m in ("block", "lockless", "trylock"))
            b1, l1, t1 = (med(points, "contention", m, pattern, lo) for m in ("block", "lockless", "trylock"))
            if None in (b, l, t, b1, l1, t1):
                continue
            collapse = b / b1 < 0.5 and l / l1 >= 0.5 and t / t1 >= 0.5
            verdicts.append(f"{pattern}: {'yes' if collapse else 'no'}")
        if verdicts:
            out.append("- *block collapses (below half its T=%d rate) at T=%d while lockless and trylock do not*: %s."
                       % (lo, hi, "; ".join(verdicts)))
        verdicts = []
        for pattern in PATTERNS:
            for t in over:
                q, b, c = (med(points, "contention", m, pattern, t) for m in ("lockq", "block", "csync"))
                if None in (q, b, c):
                    continue
                verdicts.append(f"{pattern} T={t}: lockq {q / 1e6:.2f} vs block {b / 1e6:.2f}, csync {c / 1e6:.2f} "
                                f"M/s ({'yes' if q > b and q > c else 'no'})")
        if verdicts:
            out.append("- *lockq beats block and csync when threads outnumber cores*: " + "; ".join(verdicts) + ".")
    _, qthreads = axes_of(points, "cq")
    verdicts = []
    for t in qthreads:
        r, l, m = (med(points, "cq", q, "pushpop", t) for q in ("ring", "lock", "ms"))
        if None in (r, l, m):
            continue
        verdicts.append(f"T={t}: ring {r / 1e6:.2f} vs lock {l / 1e6:.2f}, ms {m / 1e6:.2f} M/s "
                        f"({'yes' if r > l and r > m else 'no'})")
    if verdicts:
        out.append("- *the ring queue beats the locked and Michael-Scott queues under contention*: "
                   + "; ".join(verdicts) + ".")
    return out


def write_markdown(points, rows, meta, out_dir, pngs):
    cores = meta["cores"]
    L = ["# ferry micro-benchmarks: lock models under contention, completion queues", ""]
    L.append(f"{meta['when']}, ferry {meta.get('ferry_version', '?')} (commit {meta.get('commit', '?')}), "
             f"{meta['host']}, {cores} cores, transport {meta.get('transport', '?')}; load average "
             f"{meta.get('load_start', '?')} at the start, {meta.get('load_end', '?')} at the end.")
    L.append("")
    L.append(f"Each cell is the median of {meta['reps']} run(s) (repetitions outermost, interleaved). The machine "
             "is small and shared with other work, so single runs are noisy; the plots show min-max bars. "
             f"Settings: size {meta['size']} B, window {meta['window']}, send/recv {meta['count']} messages per "
             f"thread, put {meta['put_count']} per thread, ping-pong {meta['iters']} round trips per thread, cq "
             f"{meta['cq_ops']} completions per thread; waiting threads yield after an empty poll: "
             f"`--yield {meta.get('yield', '?')}`.")
    L.append("")
    L.append("Command: `" + meta["command"] + "`")
    L.append("")
    sections = [("contention", "send", "All sending (million messages/s)",
                 "T threads on rank 0 each stream active messages to their own receiving thread on rank 1; "
                 "both ranks' threads share one device per rank."),
                ("contention", "recv", "All receiving (million messages/s)",
                 "One thread on rank 0 streams T x count messages; T threads on rank 1 progress the shared "
                 "device and pop one shared inbox."),
                ("contention", "put", "All putting (million puts/s)",
                 "T threads on rank 0 put into their own slot of a region on rank 1 (one progress thread)."),
                ("latency", "pingpong", "Latency (half round trip, us)",
                 "T threads per rank each run a ping-pong over the one shared device."),
                ("cq", "pushpop", "CompletionQueue throughput (million completions/s)",
                 "T threads alternately push and pop one shared queue (no network).")]
    for kind, pattern, title, what in sections:
        t = table(points, kind, pattern)
        if not t:
            continue
        L += [f"## {title}", "", what, ""] + t + [""]
    L += ["## Expected outcomes, checked on the medians", ""] + checks(points, cores) + [""]
    if meta["reps"] > 1:
        L += ["## The best run of each point", "",
              "Highest rate, lowest latency: the run least disturbed by other work on the machine.", ""]
        for kind, pattern, title, what in sections:
            t = table(points, kind, pattern, "best")
            if t:
                L += [f"### {title}", ""] + t + [""]
        L += ["### Expected outcomes, checked on the best runs", ""] + checks(points, cores, "best") + [""]
    failed = [r for r in rows if r["status"] != "ok"]
    L += ["## Failed runs", ""]
    if failed:
        for r in failed:
            L.append(f"- rep {int(r['rep']) + 1} {r['kind']} {r['variant']} {r['pattern']} T={r['threads']}: "
                     f"{r['status']} ({r.get('error', '')})")
    else:
        L.append("none")
    L.append("")
    if pngs:
        L += ["## Plots", ""] + [f"![{p}]({p})" for p in pngs] + [""]
    (out_dir / "summary.md").write_text("\n".join(L))


def report(out_dir, rows, meta):
    points = summarise(rows)
    write_summary_csv(points, out_dir)
    pngs = plot(points, out_dir, meta["cores"], meta["size"])
    write_markdown(points, rows, meta, out_dir, pngs)
    log("")
    for kind, pattern in [("contention", p) for p in PATTERNS] + [("latency", "pingpong"), ("cq", "pushpop")]:
        t = table(points, kind, pattern)
        if t:
            log(f"{kind} {pattern} ({'us' if kind == 'latency' else 'millions per s'}), median:")
            for line in t:
                log("  " + line)
    for line in checks(points, meta["cores"]):
        log(line)


def main(argv):
    a = parse_args(argv)
    if a.replot:
        out_dir = Path(a.replot)
        meta = json.loads((out_dir / "meta.json").read_text())
        rows = read_raw(out_dir)
        report(out_dir, rows, meta)
        return 1 if any(r["status"] != "ok" for r in rows) else 0
    missing = missing_program(a.bin_dir, ("ferryrun", "ferry-bench"), "scripts/microbench.sh")
    if missing:
        log(f"microbench: {missing}")
        return 1
    out_dir = results_dir(a.out, "microbench", "%Y%m%d-%H%M%S")
    cores = os.cpu_count() or 1
    meta = {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "host": platform.node(), "cores": cores,
            "commit": git_rev(), "reps": a.reps, "threads": a.threads, "size": a.size, "window": a.window,
            "count": a.count, "put_count": a.put_count, "iters": a.iters, "cq_ops": a.cq_ops,
            "timeout": a.timeout, "env": a.env, "yield": a.yield_mode, "load_start": "%.1f" % os.getloadavg()[0],
            "command": "bench/microbench.py " + " ".join(argv)}
    runs = len(plan(a)) * a.reps
    log(f"microbench: {runs} runs ({a.reps} repetition(s)), {cores} cores, results in {out_dir}")
    rows = sweep(a, out_dir)
    meta["load_end"] = "%.1f" % os.getloadavg()[0]
    with open(out_dir / "raw.jsonl") as f:
        for line in f:
            r = json.loads(line)["result"]
            if r.get("bench") != "cq":
                meta["provider"] = r.get("provider", "?")
                meta["transport"] = r.get("transport", "?")
            meta["ferry_version"] = r.get("ferry_version", "?")
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    report(out_dir, read_raw(out_dir), meta)
    failed = [r for r in rows if r["status"] != "ok"]
    log(f"\nmicrobench: {len(rows) - len(failed)} of {len(rows)} runs ok; results in {out_dir}")
    if failed:
        log(f"microbench: {len(failed)} run(s) FAILED (see summary.md and logs/)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
