#!/usr/bin/env python3
"""Evidence for the lock-model and completion-queue outcomes of ferry's design space that a
small machine cannot show by wall-clock message rates alone.

Three parts (each can be skipped):

  callgrind   instructions per message under valgrind's callgrind, for every lock model
              (`ferry-bench contention --pattern send`, rank 0 and rank 1 separately) and per
              push+pop for every completion-queue algorithm (`ferry-bench cq --queue`). Each
              point is a difference of two runs, with N and 3N messages per thread, so that
              start-up, bootstrap, warmup and finalize cancel: (Ir(3N) - Ir(N)) / (2N x T).
              The same difference gives calls per message of sched_yield (a waiter giving
              its core away), of glibc's contended-mutex path __lll_lock_wait, and of
              pthread_mutex_lock.
  oversub     `contention --pattern send` with T threads per rank (2 ranks, so 2T busy
              threads) for every lock model, each point the median of --reps runs: messages/s,
              and from getrusage (ferry-bench's JSON) voluntary and involuntary context
              switches and CPU time per message on rank 0 (timed phase) and rank 1 (its
              threads' whole run).
  spin        the same with waiters that never yield (--yield off), fewer threads and
              messages: a waiter then spins through its time slice while the thread it waits
              for may not be running. A run that times out is a result (the rate was below
              messages/timeout), not a failure.
  cq          `cq --queue` with T threads over the same thread counts: completions/s, context
              switches and CPU time per push+pop.

Output folder (default results/lock-evidence-<date>/): callgrind.csv, oversub_raw.csv,
oversub.csv (medians, min, max), raw.jsonl (every JSON line ferry-bench printed), summary.md
(the tables, what each number shows and does not, the expected outcomes checked), meta.json,
logs/ (output of failed runs). Every run has a timeout; a failed run is recorded, the sweep
goes on, and the script exits 1 at the end. Without valgrind the callgrind part is skipped
(and said so).

Standard library only (bench/benchkit.py); run through scripts/lock-evidence.sh to build first.
"""
import argparse
import csv
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from benchkit import check_env, git_rev, missing_program, results_dir, int_list, last_json, name_list, positive, run_in_group  # noqa: E402

LOCK_MODELS = ["lockless", "trylock", "block", "lockq", "csync", "offload"]
QUEUES = ["ring", "faa", "ms", "lock"]
# The FERRY_COMPLETION value that selects each queue algorithm (faa only through the API).
COMPLETION_NAME = {"ring": "cq", "faa": "(API only)", "ms": "cq_ms", "lock": "cq_lock"}
PARTS = ["callgrind", "oversub", "spin", "cq"]
# Functions whose calls the callgrind part counts: a waiter that gave its core away, a contended
# std::mutex going to the kernel, and every std::mutex acquisition.
COUNTED_CALLS = {"sched_yield": "yields", "__lll_lock_wait": "lock_waits", "pthread_mutex_lock": "mutex_locks",
                 "___pthread_mutex_lock": "mutex_locks", "__pthread_mutex_lock": "mutex_locks"}
CALL_KEYS = ["yields", "lock_waits", "mutex_locks"]
GROUPS = ["ferry", "libfabric", "libc", "bench", "other"]

CG_FIELDS = (["part", "variant", "threads", "rank", "rep", "status", "ops", "ir", "ir_per_op"] + [f"{g}_per_op" for g in GROUPS] + [f"{k}_per_op" for k in CALL_KEYS]
             + ["wall_seconds", "error", "command"])
OVER_METRICS = ["msgs_per_s", "vol_ctx_per_msg_r0", "invol_ctx_per_msg_r0", "vol_ctx_per_msg_r1",
                "invol_ctx_per_msg_r1", "cpu_us_per_msg_r0", "cpu_us_per_msg_r1"]
