#!/usr/bin/env python3
"""The factor study of [AMT-LCI] §5 (Figures 6-9) on ferry's design space, with ferry-chains.

Each *variant* is a set of ferry's design-space environment variables (plus, for some, a worker
count); each *family* groups the variants of one of the paper's figures. Every variant is
measured with the paper's metrics and normalised to a reference, so that > 1 means better:

  rate 8 B, rate 16 KiB       flood (--nsteps 1, --single-source): messages per second of the
                              sending rank; normalised variant / reference
  latency 8 B, latency 16 KiB --lat-chains (1024) chains of many hops: time per hop;
                              normalised reference / variant (the paper takes the inverse)

The reference is the base configuration, ferry's defaults — FERRY_HEADER=am, FERRY_COMPLETION=cq,
FERRY_LOCK_MODEL=lockless, FERRY_PROGRESS=explicit, FERRY_DEVICE_POLLING=local, FERRY_DEVICES=1 —
with --threads workers per rank (default: the cores of this machine, one thread per core as
in the paper); it is called "lockless" in Figure 8 and "lockless_d1" in Figure 9, as the paper's
names go. Two families have their own reference: "oversubscribed" (2 x --threads workers;
normalised to the base configuration at that worker count) and "attentiveness" (below).

How the paper's variants map onto ferry's settings (only differences from the base are listed):

  Figure 6, asynchrony
    base            am: the header is an active message ("dynamic put") into a completion queue
    sendrecv_queue  FERRY_HEADER=sendrecv (headers are tagged sends matched by pre-posted
                    any_source receives); completions still through the completion queue
    sendrecv_sync   FERRY_HEADER=sendrecv FERRY_COMPLETION=sync (every operation completes into
                    a synchronizer from a pool polled like an MPI request pool)
  Figure 7, concurrency
    base            cq: ferry's bounded array ring (the paper's LCRQ-class queue; ferry's FAA
                    array queue is selectable only through the API, not by environment)
    sync            FERRY_COMPLETION=sync (with am headers the headers still arrive through the
                    completion queue, as in the paper: only follow-ups use synchronizers)
    cq_lock         FERRY_COMPLETION=cq_lock (a locked deque: the paper's queue_lock)
    cq_ms           FERRY_COMPLETION=cq_ms (Michael-Scott queue: the paper's queue_ms)
  Figure 8, multithreading and progress. The paper's locked variants use send/recv headers and
  synchronizers ("completion queues do not work well with locks"), and so do these:
    block           FERRY_LOCK_MODEL=block FERRY_PROGRESS=implicit + sendrecv + sync (MPI-like:
                    one coarse blocking lock, progress only when a completion test finds nothing)
    try             FERRY_LOCK_MODEL=trylock FERRY_PROGRESS=implicit + sendrecv + sync
    try_progress    FERRY_LOCK_MODEL=trylock FERRY_PROGRESS=explicit + sendrecv + sync
    block_d2        block with FERRY_DEVICES=2
    block_progress  FERRY_LOCK_MODEL=block FERRY_PROGRESS=explicit + sendrecv + sync: the paper's
                    "progress" variant, not plotted there because it ran into the job timeout
    lockless        the base (the paper's "lci"; its lci has two devices, ferry's base one)
  Figure 9, devices (the paper: lci_d[n] and lci_try_d[n]; the base settings otherwise)
    lockless_dN     FERRY_DEVICES=N
    trylock_dN      FERRY_LOCK_MODEL=trylock FERRY_DEVICES=N
    blocking_dN     FERRY_LOCK_MODEL=block FERRY_DEVICES=N (am + cq + explicit progress)
    Workers map to devices statically (worker i sends on device i mod N) and device i of one
    rank talks to device i of the other, so devices beyond --threads carry no traffic.
  Lock models ([Combining]; base settings otherwise): trylock, blocking, lockq, csync, offload.
  Progress: implicit (FERRY_PROGRESS=implicit), thread1 (FERRY_PROGRESS=thread:1, a dedicated
    progress thread besides the workers), steal (FERRY_PROGRESS=steal FERRY_DEVICES=2: stealing
    needs a device whose owner is busy), and lockless_d2 to separate the second device's effect.
  Oversubscribed: the lock models and the Figure 8 variants with 2 x --threads workers per
    rank (on a 2-core machine: 4 workers per rank, 8 on 2 cores), where a preempted lock
    holder stalls every thread waiting for a blocking lock.
  Attentiveness ([MPI-AMT] §5.2, [Daps]): chains whose every task also computes for
    --task-us microseconds (ferry-chains --task-us, --task-mode, --task-dist), --att-chains chains,
    --att-threads workers (default 2) per rank and as many devices, each with its own
    completion queue (FERRY_PARCEL_QUEUES=device). Worker i owns device i: with `local` polling
    a parcel arriving on a busy worker's device waits until that task ends, even when another
    worker is idle. Variants: att_local (the reference), att_random and att_global
    (FERRY_DEVICE_POLLING), att_steal (FERRY_PROGRESS=steal), att_shared (one queue for every
    device, ferry's default), att_d1 (one device that every worker polls). Metric: latency per hop.

Every run sets all the design-space variables explicitly (inherited values are overridden), has a
timeout (ferryrun --timeout, and a process-group kill as a backstop), and is recorded: a failed or
timed-out run, or one whose JSON reports errors, is listed in runs.csv with its status and
reported at the end, and the script then exits 1. Reps are the outer loop, so drift of a shared
machine spreads over every variant; each value is the median of the reps.

Outputs (--out, default results/factor-study-<timestamp>): runs.csv (every run), summary.csv
(median, min, max and normalised value per family, variant and metric), summary.md (the tables),
<family>.png (normalised bars, one group per metric).

Standard library + matplotlib (Debian's python3-matplotlib: run with /usr/bin/python3). Run
through scripts/factor-study.sh to build first.
"""
import argparse
import csv
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from benchkit import c2c_probe, c2c_summary, git_rev, positive, run_chains  # noqa: E402
CORES = os.cpu_count() or 2