OVER_FIELDS = (["rep", "part", "variant", "threads", "count", "status"] + OVER_METRICS
               + ["vol_ctx_r0", "invol_ctx_r0", "vol_ctx_r1", "invol_ctx_r1", "seconds", "wall_seconds", "load1",
                  "error", "command"])


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Instruction counts (callgrind) and oversubscription (context switches) for ferry's lock "
                    "models and completion queues.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a smoke test: one repetition, two lock models, two queues, tiny counts (under a minute)")
    p.add_argument("--skip", type=name_list(PARTS), default=[], help="leave out parts: " + ",".join(PARTS))
    p.add_argument("--lock-models", type=name_list(LOCK_MODELS), default=None,
                   help="comma-separated (default all; quick: lockless,block)")
    p.add_argument("--queues", type=name_list(QUEUES), default=None,
                   help="comma-separated (default all; quick: ring,lock)")
    p.add_argument("--threads", type=lambda t: int_list(t, minimum=1), default=None,
                   help="oversub and cq: threads per rank (default 2,4,8,16; quick 2,4)")
    p.add_argument("--reps", type=positive, default=None, help="oversub and cq: runs per point (default 5; quick 1)")
    p.add_argument("--messages", type=positive, default=None,
                   help="oversub: messages per run, split evenly over the threads (default 1000000; quick 8000)")
    p.add_argument("--spin-threads", type=lambda t: int_list(t, minimum=1), default=None,
                   help="spin: threads per rank (default 2,8; quick 2)")
    p.add_argument("--spin-messages", type=positive, default=None,
                   help="spin: messages per run, split over the threads (default 20000; quick 2000)")
    p.add_argument("--spin-reps", type=positive, default=None, help="spin: runs per point (default 3; quick 1)")
    p.add_argument("--spin-timeout", type=positive, default=None,
                   help="spin: seconds per run; a run that takes longer is recorded as rate < messages/timeout "
                        "(default 30; quick 20)")
    p.add_argument("--cq-ops", type=positive, default=None,
                   help="cq: push+pop pairs per run, split over the threads (default 4000000; quick 20000)")
    p.add_argument("--cg-threads", type=lambda t: int_list(t, minimum=1), default=None,
                   help="callgrind: threads per rank (default 1,4; quick 1,2)")
    p.add_argument("--cg-count", type=positive, default=None,
                   help="callgrind: messages per thread (default 5000; quick 500)")
    p.add_argument("--cg-ops", type=positive, default=None,
                   help="callgrind cq: push+pop pairs per thread (default 50000; quick 5000)")
    p.add_argument("--cg-reps", type=positive, default=None,
                   help="callgrind: runs per point; the tables show the mean and the range (default 2; quick 1)")
    p.add_argument("--size", type=int, default=8, help="message size in bytes")
    p.add_argument("--window", type=positive, default=64, help="messages between acknowledgements")
    p.add_argument("--yield", dest="yield_mode", choices=["on", "auto", "off"], default="on",
                   help="ferry-bench --yield: waiters yield after an empty poll (on: at every thread count)")
    p.add_argument("--timeout", type=positive, default=None, help="seconds per run (default 60; quick 30)")
    p.add_argument("--cg-timeout", type=positive, default=None,
                   help="seconds per callgrind run (default 120; quick 60)")
    p.add_argument("--keep-callgrind", action="store_true", help="keep the callgrind output files (callgrind/)")
    p.add_argument("--out", default=None, help="results folder (default results/lock-evidence-<date>)")
    p.add_argument("--bin-dir", default=str(ROOT / "build" / "bin"), help="where ferry-bench and ferryrun are")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every run (repeatable), e.g. FERRY_PROVIDER=tcp")
    p.add_argument("--replot", metavar="DIR", default=None,
                   help="run nothing: rebuild oversub.csv and summary.md from DIR's callgrind.csv, oversub_raw.csv "
                        "and meta.json (with the settings recorded there)")
    a = p.parse_args(argv)
    q = a.quick
    a.lock_models = a.lock_models or (["lockless", "block"] if q else LOCK_MODELS)
    a.queues = a.queues or (["ring", "lock"] if q else QUEUES)
    a.threads = a.threads or ([2, 4] if q else [2, 4, 8, 16])
    a.reps = a.reps or (1 if q else 5)
    a.messages = a.messages or (8000 if q else 1000000)
    a.cq_ops = a.cq_ops or (20000 if q else 4000000)
    a.spin_threads = a.spin_threads or ([2] if q else [2, 8])
    a.spin_messages = a.spin_messages or (2000 if q else 20000)
    a.spin_reps = a.spin_reps or (1 if q else 3)
    a.spin_timeout = a.spin_timeout or (20 if q else 30)
    a.cg_threads = a.cg_threads or ([1, 2] if q else [1, 4])
    a.cg_count = a.cg_count or (500 if q else 5000)
    a.cg_ops = a.cg_ops or (5000 if q else 50000)
    a.cg_reps = a.cg_reps or (1 if q else 2)
    a.timeout = a.timeout or (30 if q else 60)
    a.cg_timeout = a.cg_timeout or (60 if q else 120)
    if a.size < 0:
        p.error(f"argument --size: {a.size} must be 0 or more")
    check_env(p, a.env)
    a.bin_dir = str(Path(a.bin_dir).resolve())
    return a


def log(msg):
    print(msg, flush=True)


def environment(a):
    env = dict(os.environ)
    for kv in a.env:
        k, v = kv.split("=", 1)
        env[k] = v
    # --lock-model and --queue choose; a stray setting must not leak into the runs.
    env.pop("FERRY_LOCK_MODEL", None)
    env.pop("FERRY_COMPLETION", None)
    return env


def launcher(a, ranks, timeout):
    b = Path(a.bin_dir)
    return [str(b / "ferryrun"), "-n", str(ranks), "--timeout", str(timeout), "--no-prefix", "--"]


def bench_args(a, part, variant, threads, per_thread, yield_mode=None):
    """ferry-bench's arguments for one run: `per_thread` messages (contention) or push+pop pairs (cq)."""
    common = ["--threads", str(threads), "--yield", yield_mode or a.yield_mode, "--json"]
    if part in ("contention", "spin"):
        return ["contention", "--pattern", "send", "--lock-model", variant, "--size", str(a.size), "--count",
                str(per_thread), "--window", str(a.window)] + common
    return ["cq", "--queue", variant, "--ops", str(per_thread)] + common


def failure_log(out_dir, name, cmd, rc, out, err):
    logs = out_dir / "logs"
    logs.mkdir(exist_ok=True)
    (logs / name).write_text(f"$ {' '.join(cmd)}\n# exit {rc}\n--- stdout\n{out}\n--- stderr\n{err}\n")
    tail = ((err or "").strip().splitlines() or ["(no output)"])[-1]
    return (f"exit {rc}: {tail}" if rc is not None else f"timeout: {tail}") + f" (logs/{name})"


# ---- callgrind ------------------------------------------------------------------------------

def group_of(obj):
    o = obj.lower()
    if "libferry" in o:
        return "ferry"
    if "libfabric" in o:
        return "libfabric"
    if any(x in o for x in ("libc.so", "libc-", "ld-linux", "libstdc++", "libgcc", "libm.so", "libpthread")):
        return "libc"
    if "ferry-bench" in o:
        return "bench"
    return "other"