# The design-space variables and ferry's defaults: the base configuration.
DEFAULTS = {
    "FERRY_HEADER": "am",
    "FERRY_COMPLETION": "cq",
    "FERRY_LOCK_MODEL": "lockless",
    "FERRY_PROGRESS": "explicit",
    "FERRY_DEVICE_POLLING": "local",
    "FERRY_PARCEL_QUEUES": "shared",
    "FERRY_DEVICES": "1",
}
# Cleared from the inherited environment: ferry-chains gets its worker count from --threads and
# its parcelport from --parcelport, so a caller's settings cannot leak into a variant.
CLEARED = list(DEFAULTS) + ["FERRY_AMT_THREADS", "FERRY_PARCELPORT"]

SENDRECV_SYNC = {"FERRY_HEADER": "sendrecv", "FERRY_COMPLETION": "sync"}


# ---- variants and families ---------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    name: str
    settings: dict  # differences from DEFAULTS
    workers: str = "base"  # "base": --threads; "over": --over-threads; "att": --att-threads
    note: str = ""

    def env(self):
        e = dict(DEFAULTS)
        e.update(self.settings)
        return e


@dataclass
class Family:
    key: str
    title: str
    reference: str  # the variant every other one is normalised to
    variants: list  # names, in table order
    metrics: list = field(default_factory=lambda: ["rate8", "rate16k", "lat8", "lat16k"])


def build_variants(max_devices, att_devices=2):
    v = [Variant("base", {}, note="ferry's defaults: am, cq, lockless, explicit, 1 device")]
    add = v.append
    # Figure 6
    add(Variant("sendrecv_queue", {"FERRY_HEADER": "sendrecv"}))
    add(Variant("sendrecv_sync", dict(SENDRECV_SYNC)))
    # Figure 7
    for c in ("sync", "cq_lock", "cq_ms"):
        add(Variant(c, {"FERRY_COMPLETION": c}))
    # Figure 8 (send/recv headers and synchronizers, as in the paper)
    fig8 = {
        "block": {"FERRY_LOCK_MODEL": "block", "FERRY_PROGRESS": "implicit"},
        "try": {"FERRY_LOCK_MODEL": "trylock", "FERRY_PROGRESS": "implicit"},
        "try_progress": {"FERRY_LOCK_MODEL": "trylock", "FERRY_PROGRESS": "explicit"},
        "block_d2": {"FERRY_LOCK_MODEL": "block", "FERRY_PROGRESS": "implicit", "FERRY_DEVICES": "2"},
        "block_progress": {"FERRY_LOCK_MODEL": "block", "FERRY_PROGRESS": "explicit"},
    }
    for name, s in fig8.items():
        add(Variant(name, {**SENDRECV_SYNC, **s}))
    add(Variant("lockless", {}, note="the base (the paper's lci)"))
    # Figure 9
    for n in range(1, max_devices + 1):
        add(Variant(f"lockless_d{n}", {"FERRY_DEVICES": str(n)}))
        add(Variant(f"trylock_d{n}", {"FERRY_LOCK_MODEL": "trylock", "FERRY_DEVICES": str(n)}))
        add(Variant(f"blocking_d{n}", {"FERRY_LOCK_MODEL": "block", "FERRY_DEVICES": str(n)}))
    # Lock models
    add(Variant("trylock", {"FERRY_LOCK_MODEL": "trylock"}))
    add(Variant("blocking", {"FERRY_LOCK_MODEL": "block"}))
    for m in ("lockq", "csync", "offload"):
        add(Variant(m, {"FERRY_LOCK_MODEL": m}))
    # Progress
    add(Variant("implicit", {"FERRY_PROGRESS": "implicit"}))
    add(Variant("thread1", {"FERRY_PROGRESS": "thread:1"}))
    add(Variant("steal", {"FERRY_PROGRESS": "steal", "FERRY_DEVICES": "2"}))
    # Oversubscribed: the same settings with more workers than cores
    for name in ("base", "trylock", "blocking", "lockq", "csync", "offload", "block", "try_progress",
                 "block_progress"):
        src = next(x for x in v if x.name == name)
        add(Variant(f"{name}_over", dict(src.settings), workers="over"))
    # Attentiveness
    # One device per worker, each with its own completion queue: a worker handles what arrives
    # on its device, as in [MPI-AMT].
    att = {"FERRY_DEVICES": str(att_devices), "FERRY_PARCEL_QUEUES": "device"}
    add(Variant("att_local", dict(att), workers="att"))
    add(Variant("att_random", {**att, "FERRY_DEVICE_POLLING": "random"}, workers="att"))
    add(Variant("att_global", {**att, "FERRY_DEVICE_POLLING": "global"}, workers="att"))
    add(Variant("att_steal", {**att, "FERRY_PROGRESS": "steal"}, workers="att"))
    add(Variant("att_shared", {"FERRY_DEVICES": str(att_devices)}, workers="att",
                note="one completion queue for every device (ferry's default)"))
    add(Variant("att_d1", {}, workers="att", note="one device every worker polls"))
    return {x.name: x for x in v}


def build_families(max_devices, att_chains):
    devs = range(1, max_devices + 1)
    return [
        Family("asynchrony", "Figure 6: asynchrony (header primitive, completion object)", "base",
               ["base", "sendrecv_queue", "sendrecv_sync"]),
        Family("concurrency", "Figure 7: concurrency (completion mechanism)", "base",
               ["base", "sync", "cq_lock", "cq_ms"]),
        Family("multithreading", "Figure 8: multithreading and progress (sendrecv + sync for the locked variants)",
               "lockless", ["block", "try", "try_progress", "block_d2", "block_progress", "lockless"]),
        Family("devices", "Figure 9: devices, without and with coarse locks", "lockless_d1",
               [f"{k}_d{n}" for k in ("lockless", "trylock", "blocking") for n in devs]),
        Family("locks", "Lock models ([Combining]), --threads workers per rank", "base",
               ["base", "trylock", "blocking", "lockq", "csync", "offload"]),
        Family("progress", "Progress strategies", "base", ["base", "implicit", "thread1", "lockless_d2", "steal"]),
        Family("oversubscribed", "Oversubscribed: 2 x the workers, normalised to the base at that count",
               "base_over", ["base", "base_over", "trylock_over", "blocking_over", "lockq_over", "csync_over",
                             "offload_over", "block_over", "try_progress_over", "block_progress_over"]),
        Family("attentiveness", "Attentiveness: compute-heavy chains (--task-us), a device per worker", "att_local",
               ["att_local", "att_random", "att_global", "att_steal", "att_shared", "att_d1"],
               metrics=[f"att{c}" for c in att_chains]),
    ]


# --quick: a few variants that still show each family's point.
QUICK_VARIANTS = ["base", "sendrecv_sync", "cq_ms", "block", "try_progress", "lockless", "lockless_d1",
                  "trylock_d2", "lockq", "steal", "base_over", "blocking_over", "block_progress_over",
                  "att_local", "att_random", "att_steal"]


# ---- metrics -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    kind: str  # "rate" (higher is better) or "latency" (lower is better)
    nbytes: int
    chains: int = 0  # attentiveness metrics: concurrent chains


METRICS = {
    "rate8": Metric("rate8", "rate 8 B", "rate", 8),
    "rate16k": Metric("rate16k", "rate 16 KiB", "rate", 16384),
    "lat8": Metric("lat8", "latency 8 B", "latency", 8),
    "lat16k": Metric("lat16k", "latency 16 KiB", "latency", 16384),
}


def att_metric(chains):
    """Attentiveness: latency of compute-heavy chains, one metric per chain count."""
    return Metric(f"att{chains}", f"compute, {chains} chain{'s' if chains > 1 else ''}", "latency", 8, chains)
UNIT = {"rate": "msg/s", "latency": "us/hop"}