def read_callgrind(path):
    """(total Ir, {group: self Ir}, {call key: calls}) of one callgrind output file.

    Self cost is every cost line except the one after a `calls=` line (that one is the
    inclusive cost of the call). Object and function names are compressed as "(id) name" on
    first use and "(id)" after; fn and cfn share one table, ob and cob another."""
    obs, fns = {}, {}
    groups = defaultdict(int)
    calls = defaultdict(int)
    total = None
    ob = "?"
    callee = None
    after_calls = False
    name_re = re.compile(r"^\((\d+)\)(?:\s+(.*))?$")

    def resolve(table, text):
        m = name_re.match(text.strip())
        if not m:
            return text.strip()
        ident, name = m.groups()
        if name:
            table[ident] = name
        return table.get(ident, "?")

    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                if after_calls:
                    after_calls = False
                    continue
                parts = line.split()
                if len(parts) >= 2:
                    groups[group_of(ob)] += int(parts[1])
                continue
            key, _, value = line.partition("=")
            if key == "ob":
                ob = resolve(obs, value)
            elif key == "cob":
                resolve(obs, value)
            elif key == "fn":
                resolve(fns, value)
            elif key == "cfn":
                callee = resolve(fns, value)
            elif key == "calls":
                after_calls = True
                name = COUNTED_CALLS.get((callee or "").split("@")[0])
                if name:
                    calls[name] += int(value.split()[0])
            elif line.startswith("totals:"):
                # The cost in this file; "summary:" would be the whole run's so far.
                total = int(line.split()[1])
    if total is None:
        total = sum(groups.values())
    return total, dict(groups), dict(calls)


def callgrind_points(a):
    points = []
    if "callgrind" in a.skip:
        return points
    for m in a.lock_models:
        for t in a.cg_threads:
            points.append(("contention", m, t))
    for q in a.queues:
        for t in a.cg_threads:
            points.append(("cq", q, t))
    return points


def run_callgrind(a, out_dir, env, raw_json):
    """Every callgrind point --cg-reps times; one row per run and rank (cq: rank 0 only).

    ferry-bench zeroes callgrind's counters when its measured interval starts and dumps them
    when it ends (file <out>.<rank>.1), so start-up, bootstrap and finalize are left out. Rank
    0's interval is the timed phase (count x T messages); rank 1's is its receiving threads'
    whole run, which also drains the warmup (one window per thread), so it is divided by
    (count + warmup) x T."""
    rows = []
    points = callgrind_points(a)
    if not points:
        return rows
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        log("lock-evidence: valgrind is not installed; the callgrind part is skipped "
            "(Debian: apt-get install valgrind)")
        return None
    cg_dir = out_dir / "callgrind"
    cg_dir.mkdir(exist_ok=True)
    started = time.monotonic()
    total = len(points) * a.cg_reps
    i = 0
    for rep in range(a.cg_reps):
        for part, variant, threads in points:
            i += 1
            n = a.cg_count if part == "contention" else a.cg_ops
            ranks = 2 if part == "contention" else 1
            tag = f"{part}-{variant}-t{threads}-rep{rep}"
            cmd = (launcher(a, ranks, a.cg_timeout)
                   + [valgrind, "--tool=callgrind", "--quiet", f"--callgrind-out-file={cg_dir}/{tag}.%q{{PMI_RANK}}",
                      str(Path(a.bin_dir) / "ferry-bench")] + bench_args(a, part, variant, threads, n))
            rc, out, err, wall = run_in_group(cmd, env, a.cg_timeout + 15, out_dir)
            result = last_json(out, "contention" if part == "contention" else "cq")
            if result is not None:
                raw_json.write(json.dumps({"part": "callgrind", "kind": part, "variant": variant,
                                           "threads": threads, "rep": rep, "result": result}) + "\n")
            dumps = [cg_dir / f"{tag}.{r}.1" for r in range(ranks)]
            error = ""
            if rc != 0 or result is None or not all(f.exists() for f in dumps):
                missing = [f.name for f in dumps if not f.exists()]
                error = failure_log(out_dir, f"callgrind-{tag}.log", cmd, rc, out, err
                                    + (f"\n(missing callgrind dumps: {', '.join(missing)})" if missing else ""))
            for rank in range(ranks):
                row = {"part": part, "variant": variant, "threads": threads, "rank": rank, "rep": rep,
                       "wall_seconds": f"{wall:.1f}", "command": " ".join(cmd)}
                if error:
                    row.update(status="failed", error=error)
                else:
                    warmup = int(result.get("warmup", 0)) if (part == "contention" and rank == 1) else 0
                    ops = (n + warmup) * threads
                    ir, groups, calls = read_callgrind(dumps[rank])
                    row.update(status="ok", ops=ops, ir=ir, ir_per_op=ir / ops)
                    for g in GROUPS:
                        row[f"{g}_per_op"] = groups.get(g, 0) / ops
                    for k in CALL_KEYS:
                        row[f"{k}_per_op"] = calls.get(k, 0) / ops
                rows.append(row)
            if not a.keep_callgrind:
                for f in cg_dir.glob(f"{tag}.*"):
                    f.unlink()
            shown = "FAILED " + error if error else "  ".join(
                f"rank {r['rank']} {r['ir_per_op']:.0f} Ir/op" for r in rows[-ranks:])
            log(f"[callgrind {i}/{total} {time.monotonic() - started:5.0f}s] rep {rep + 1} {part:10s} {variant:8s} "
                f"T={threads}: {shown}")
    if not a.keep_callgrind and not any(cg_dir.iterdir()):
        cg_dir.rmdir()
    return rows