def metric_args(a, m):
    """ferry-chains arguments of one metric (without --threads)."""
    if m.key == "rate8":
        return ["--nchains", a.rate_chains, "--nsteps", 1, "--nbytes", 8, "--single-source"]
    if m.key == "rate16k":
        return ["--nchains", a.rate_chains_zc, "--nsteps", 1, "--nbytes", 16384, "--single-source"]
    if m.key == "lat8":
        return ["--nchains", a.lat_chains, "--nsteps", a.lat_steps, "--nbytes", 8]
    if m.key == "lat16k":
        return ["--nchains", a.lat_chains, "--nsteps", a.lat_steps_zc, "--nbytes", 16384]
    return ["--nchains", m.chains, "--nsteps", a.att_steps, "--nbytes", 8, "--task-us", a.task_us,
            "--task-mode", a.task_mode, "--task-dist", a.task_dist] + (["--inline-tasks"] if a.att_inline else [])


def value_of(m, result):
    """Rate: the sending rank's messages per second (all chains start on rank 0).
    Latency: time per hop of a chain."""
    return result["total_rate"] if m.kind == "rate" else result["latency_us"]


def normalise(m, value, reference):
    """> 1 means better than the reference (latency inverted, as in the paper)."""
    if value is None or reference is None or value <= 0 or reference <= 0:
        return None
    return value / reference if m.kind == "rate" else reference / value


# ---- command line ------------------------------------------------------------------------------

def name_list(text):
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="[AMT-LCI] §5 factor study (Figures 6-9) over ferry's design space, with ferry-chains.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--reps", type=positive, default=None, help="runs per variant and metric (median); default 3, quick 1")
    p.add_argument("--quick", action="store_true",
                   help="a few variants, small counts, 1 rep: under 2 minutes")
    p.add_argument("--threads", type=positive, default=CORES, help="workers per rank (one per core, as in the paper)")
    p.add_argument("--over-threads", type=positive, default=None,
                   help="workers per rank in the oversubscribed family (default 2 x --threads)")
    p.add_argument("--families", type=name_list, default=None, help="comma-separated families (default: all)")
    p.add_argument("--variants", type=name_list, default=None,
                   help="only these variants (comma-separated) within the chosen families; references are added")
    p.add_argument("--devices", type=positive, default=2, help="Figure 9: devices 1..N")
    p.add_argument("--rate-chains", type=positive, default=None, help="flood at 8 B: chains = messages (default 500000; quick 50000)")
    p.add_argument("--rate-chains-zc", type=positive, default=None, help="flood at 16 KiB (default 10000; quick 3000)")
    p.add_argument("--lat-chains", type=positive, default=1024, help="latency: concurrent chains")
    p.add_argument("--lat-steps", type=positive, default=None, help="latency at 8 B: hops per chain (default 600; quick 60)")
    p.add_argument("--lat-steps-zc", type=positive, default=None, help="latency at 16 KiB: hops per chain (default 24; quick 4)")
    p.add_argument("--task-us", type=int, default=50, help="attentiveness: microseconds each task computes")
    p.add_argument("--task-mode", choices=("spin", "sleep"), default="spin",
                   help="attentiveness: how a task computes (ferry-chains --task-mode). With fewer cores than "
                        "workers a spinning task also takes the core an idle worker needs: sleep shows the "
                        "attentiveness effect as on a machine with a core per worker")
    p.add_argument("--task-dist", choices=("fixed", "exp"), default="fixed",
                   help="attentiveness: task lengths (ferry-chains --task-dist): fixed, or exp (exponential with mean "
                        "--task-us). Fixed tasks let the chains fall into lock step, so they rarely meet on a busy worker")
    p.add_argument("--att-inline", action="store_true",
                   help="attentiveness: run each hop's task on the worker that polled its parcel "
                        "(ferry-chains --inline-tasks), tying parcel handling to device ownership")
    p.add_argument("--att-chains", default="1,3",
                   help="attentiveness: concurrent chains, comma-separated (one metric each). Fewer chains than "
                        "workers leave idle workers that could attend a busy worker's device")
    p.add_argument("--att-steps", type=positive, default=None, help="attentiveness: hops per chain (default 4000; quick 500)")
    p.add_argument("--att-threads", type=positive, default=2, help="attentiveness: workers per rank")
    p.add_argument("--timeout", type=positive, default=None, help="seconds per run (default 60; quick 30)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every run (repeatable), e.g. FERRY_PROVIDER=tcp")
    p.add_argument("--out", default=None, help="results folder (default results/factor-study-<timestamp>)")
    p.add_argument("--bin-dir", default=str(ROOT / "build" / "bin"), help="where ferry-chains and ferryrun are")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    p.add_argument("--list", action="store_true", help="print the families and variants with their settings, then exit")
    p.add_argument("--replot", metavar="DIR", default=None,
                   help="no runs: rebuild summary.csv, summary.md and the PNGs from DIR/runs.csv, with the "
                        "options of the study that wrote it (DIR/study.json)")
    a = p.parse_args(argv)

    q = a.quick
    a.reps = a.reps or (1 if q else 3)
    a.over_threads = a.over_threads or 2 * a.threads
    a.rate_chains = a.rate_chains or (50000 if q else 500000)
    a.rate_chains_zc = a.rate_chains_zc or (3000 if q else 10000)
    a.lat_steps = a.lat_steps or (60 if q else 600)
    a.lat_steps_zc = a.lat_steps_zc or (4 if q else 24)
    try:
        a.att_chains = [positive(x) for x in name_list(a.att_chains)]
    except argparse.ArgumentTypeError as e:
        p.error(f"--att-chains: {e}")
    if not a.att_chains:
        p.error("--att-chains: give at least one chain count")
    for c in a.att_chains:
        METRICS[f"att{c}"] = att_metric(c)
    a.att_steps = a.att_steps or (500 if q else 4000)
    a.timeout = a.timeout or (30 if q else 60)
    if a.task_us < 0:
        p.error(f"--task-us {a.task_us}: must be at least 0")
    for kv in a.env:
        if "=" not in kv or kv.startswith("="):
            p.error(f"--env '{kv}': expected KEY=VALUE")
    a.variant_table = build_variants(a.devices, a.att_threads)
    families = build_families(a.devices, a.att_chains)
    known = {f.key for f in families}
    if a.families:
        bad = [f for f in a.families if f not in known]
        if bad:
            p.error(f"--families: '{','.join(bad)}' is not among {','.join(f.key for f in families)}")
        families = [f for f in families if f.key in a.families]
    chosen = a.variants if a.variants is not None else (QUICK_VARIANTS if q else None)
    if a.variants:
        bad = [v for v in a.variants if v not in a.variant_table]
        if bad:
            p.error(f"--variants: '{','.join(bad)}' is not a variant (--list shows them)")
    a.family_list = select(families, chosen)
    if not a.family_list:
        p.error("no family has any of the chosen variants")
    return a


def select(families, chosen):
    """Keeps, in each family, the chosen variants plus its reference; drops emptied families."""
    if chosen is None:
        return families
    out = []
    for f in families:
        keep = [v for v in f.variants if v in chosen]
        if not keep:
            continue
        if f.reference not in keep:
            keep.insert(0, f.reference)
        out.append(Family(f.key, f.title, f.reference, keep, f.metrics))
    return out


# ---- running -----------------------------------------------------------------------------------

def workers_of(a, variant):
    return {"base": a.threads, "over": a.over_threads, "att": a.att_threads}[variant.workers]


@dataclass(frozen=True)
class Job:
    """One (configuration, metric) pair; variants with equal settings and workers share it."""
    settings: tuple  # sorted (key, value) of the full design-space environment
    workers: int
    metric: str


def job_of(a, variant, metric):
    return Job(tuple(sorted(variant.env().items())), workers_of(a, variant), metric)


def plan(a):
    """Unique jobs in first-seen order, and the variants each one stands for."""
    jobs = {}
    for f in a.family_list:
        for name in f.variants:
            v = a.variant_table[name]
            for m in f.metrics:
                names = jobs.setdefault(job_of(a, v, m), [])
                if name not in names:  # "base" is in several families: one run serves them all
                    names.append(name)
    return jobs


def run_env(a, job):
    env = dict(os.environ)
    for k in CLEARED:
        env.pop(k, None)
    env.update(dict(job.settings))
    for kv in a.env:
        k, v = kv.split("=", 1)
        env[k] = v
    return env


def command(a, job):
    m = METRICS[job.metric]
    args = [str(x) for x in metric_args(a, m)] + ["--threads", str(job.workers), "--parcelport", "ferry", "--json"]
    b = Path(a.bin_dir)
    return [str(b / "ferryrun"), "-n", "2", "--timeout", str(a.timeout), "--no-prefix", str(b / "ferry-chains")] + args


def describe(settings):
    """The settings that differ from ferry's defaults, for tables and logs."""
    diff = [f"{k}={v}" for k, v in settings if DEFAULTS.get(k) != v]
    return " ".join(diff) if diff else "(defaults)"


RUN_FIELDS = ["rep", "variants", "metric", "workers", "settings", "status", "exit", "value", "unit", "time_s",
              "wall_s", "c2c_ns", "nchains", "nsteps", "nbytes", "task_us", "errors", "cmd", "stderr"]


def sweep(a, out_dir):
    jobs = plan(a)
    total = len(jobs) * a.reps
    print(f"factor-study: {len(a.family_list)} families, {len(jobs)} distinct runs x {a.reps} reps = {total} runs; "
          f"results in {out_dir}", flush=True)
    records = []
    k = 0
    started = time.monotonic()
    with open(out_dir / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RUN_FIELDS)
        w.writeheader()
        # Reps outermost: drift of the (shared) machine spreads over every variant.
        for rep in range(a.reps):
            for job, names in jobs.items():
                k += 1
                rec = run_job(a, job, names, rep)
                records.append(rec)
                w.writerow(rec)
                f.flush()
                print_run(k, total, rec, a.reps)
    print(f"factor-study: runs done in {time.monotonic() - started:.0f} s", flush=True)
    return records