# ---- oversubscription -----------------------------------------------------------------------

def over_plan(a, rep):
    """One repetition's runs: (part, variant, threads). spin has its own (usually fewer) reps."""
    runs = []
    for t in a.threads:
        if "oversub" not in a.skip:
            for m in a.lock_models:
                runs.append(("contention", m, t))
        if "cq" not in a.skip:
            for q in a.queues:
                runs.append(("cq", q, t))
    if "spin" not in a.skip and rep < a.spin_reps:
        for t in a.spin_threads:
            for m in a.lock_models:
                runs.append(("spin", m, t))
    return runs


def over_count(a):
    return sum(len([p for p in over_plan(a, r) if p[0] == "spin" or r < a.reps])
               for r in range(max(a.reps, a.spin_reps)))


def pair(result, key, i):
    v = result.get(key)
    if isinstance(v, list):
        return v[i] if i < len(v) else ""
    return v if i == 0 else ""


def run_oversub(a, out_dir, env, raw_json):
    rows = []
    total = over_count(a)
    started = time.monotonic()
    n = 0
    for rep in range(max(a.reps, a.spin_reps)):
        plan = [p for p in over_plan(a, rep) if p[0] == "spin" or rep < a.reps]
        for part, variant, threads in plan:
            n += 1
            budget = {"contention": a.messages, "spin": a.spin_messages, "cq": a.cq_ops}[part]
            per_thread = max(1, budget // threads)
            ranks = 1 if part == "cq" else 2
            timeout = a.spin_timeout if part == "spin" else a.timeout
            cmd = launcher(a, ranks, timeout) + [str(Path(a.bin_dir) / "ferry-bench")] + bench_args(
                a, part, variant, threads, per_thread, "off" if part == "spin" else None)
            load1 = os.getloadavg()[0]
            rc, out, err, wall = run_in_group(cmd, env, timeout + 15, out_dir)
            result = last_json(out, "cq" if part == "cq" else "contention")
            row = {"rep": rep, "part": part, "variant": variant, "threads": threads, "count": per_thread,
                   "wall_seconds": f"{wall:.2f}", "load1": f"{load1:.1f}", "command": " ".join(cmd)}
            if rc == 0 and result is not None and "vol_ctx_switches" in result:
                raw_json.write(json.dumps({"part": "oversub", "kind": part, "variant": variant, "threads": threads,
                                           "rep": rep, "result": result}) + "\n")
                row["status"] = "ok"
                row["msgs_per_s"] = result["msgs_per_s"]
                row["seconds"] = result["seconds"]
                for r in (0, 1):
                    row[f"vol_ctx_r{r}"] = pair(result, "vol_ctx_switches", r)
                    row[f"invol_ctx_r{r}"] = pair(result, "invol_ctx_switches", r)
                    row[f"vol_ctx_per_msg_r{r}"] = pair(result, "vol_ctx_per_msg", r)
                    row[f"invol_ctx_per_msg_r{r}"] = pair(result, "invol_ctx_per_msg", r)
                    row[f"cpu_us_per_msg_r{r}"] = pair(result, "cpu_us_per_msg", r)
                shown = (f"{result['msgs_per_s'] / 1e6:.3f} M/s, ctx/msg vol {row['vol_ctx_per_msg_r0']:.4f} "
                         f"invol {row['invol_ctx_per_msg_r0']:.4f} (rank 0)")
            elif part == "spin" and rc in (None, 124):
                # Too slow to finish: the rate was below this bound. A result, not a failure.
                row["status"] = "slow"
                row["error"] = f"timed out after {timeout} s: rate < {per_thread * threads / timeout:.0f} msgs/s"
                shown = row["error"]
            else:
                row["status"] = "timeout" if rc is None else ("failed" if rc != 0 else "no-result")
                row["error"] = failure_log(out_dir, f"{part}-{variant}-t{threads}-rep{rep}.log", cmd, rc, out, err)
                shown = "FAILED " + row["error"]
            rows.append(row)
            log(f"[{n}/{total} {time.monotonic() - started:5.0f}s] rep {rep + 1} {part:10s} {variant:8s} "
                f"T={threads}: {shown}")
    return rows


def summarise(rows):
    """{(part, variant, threads): {metric: (median, min, max)}, 'ok': n, 'failed': n}."""
    acc = {}
    for r in rows:
        key = (r["part"], r["variant"], int(r["threads"]))
        p = acc.setdefault(key, {"ok": 0, "failed": 0, "slow": 0, "bound": None, "values": defaultdict(list)})
        if r["status"] == "slow":
            p["slow"] += 1
            m = re.search(r"rate < (\d+)", r.get("error", ""))
            p["bound"] = int(m.group(1)) if m else None
            continue
        if r["status"] != "ok":
            p["failed"] += 1
            continue
        p["ok"] += 1
        for m in OVER_METRICS:
            v = r.get(m, "")
            if v != "" and v is not None:
                p["values"][m].append(float(v))
    for p in acc.values():
        p["stats"] = {m: (statistics.median(v), min(v), max(v)) for m, v in p["values"].items() if v}
    return acc


def order(part, variant):
    ref = QUEUES if part == "cq" else LOCK_MODELS
    return (["contention", "spin", "cq"].index(part), ref.index(variant) if variant in ref else 99)


def write_csvs(out_dir, cg_rows, over_rows, points):
    if cg_rows:
        with open(out_dir / "callgrind.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CG_FIELDS)
            w.writeheader()
            for r in cg_rows:
                w.writerow({k: (f"{r[k]:.6g}" if isinstance(r.get(k), float) else r.get(k, "")) for k in CG_FIELDS})
    if over_rows:
        with open(out_dir / "oversub_raw.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=OVER_FIELDS)
            w.writeheader()
            for r in over_rows:
                w.writerow({k: r.get(k, "") for k in OVER_FIELDS})
        with open(out_dir / "oversub.csv", "w", newline="") as f:
            w = csv.writer(f)
            head = ["part", "variant", "threads", "runs_ok", "runs_failed", "runs_timed_out"]
            for m in OVER_METRICS:
                head += [f"{m}_median", f"{m}_min", f"{m}_max"]
            w.writerow(head)
            for (part, variant, t), p in sorted(points.items(), key=lambda kv: (order(*kv[0][:2]), kv[0][2])):
                line = [part, variant, t, p["ok"], p["failed"], p["slow"]]
                for m in OVER_METRICS:
                    s = p["stats"].get(m)
                    line += [f"{x:.6g}" for x in s] if s else ["", "", ""]
                w.writerow(line)


# ---- the report -----------------------------------------------------------------------------

def fnum(x, digits=0):
    if x is None or x == "":
        return "-"
    return f"{x:,.{digits}f}"


def cg_lookup(cg_rows, part, variant, threads, rank):
    """The mean over the repetitions of one point and rank: {"status", key: mean, key + "_range": (min, max)}."""
    runs = [r for r in cg_rows or [] if (r["part"], r["variant"], r["threads"], r["rank"]) == (part, variant, threads, rank)]
    if not runs:
        return None
    ok = [r for r in runs if r["status"] == "ok"]
    if not ok:
        return {"status": "failed", "runs": len(runs)}
    agg = {"status": "ok", "runs": len(ok), "failed": len(runs) - len(ok)}
    for k in ["ir_per_op"] + [f"{g}_per_op" for g in GROUPS] + [f"{c}_per_op" for c in CALL_KEYS]:
        vals = [r[k] for r in ok]
        agg[k] = statistics.mean(vals)
        agg[k + "_range"] = (min(vals), max(vals))
    return agg


def ir_cell(r, key="ir_per_op"):
    lo, hi = r[key + "_range"]
    c = fnum(r[key])
    if r["runs"] > 1:
        c += f" ({fnum(lo)}-{fnum(hi)})"
    return c


def cg_tables(cg_rows, a):
    L = []
    models = [m for m in a.lock_models if any(r["variant"] == m and r["part"] == "contention" for r in cg_rows)]
    if models:
        L += ["### Lock models: instructions per message (`contention --pattern send`)", "",
              f"Instructions (Ir) per message over the measured interval, {a.cg_count} messages per thread; rank 0 "
              "(senders): the timed phase; rank 1 (receivers): its threads' whole run, warmup messages counted. "
              f"Mean of {a.cg_reps} run(s), range in brackets. *ferry*: libferry's own instructions; the rest is "
              "libfabric, libc and the benchmark. *yields*, *lock waits*, *mutex locks*: calls per message to "
              "sched_yield, to glibc's contended-mutex path (__lll_lock_wait, a futex sleep) and to "
              "pthread_mutex_lock, rank 0.", "",
              "| lock model | T | rank 0 Ir/msg | of it ferry | rank 1 Ir/msg | of it ferry | yields/msg "
              "| lock waits/msg | mutex locks/msg |",
              "|---|---|---|---|---|---|---|---|---|"]
        for m in models:
            for t in a.cg_threads:
                r0 = cg_lookup(cg_rows, "contention", m, t, 0)
                r1 = cg_lookup(cg_rows, "contention", m, t, 1)
                if r0 is None:
                    continue
                if r0["status"] != "ok":
                    L.append(f"| {m} | {t} | failed | | | | | | |")
                    continue
                r1_ok = r1 is not None and r1["status"] == "ok"
                L.append(f"| {m} | {t} | {ir_cell(r0)} | {fnum(r0['ferry_per_op'])} | "
                         f"{ir_cell(r1) if r1_ok else 'failed'} | {fnum(r1['ferry_per_op']) if r1_ok else ''} | "
                         f"{fnum(r0['yields_per_op'], 3)} | "
                         f"{fnum(r0['lock_waits_per_op'], 4)} | {fnum(r0['mutex_locks_per_op'], 2)} |")
        L.append("")
    queues = [q for q in a.queues if any(r["variant"] == q and r["part"] == "cq" for r in cg_rows)]
    if queues:
        L += ["### Completion queues: instructions per push+pop (`cq --queue`)", "",
              f"{a.cg_ops} push+pop pairs per thread, the timed phase only; one process, no network; mean of "
              f"{a.cg_reps} run(s), range in brackets.", "",
              "| queue | FERRY_COMPLETION | T | Ir per push+pop | of it ferry | yields per pair | lock waits per pair |",
              "|---|---|---|---|---|---|---|"]
        for q in queues:
            for t in a.cg_threads:
                r = cg_lookup(cg_rows, "cq", q, t, 0)
                if r is None:
                    continue
                if r["status"] != "ok":
                    L.append(f"| {q} | {COMPLETION_NAME[q]} | {t} | failed | | | |")
                    continue
                L.append(f"| {q} | `{COMPLETION_NAME[q]}` | {t} | {ir_cell(r)} | {fnum(r['ferry_per_op'])} "
                         f"| {fnum(r['yields_per_op'], 3)} | {fnum(r['lock_waits_per_op'], 4)} |")
        L += ["", "`FERRY_COMPLETION=sync` is not a queue: it replaces the parcelport's completion queue by a pool "
              "of synchronizers, so `ferry-bench cq` has nothing to measure for it (its queue kind falls back "
              "to `cq`'s ring).", ""]
    return L


def over_table(points, part, variants, threads, metric, scale, digits, with_range=False):
    head = "| " + ("queue" if part == "cq" else "lock model") + " | " + " | ".join(
        f"T={t}" for t in threads) + " |"
    L = [head, "|---" * (len(threads) + 1) + "|"]
    for v in variants:
        cells = []
        for t in threads:
            p = points.get((part, v, t))
            s = p["stats"].get(metric) if p else None
            if s is None:
                if p and p["slow"] and metric == "msgs_per_s" and p["bound"]:
                    cells.append(f"< {fnum(p['bound'] * scale, 3)} (all {p['slow']} timed out)")
                else:
                    cells.append("timed out" if p and p["slow"] else "failed" if p else "")
                continue
            c = fnum(s[0] * scale, digits)
            if with_range:
                c += f" ({fnum(s[1] * scale, digits)}-{fnum(s[2] * scale, digits)})"
            if p["failed"]:
                c += f" [{p['failed']} failed]"
            if p["slow"]:
                c += f" [{p['slow']} timed out]"
            cells.append(c)
        L.append(f"| {v} | " + " | ".join(cells) + " |")
    return L


def med(points, part, v, t, metric="msgs_per_s"):
    p = points.get((part, v, t))
    s = p["stats"].get(metric) if p else None
    return s


def checks(points, cg_rows, a, cores):
    """The design-space issue's expected outcomes, each with the numbers it rests on."""
    out = []
    ts = sorted(a.threads)
    lo, hi = ts[0], ts[-1]
    if "oversub" not in a.skip and len(ts) > 1:
        ratios = {}
        for m in a.lock_models:
            x, y = med(points, "contention", m, lo), med(points, "contention", m, hi)
            if x and y:
                ratios[m] = y[0] / x[0]
        if ratios:
            out.append(f"- Rate at T={hi} / rate at T={lo} (medians; {2 * lo} and {2 * hi} busy threads on {cores} "
                       "cores): " + ", ".join(f"{m} {r:.2f}" for m, r in ratios.items()) + ".")
        if all(m in ratios for m in ("block", "lockless", "trylock")):
            collapse = ratios["block"] < 0.5 and ratios["lockless"] >= 0.5 and ratios["trylock"] >= 0.5
            b = med(points, "contention", "block", hi)
            others = [med(points, "contention", m, hi) for m in ("lockless", "trylock")]
            overlap = b and all(o and o[1] <= b[2] for o in others)
            out.append("- *`block` collapses under oversubscription while `lockless` and `trylock` do not* "
                       f"(block below half its T={lo} rate at T={hi}, the others not): "
                       f"{'supported' if collapse else 'not shown'}"
                       + (f"; at T={hi} block's min-max range overlaps the others'" if overlap else "") + ".")
        vol = {m: med(points, "contention", m, hi, "vol_ctx_per_msg_r0") for m in a.lock_models}
        vol = {m: v[0] for m, v in vol.items() if v}
        if vol:
            out.append(f"- Voluntary context switches per 1000 messages on rank 0 at T={hi} (threads that slept): "
                       + ", ".join(f"{m} {v * 1000:.2f}" for m, v in vol.items()) + ".")
        verdicts = []
        for t in ts:
            q, b, c = (med(points, "contention", m, t) for m in ("lockq", "block", "csync"))
            if None in (q, b, c):
                continue
            wins = q[0] > b[0] and q[0] > c[0]
            clear = q[1] > b[2] and q[1] > c[2]
            verdicts.append(f"T={t}: lockq {q[0] / 1e6:.2f} vs block {b[0] / 1e6:.2f}, csync {c[0] / 1e6:.2f} M/s ("
                            + ("yes, every run" if clear else "yes on the medians" if wins else "no") + ")")
        if verdicts:
            out.append("- *`lockq` beats `block` and `csync` when threads outnumber cores*: " + "; ".join(verdicts)
                       + ".")
    if "spin" not in a.skip:
        parts = []
        for t in sorted(a.spin_threads):
            cells = []
            for m in a.lock_models:
                p = points.get(("spin", m, t))
                s_ = p["stats"].get("msgs_per_s") if p else None
                v_ = p["stats"].get("vol_ctx_per_msg_r0") if p else None
                if s_:
                    cells.append(f"{m} {s_[0] / 1e6:.3f} M/s ({v_[0] * 1000:.2f} voluntary switches per 1000)" if v_
                                 else f"{m} {s_[0] / 1e6:.3f}")
                elif p and p["slow"]:
                    cells.append(f"{m} timed out")
            if cells:
                parts.append(f"T={t}: " + ", ".join(cells))
        if parts:
            out.append("- With waiters that never yield (`--yield off`): " + "; ".join(parts) + ".")
    if "cq" not in a.skip:
        verdicts = []
        for t in ts:
            r, lk, ms = (med(points, "cq", q, t) for q in ("ring", "lock", "ms"))
            if None in (r, lk, ms):
                continue
            verdicts.append(f"T={t}: ring {r[0] / 1e6:.2f} vs lock {lk[0] / 1e6:.2f}, ms {ms[0] / 1e6:.2f} M/s "
                            f"({'yes' if r[0] > lk[0] and r[0] > ms[0] else 'no'})")
        if verdicts:
            out.append("- *`cq` (ring) beats `cq_lock` and `cq_ms` under contention*, wall clock: "
                       + "; ".join(verdicts) + ".")
    if cg_rows:
        parts = []
        for t in a.cg_threads:
            vals = {q: cg_lookup(cg_rows, "cq", q, t, 0) for q in ("ring", "ms", "lock")}
            if all(v and v["status"] == "ok" for v in vals.values()):
                parts.append(f"T={t}: " + ", ".join(f"{q} {v['ir_per_op']:.0f}" for q, v in vals.items()))
        if parts:
            out.append("- Instructions per push+pop under callgrind: " + "; ".join(parts) + ".")
    return out


WHAT_IT_SHOWS = """\
## What each number shows, and what it does not

- **Instructions (callgrind)** count every instruction a rank executes per message, spinning
  and polling included, independent of clock speed and of other work on the machine. They show
  the length of each lock model's and queue's code path, and how much a model spends waiting
  (yields, lock waits and their instructions). They do NOT show contention as hardware sees
  it: valgrind runs one thread of a process at a time (a big lock, switched at system calls
  such as sched_yield and about every 100 000 basic blocks), so no two threads of a rank
  ever touch a cache line at the same moment, atomic operations never fail against a
  concurrent one, and there are no cache-line transfers. A lock holder is "preempted" only
  at valgrind's switch points. Cache misses and coherence traffic, the cost that separates
  lock-free from locked queues on many cores, are invisible here.
- **Oversubscription** runs more busy threads than cores, which a 2-core machine can do:
  `send` with T threads per rank runs 2T threads on 2 cores. Voluntary context switches
  (getrusage `ru_nvcsw`) count a thread going to sleep: a futex wait in a blocking lock, a
  condition variable, a barrier. Involuntary ones (`ru_nivcsw`) count a thread taken off its
  core while runnable: its time slice ended, or it called sched_yield and another thread ran
  (Linux counts a yield that switches as involuntary). Rank 0's numbers cover its timed phase;
  rank 1's its receiving threads' whole run (warmup, one window per thread, included). They
  show how each model waits; they do NOT show what a machine with more cores than threads
  would do, and the rates are wall clock on a shared machine (see the load average above).
- **Wall-clock rates** on 2 cores mostly measure scheduling: with 2T threads on 2 cores,
  threads take turns more than they contend.
"""


def write_markdown(out_dir, a, meta, cg_rows, over_rows, points, cg_skipped):
    cores = meta["cores"]
    L = ["# ferry lock models and completion queues: instruction counts and oversubscription", ""]
    L.append(f"{meta['when']}, ferry {meta.get('ferry_version', '?')} (commit {meta['commit']}), {meta['host']}, "
             f"{cores} cores, transport {meta.get('transport', '?')}, build {meta.get('build_type', '?')}; load "
             f"average {meta['load_start']} at the start, {meta['load_end']} at the end.")
    L += ["", "Command: `" + meta["command"] + "`", "", WHAT_IT_SHOWS]
    L += ["## Instruction counts (callgrind)", ""]
    if cg_skipped:
        L += ["Skipped: valgrind is not installed.", ""]
    elif not cg_rows:
        L += ["Skipped (`--skip callgrind`).", ""]
    else:
        L += cg_tables(cg_rows, a)
    threads = sorted(a.threads)
    if "oversub" not in a.skip and over_rows:
        models = [m for m in a.lock_models if any(k[1] == m for k in points)]
        L += ["## Oversubscription: `contention --pattern send`, T threads per rank on one device", "",
              f"2 ranks, so 2T busy threads on {cores} cores; {a.messages} messages per run split over the T "
              f"threads; each cell the median of {a.reps} run(s) (repetitions outermost); `--yield {a.yield_mode}`.",
              "", "### Messages/s (millions; median, min-max)", ""]
        L += over_table(points, "contention", models, threads, "msgs_per_s", 1e-6, 2, with_range=True)
        for metric, title in (("vol_ctx_per_msg_r0", "Voluntary context switches per 1000 messages, rank 0 (senders)"),
                              ("invol_ctx_per_msg_r0", "Involuntary context switches per 1000 messages, rank 0"),
                              ("vol_ctx_per_msg_r1", "Voluntary context switches per 1000 messages, rank 1 (receivers)"),
                              ("invol_ctx_per_msg_r1", "Involuntary context switches per 1000 messages, rank 1"),
                              ("cpu_us_per_msg_r0", "CPU time per message, rank 0 (us, user + system)")):
            L += ["", f"### {title}", ""]
            cpu = metric.startswith("cpu")
            L += over_table(points, "contention", models, threads, metric, 1.0 if cpu else 1000.0, 2)
        L.append("")
    if "spin" not in a.skip and over_rows:
        models = [m for m in a.lock_models if any(k[0] == "spin" and k[1] == m for k in points)]
        st = sorted(a.spin_threads)
        L += ["## Spinning waiters: the same with `--yield off`", "",
              f"Waiters never yield: {a.spin_messages} messages per run split over the T threads, median of "
              f"{a.spin_reps} run(s), {a.spin_timeout} s per run (a run that does not finish in time bounds the "
              "rate from above).", "", "### Messages/s (millions; median, min-max)", ""]
        L += over_table(points, "spin", models, st, "msgs_per_s", 1e-6, 3, with_range=True)
        for metric, title in (("vol_ctx_per_msg_r0", "Voluntary context switches per 1000 messages, rank 0"),
                              ("invol_ctx_per_msg_r0", "Involuntary context switches per 1000 messages, rank 0"),
                              ("cpu_us_per_msg_r0", "CPU time per message, rank 0 (us)")):
            L += ["", f"### {title}", ""]
            cpu = metric.startswith("cpu")
            L += over_table(points, "spin", models, st, metric, 1.0 if cpu else 1000.0, 1 if cpu else 2)
        L.append("")
    if "cq" not in a.skip and over_rows:
        queues = [q for q in a.queues if any(k[0] == "cq" and k[1] == q for k in points)]
        L += ["## Completion queues over thread counts: `cq --queue`", "",
              f"T threads push and pop one queue in one process; {a.cq_ops} pairs per run split over the threads.",
              "", "### Completions/s (millions; median, min-max)", ""]
        L += over_table(points, "cq", queues, threads, "msgs_per_s", 1e-6, 2, with_range=True)
        for metric, title in (("vol_ctx_per_msg_r0", "Voluntary context switches per million push+pop pairs"),
                              ("invol_ctx_per_msg_r0", "Involuntary context switches per million push+pop pairs")):
            L += ["", f"### {title}", ""]
            L += over_table(points, "cq", queues, threads, metric, 1e6, 1)
        L.append("")
    L += ["## The design-space issue's expected outcomes, against these numbers", ""]
    L += checks(points, cg_rows, a, cores) or ["(nothing measured)"]
    L.append("")
    failed = [r for r in (cg_rows or []) + over_rows if r["status"] not in ("ok", "slow")]
    L += ["## Failed runs", ""]
    L += [f"- {r['part']} {r['variant']} T={r['threads']}: {r['status']} ({r.get('error', '')})" for r in failed] or [
        "none"]
    L.append("")
    (out_dir / "summary.md").write_text("\n".join(L))


def build_type(bin_dir):
    cache = Path(bin_dir).parent / "CMakeCache.txt"
    try:
        for line in cache.read_text().splitlines():
            if line.startswith("CMAKE_BUILD_TYPE:"):
                return line.split("=", 1)[1] or "?"
    except OSError:
        pass
    return "?"


def read_csv_rows(path, ints, floats):
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ints:
            r[k] = int(r[k]) if r.get(k, "") != "" else r.get(k)
        for k in floats:
            r[k] = float(r[k]) if r.get(k, "") != "" else ""
    return rows


def replot(out_dir):
    meta = json.loads((out_dir / "meta.json").read_text())
    a = argparse.Namespace(**meta["settings"])
    cg_rows = read_csv_rows(out_dir / "callgrind.csv", ["threads", "rank", "rep"],
                            ["ir_per_op"] + [f"{g}_per_op" for g in GROUPS] + [f"{k}_per_op" for k in CALL_KEYS])
    over_rows = read_csv_rows(out_dir / "oversub_raw.csv", ["threads"], OVER_METRICS)
    points = summarise(over_rows)
    write_csvs(out_dir, [], over_rows, points)
    write_markdown(out_dir, a, meta, cg_rows, over_rows, points, meta.get("callgrind_skipped", False))
    for line in checks(points, cg_rows, a, meta["cores"]):
        log(line)
    return 0


def main(argv):
    a = parse_args(argv)
    if a.replot:
        return replot(Path(a.replot))
    missing = missing_program(a.bin_dir, ("ferryrun", "ferry-bench"), "scripts/lock-evidence.sh")
    if missing:
        log(f"lock-evidence: {missing}")
        return 1
    out_dir = results_dir(a.out, "lock-evidence", "%Y%m%d")
    cores = os.cpu_count() or 1
    meta = {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "host": platform.node(), "cores": cores,
            "commit": git_rev(), "build_type": build_type(a.bin_dir), "load_start": "%.1f" % os.getloadavg()[0],
            "command": "bench/lock_evidence.py " + " ".join(argv),
            "settings": {k: v for k, v in vars(a).items() if k not in ("out", "bin_dir")}}
    env = environment(a)
    n_cg = len(callgrind_points(a)) * a.cg_reps
    n_over = over_count(a)
    log(f"lock-evidence: {n_cg} callgrind runs, {n_over} timed runs, {cores} cores; results in {out_dir}")
    with open(out_dir / "raw.jsonl", "w") as raw_json:
        cg_rows = run_callgrind(a, out_dir, env, raw_json)
        cg_skipped = cg_rows is None
        cg_rows = cg_rows or []
        over_rows = run_oversub(a, out_dir, env, raw_json)
    meta["load_end"] = "%.1f" % os.getloadavg()[0]
    meta["callgrind_skipped"] = cg_skipped
    with open(out_dir / "raw.jsonl") as f:
        for line in f:
            r = json.loads(line)["result"]
            if r.get("bench") == "contention":
                meta["provider"] = r.get("provider", "?")
                meta["transport"] = r.get("transport", "?")
            meta["ferry_version"] = r.get("ferry_version", "?")
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    points = summarise(over_rows)
    write_csvs(out_dir, cg_rows, over_rows, points)
    write_markdown(out_dir, a, meta, cg_rows, over_rows, points, cg_skipped)
    log("")
    for line in checks(points, cg_rows, a, cores):
        log(line)
    failed = [r for r in cg_rows + over_rows if r["status"] not in ("ok", "slow")]
    log(f"\nlock-evidence: {len(cg_rows) + len(over_rows) - len(failed)} of {len(cg_rows) + len(over_rows)} "
        f"rows ok; summary in {out_dir / 'summary.md'}")
    if failed:
        log(f"lock-evidence: {len(failed)} FAILED (see summary.md and logs/)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