def run_job(a, job, names, rep):
    m = METRICS[job.metric]
    cmd = command(a, job)
    c2c = c2c_probe(a.bin_dir)
    status, rc, wall, result, err = run_chains(cmd, run_env(a, job), a.timeout)
    env_text = " ".join(f"{k}={v}" for k, v in job.settings)
    extra = "".join(f" {shlex.quote(kv)}" for kv in a.env)
    rec = {"rep": rep, "variants": " ".join(names), "metric": job.metric, "workers": job.workers,
           "settings": env_text, "status": status, "exit": "" if rc is None else rc, "unit": UNIT[m.kind],
           "wall_s": f"{wall:.3f}", "c2c_ns": "" if c2c is None else c2c, "cmd": env_text + extra + " " + " ".join(shlex.quote(c) for c in cmd),
           "stderr": "" if status == "ok" else err[-1500:]}
    if result is not None:
        rec.update(nchains=result.get("nchains"), nsteps=result.get("nsteps"), nbytes=result.get("nbytes"),
                   task_us=result.get("task_us", ""), errors=result.get("errors"), time_s=f"{result['time_s']:.6f}")
        if status == "ok":
            rec["value"] = f"{value_of(m, result):.6g}"
    return rec


def why_failed(stderr):
    """The line of a failed run's stderr that says most: the first error, else the last line."""
    lines = stderr.splitlines()
    for line in lines:
        if "error" in line.lower():
            return line.strip()
    return lines[-1].strip() if lines else ""


def print_run(k, total, rec, reps):
    m = METRICS[rec["metric"]]
    head = (f"[{k:>{len(str(total))}}/{total}] {rec['variants'][:34]:<34} {m.label:<22} "
            f"w={rec['workers']:<2} rep {rec['rep'] + 1}/{reps}: ")
    if rec["status"] == "ok":
        v = float(rec["value"])
        text = f"{v:12.4g} msg/s" if m.kind == "rate" else f"{v:10.2f} us/hop"
        print(head + text + f"  (wall {float(rec['wall_s']):.1f} s)", flush=True)
    else:
        print(head + f"{rec['status'].upper()} (exit {rec['exit']}) {why_failed(rec['stderr'])[:160]}", flush=True)


# ---- analysis ----------------------------------------------------------------------------------

def aggregate(records):
    """(variant, metric) -> {median, min, max, ok, failed, workers, settings}."""
    stats = {}
    for r in records:
        for name in r["variants"].split():
            s = stats.setdefault((name, r["metric"]), {"values": [], "failed": 0, "workers": r["workers"],
                                                       "settings": r["settings"]})
            if r["status"] == "ok":
                s["values"].append(float(r["value"]))
            else:
                s["failed"] += 1
    for s in stats.values():
        v = s["values"]
        s["median"] = statistics.median(v) if v else None
        s["min"] = min(v) if v else None
        s["max"] = max(v) if v else None
        s["ok"] = len(v)
    return stats


def family_rows(a, fam, stats):
    """One row per (variant, metric): absolute and normalised values."""
    rows = []
    for name in fam.variants:
        for mk in fam.metrics:
            m = METRICS[mk]
            s = stats.get((name, mk))
            ref = stats.get((fam.reference, mk))
            if s is None:
                continue
            refmed = ref["median"] if ref else None
            # A latency's best run is its minimum, a rate's its maximum: the spread reads
            # low..high in normalised terms either way.
            lo, hi = (s["min"], s["max"]) if m.kind == "rate" else (s["max"], s["min"])
            rows.append({"family": fam.key, "variant": name, "metric": mk, "workers": s["workers"],
                         "settings": describe(tuple(kv.split("=", 1) for kv in s["settings"].split())),
                         "median": s["median"], "min": s["min"], "max": s["max"], "unit": UNIT[m.kind],
                         "ok": s["ok"], "failed": s["failed"], "reference": fam.reference,
                         "normalised": normalise(m, s["median"], refmed),
                         "norm_lo": normalise(m, lo, refmed), "norm_hi": normalise(m, hi, refmed)})
    return rows


def fmt(v, digits=4):
    return "" if v is None else f"{v:.{digits}g}"


def write_summary_csv(rows, path):
    cols = ["family", "variant", "metric", "workers", "settings", "median", "min", "max", "unit", "ok", "failed",
            "reference", "normalised", "norm_lo", "norm_hi"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: (fmt(r[k], 6) if isinstance(r[k], float) else r[k]) for k in cols})


def markdown_family(fam, rows):
    """The paper's kind of table: variants down, metrics across, normalised (> 1 is better)."""
    by = {(r["variant"], r["metric"]): r for r in rows}
    labels = [METRICS[mk].label for mk in fam.metrics]
    out = [f"### {fam.title}\n",
           f"Normalised to `{fam.reference}` (> 1: better); median of the reps, (min..max) over the reps.\n",
           "| variant | workers | settings (vs ferry's defaults) | " + " | ".join(labels) + " |",
           "|---|---|---|" + "---|" * len(labels)]
    for name in fam.variants:
        cells = []
        first = None
        for mk in fam.metrics:
            r = by.get((name, mk))
            first = first or r
            if r is None or r["normalised"] is None:
                cells.append("failed" if r and r["failed"] else "")
                continue
            cell = f"{r['normalised']:.2f}"
            if r["ok"] > 1:
                cell += f" ({r['norm_lo']:.2f}..{r['norm_hi']:.2f})"
            if r["failed"]:
                cell += f" [{r['failed']} failed]"
            cells.append(cell)
        if first is None:
            continue
        out.append(f"| {name} | {first['workers']} | {first['settings']} | " + " | ".join(cells) + " |")
    # The reference's absolute numbers, so the ratios can be read back into msg/s and us.
    ref = [by.get((fam.reference, mk)) for mk in fam.metrics]
    absolute = [f"{METRICS[mk].label} {fmt(r['median'])} {r['unit']}" for mk, r in zip(fam.metrics, ref)
                if r and r["median"] is not None]
    if absolute:
        out.append(f"\n`{fam.reference}` medians: " + ", ".join(absolute) + ".")
    return "\n".join(out) + "\n"


def plot_family(fam, rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["variant"], r["metric"]): r for r in rows}
    names = [n for n in fam.variants if any((n, mk) in by for mk in fam.metrics)]
    nm = len(fam.metrics)
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + nm * (0.5 + 0.28 * len(names))), 4.2))
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    values = []
    for i, name in enumerate(names):
        xs, ys, lo, hi = [], [], [], []
        for j, mk in enumerate(fam.metrics):
            r = by.get((name, mk))
            if r is None or r["normalised"] is None:
                continue
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(r["normalised"])
            lo.append(max(0.0, r["normalised"] - (r["norm_lo"] or r["normalised"])))
            hi.append(max(0.0, (r["norm_hi"] or r["normalised"]) - r["normalised"]))
            values += [r["normalised"], r["norm_lo"] or r["normalised"], r["norm_hi"] or r["normalised"]]
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=name, color=cmap(i % cmap.N),
               edgecolor="black", linewidth=0.4)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(nm))
    ax.set_xticklabels([METRICS[mk].label for mk in fam.metrics])
    positive_values = [v for v in values if v and v > 0]
    # Ratios far apart (a collapsing variant next to 1.0) read best on a log axis, labelled
    # "0.5", "2" rather than matplotlib's "10^0".
    if positive_values and max(positive_values) / min(positive_values) > 3:
        from matplotlib import ticker
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_ylabel(f"performance relative to {fam.reference} (> 1 better)")
    ax.set_title(fam.title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=min(5, len(names)), loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_average():
    """The 1-minute load average: on a shared machine it says how much else was running."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def study_info():
    return {"date": f"{datetime.datetime.now():%Y-%m-%d %H:%M}", "host": platform.node(), "cores": CORES,
            "ferry": git_rev(), "load_start": load_average()}


def load_note(info):
    if info.get("load_start") is None:
        return ""
    end = f", {info['load_end']} at the end" if info.get("load_end") is not None else ""
    return f" (1-minute load average {info['load_start']} at the start{end})"


def header(a, argv, info):
    return "\n".join([
        f"- date {info['date']}, host {info['host']}, {info.get('cores', '?')} cores, ferry {info['ferry']}",
        f"- command: `{' '.join(shlex.quote(x) for x in ['factor_study.py'] + argv)}`",
        f"- {a.reps} reps per value (median; min..max in summary.csv), timeout {a.timeout} s per run, "
        f"`ferryrun -n 2`, parcelport ferry, provider {os.environ.get('FERRY_PROVIDER', 'auto')}",
        f"- workers per rank: {a.threads} (oversubscribed family {a.over_threads}, attentiveness "
        f"{a.att_threads})",
        f"- rate: flood, nsteps 1, all chains from rank 0: {a.rate_chains} x 8 B, {a.rate_chains_zc} x 16 KiB; "
        f"msg/s of the sender",
        f"- latency: {a.lat_chains} chains x {a.lat_steps} hops (8 B), x {a.lat_steps_zc} hops (16 KiB); "
        f"us per hop, normalised inverted",
        f"- attentiveness: {','.join(map(str, a.att_chains))} chains x {a.att_steps} hops of 8 B, {a.task_us} us of "
        f"computation per task ({'fixed' if a.task_dist == 'fixed' else 'exponential, that mean'}; "
        f"{'busy-spinning' if a.task_mode == 'spin' else 'sleeping: a core of its own'}"
        f"{', run inline by the polling worker' if a.att_inline else ''})",
        "- the machine is shared and has few cores: absolute numbers are noisy; read the ratios, and the "
        "min..max spread next to them" + load_note(info),
    ] + ([f"- extra environment: {', '.join(a.env)}"] if a.env else []))


def report(a, argv, info, records, out_dir):
    stats = aggregate(records)
    probes = [float(r["c2c_ns"]) for r in records if r.get("c2c_ns") not in (None, "")]
    rows, md = [], ["# ferry factor study ([AMT-LCI] §5)\n", header(a, argv, info), "- " + c2c_summary(probes), ""]
    pngs = []
    for fam in a.family_list:
        fr = family_rows(a, fam, stats)
        rows += fr
        md.append(markdown_family(fam, fr))
        if not a.no_plots and fr:
            name = f"{fam.key}.png"
            try:
                plot_family(fam, fr, out_dir / name)
                pngs.append(name)
            except ImportError as e:
                print(f"factor-study: no plots: {e} (install python3-matplotlib; run with /usr/bin/python3)")
                a.no_plots = True
                a.plot_failed = True
    write_summary_csv(rows, out_dir / "summary.csv")
    bad = [r for r in records if r["status"] != "ok"]
    if bad:
        md.append(f"\n**{len(bad)} of {len(records)} runs did not succeed** (runs.csv: status, exit, stderr):\n")
        for r in bad:
            md.append(f"- {r['variants']} {r['metric']} rep {r['rep'] + 1}: {r['status']} (exit {r['exit']}) "
                      f"{why_failed(r['stderr'])[:200]}")
    (out_dir / "summary.md").write_text("\n".join(md) + "\n")
    print("\n" + "\n".join(md[3:]))
    print(f"factor-study: wrote {out_dir}: runs.csv summary.csv summary.md {' '.join(pngs)}", flush=True)
    return bad


def list_variants(a):
    for fam in a.family_list:
        print(f"{fam.key}: {fam.title} (reference {fam.reference}; metrics {', '.join(fam.metrics)})")
        for name in fam.variants:
            v = a.variant_table[name]
            print(f"  {name:<20} workers={workers_of(a, v):<3} {describe(tuple(v.env().items()))}"
                  + (f"  -- {v.note}" if v.note else ""))


def read_runs(path):
    with open(path, newline="") as f:
        records = list(csv.DictReader(f))
    for r in records:
        r["rep"] = int(r["rep"])
    return records


def replot(out_dir, no_plots):
    """Tables and plots again from a finished (or interrupted) study's runs.csv."""
    info = json.loads((out_dir / "study.json").read_text())
    argv = info["argv"]
    a = parse_args(argv + (["--no-plots"] if no_plots else []))
    bad = report(a, argv, info, read_runs(out_dir / "runs.csv"), out_dir)
    return 1 if bad or getattr(a, "plot_failed", False) else 0


def main(argv):
    a = parse_args(argv)
    if a.list:
        list_variants(a)
        return 0
    if a.replot:
        return replot(Path(a.replot), a.no_plots)
    for prog in ("ferry-chains", "ferryrun"):
        if not (Path(a.bin_dir) / prog).exists():
            sys.exit(f"factor-study: {Path(a.bin_dir) / prog} not found: build first "
                     f"(scripts/factor-study.sh does), or pass --bin-dir")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(a.out) if a.out else ROOT / "results" / f"factor-study-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    # What --replot needs to rebuild the same tables; the absolute --bin-dir does not matter there.
    info = study_info()
    (out_dir / "study.json").write_text(json.dumps({"argv": argv, **info}, indent=1) + "\n")
    records = sweep(a, out_dir)
    info["load_end"] = load_average()
    (out_dir / "study.json").write_text(json.dumps({"argv": argv, **info}, indent=1) + "\n")
    bad = report(a, argv, info, records, out_dir)
    if bad:
        print(f"factor-study: {len(bad)} of {len(records)} runs FAILED:", flush=True)
        for r in bad:
            print(f"  {r['variants']} {r['metric']} rep {r['rep'] + 1}: {r['status']} (exit {r['exit']}) "
                  f"{why_failed(r['stderr'])[:200]}", flush=True)
        return 1
    if getattr(a, "plot_failed", False):
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit("factor-study: interrupted (runs.csv holds the runs so far)")
