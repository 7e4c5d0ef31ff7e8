#!/usr/bin/python3
"""Compare ferry with its baselines on one libfabric provider, in one go.

Runs, each --reps times (interleaved, so that a burst of machine noise hits every program
alike), and reports medians:

  latency (half round trip, us)   ferry-bench pingpong   vs  fi_pingpong (libfabric's own)
                                                          vs  ferry-mpi-pingpong (MPICH)
  message rate (msgs/s)           ferry-bench msgrate    vs  ferry-fi-msgrate (raw libfabric)
                                                          vs  ferry-mpi-pingpong msgrate (MPICH)

fi_pingpong's "usec/xfer" is elapsed / iterations / 2 on the client, each iteration being one
send plus one receive: the half round trip, the same quantity as ferry's half_rtt_us.

Writes raw.jsonl (every JSON result), table.txt, summary.json and per-run logs into the
results folder. Python standard library only.
"""

import argparse
import datetime
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def log(msg):
    print(msg, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    """True once some process listens on TCP `port` (fi_pingpong's control socket).

    Probing with connect() would use up the server's single accept(), hence /proc."""
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    local, state = fields[1], fields[3]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        return True
        except OSError:
            continue
    return False


def json_lines(text):
    out = []
    for line in text.splitlines():
        i = line.find("{")
        if i < 0:
            continue
        try:
            out.append(json.loads(line[i:]))
        except ValueError:
            continue
    return out


def parse_fi_pingpong(text):
    """The data row under fi_pingpong's header:
    bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec"""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.split()[:2] == ["bytes", "#sent"] and i + 1 < len(lines):
            f = lines[i + 1].split()
            if len(f) < 8:
                break
            if not f[2].startswith("="):
                raise RuntimeError("fi_pingpong: sent and acknowledged counts differ: %s %s" % (f[1], f[2]))
            return {"half_rtt_us": float(f[6]), "mxfers_per_s": float(f[7]), "row": lines[i + 1].strip()}
    raise RuntimeError("no result row in fi_pingpong's output")


class Runner:
    def __init__(self, args):
        self.args = args
        self.bin = args.bin_dir
        self.env = dict(os.environ)
        self.env["FERRY_PROVIDER"] = args.provider
        self.mpi_env = dict(self.env)
        # MPICH here is ch4:ucx, which picks its own transports; on "tcp" it is held to TCP too
        # (unless the caller chose UCX_TLS), so that both sides cross the same loopback stack.
        if args.provider == "tcp" and "UCX_TLS" not in os.environ:
            self.mpi_env["UCX_TLS"] = "tcp,self"
        self.logs = os.path.join(args.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.raw = open(os.path.join(args.out, "raw.jsonl"), "w")

    def exe(self, name):
        path = os.path.join(self.bin, name)
        return path if os.access(path, os.X_OK) else None

    def save_log(self, tag, out, err):
        with open(os.path.join(self.logs, tag + ".out"), "w") as f:
            f.write(out or "")
        with open(os.path.join(self.logs, tag + ".err"), "w") as f:
            f.write(err or "")

    def run(self, tag, cmd, env, timeout):
        try:
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            self.save_log(tag, out, err)
            raise RuntimeError("timed out after %gs" % timeout)
        self.save_log(tag, p.stdout, p.stderr)
        if p.returncode != 0:
            last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError("exit %d: %s" % (p.returncode, last))
        return p.stdout

    def json_result(self, tag, cmd, env, bench):
        results = [j for j in json_lines(self.run(tag, cmd, env, self.args.timeout)) if j.get("bench") == bench]
        if len(results) != 1:
            raise RuntimeError("expected one %s JSON line, got %d" % (bench, len(results)))
        return results[0]

    # --- the programs ---------------------------------------------------------------------

    def ferryrun(self, *args):
        return [self.exe("ferryrun"), "-n", "2", "--no-prefix", "--timeout", str(max(1, int(self.args.timeout) - 5)),
                self.exe("ferry-bench")] + [str(a) for a in args]

    def ferry_pingpong(self, tag, size, iters):
        cmd = self.ferryrun("pingpong", "--size", size, "--iters", iters, "--json")
        return self.json_result(tag, cmd, self.env, "pingpong")

    def ferry_msgrate(self, tag, size, count):
        cmd = self.ferryrun("msgrate", "--size", size, "--count", count, "--window", self.args.window, "--json")
        return self.json_result(tag, cmd, self.env, "msgrate")

    def fi_msgrate(self, tag, size, count):
        cmd = [self.exe("ferry-fi-msgrate"), "-p", self.args.provider, "--size", str(size), "--count", str(count),
               "--window", str(self.args.window), "--timeout", str(self.args.timeout), "--json"]
        return self.json_result(tag, cmd, self.env, "fi_msgrate")

    def mpi(self, tag, bench, *args):
        cmd = [self.args.mpiexec, "-n", "2", self.exe("ferry-mpi-pingpong")] + [str(a) for a in args] + ["--json"]
        return self.json_result(tag, cmd, self.mpi_env, bench)

    def fi_pingpong(self, tag, size, iters):
        port = free_port()
        common = [self.args.fi_pingpong, "-p", self.args.provider, "-e", "rdm", "-S", str(size), "-I", str(iters)]
        server = subprocess.Popen(common + ["-B", str(port)], env=self.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 10
            while not listening(port):
                if server.poll() is not None:
                    raise RuntimeError("fi_pingpong server exited with %d before listening" % server.returncode)
                if time.monotonic() > deadline:
                    raise RuntimeError("fi_pingpong server did not listen on port %d within 10 s" % port)
                time.sleep(0.02)
            out = self.run(tag + "-client", common + ["-P", str(port), "127.0.0.1"], self.env, self.args.timeout)
            res = parse_fi_pingpong(out)
            sout, serr = server.communicate(timeout=15)
            self.save_log(tag + "-server", sout, serr)
        finally:
            if server.poll() is None:
                server.kill()
                server.communicate()
        res.update({"bench": "fi_pingpong", "size": size, "iters": iters, "provider": self.args.provider,
                    "ranks": 2, "threads": 1})
        return res


def iters_for(size, iters):
    """Fewer round trips for big messages, as fi_pingpong's own defaults do."""
    if size >= 1 << 20:
        return max(10, iters // 100)
    if size >= 1 << 16:
        return max(10, iters // 10)
    return iters


def fmt(value, kind):
    if value is None:
        return "failed"
    if kind == "latency":
        return "%.3f" % value
    if value >= 1e6:
        return "%.3fM" % (value / 1e6)
    if value >= 1e3:
        return "%.1fk" % (value / 1e3)
    return "%.0f" % value


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--provider", default=os.environ.get("FERRY_PROVIDER", "shm"),
                    help="libfabric provider for ferry and fi_pingpong (default: $FERRY_PROVIDER or shm)")
    ap.add_argument("--reps", type=int, default=None, help="runs of each measurement; medians reported (default 5)")
    ap.add_argument("--iters", type=int, default=None, help="ping-pong round trips for small sizes (default 10000)")
    ap.add_argument("--count", type=int, default=None, help="messages per rate run (default 200000)")
    ap.add_argument("--window", type=int, default=64, help="messages per acknowledgement in rate runs (default 64)")
    ap.add_argument("--sizes", default="8,4096,65536", help="ping-pong sizes in bytes (default 8,4096,65536)")
    ap.add_argument("--rate-sizes", default="8", help="message-rate sizes in bytes (default 8)")
    ap.add_argument("--quick", action="store_true", help="small counts and one repetition: a smoke test")
    ap.add_argument("--timeout", type=float, default=120, help="seconds allowed per program run (default 120)")
    ap.add_argument("--out", default=None, help="results folder (default results/compare-<timestamp>)")
    ap.add_argument("--bin-dir", default=os.path.join(os.path.dirname(HERE), "build", "bin"),
                    help="where ferry-bench, ferryrun and the baselines are (default: <repo>/build/bin)")
    ap.add_argument("--fi-pingpong", default="fi_pingpong", help="fi_pingpong executable")
    ap.add_argument("--mpiexec", default="mpiexec.hydra", help="MPICH's launcher (default mpiexec.hydra)")
    ap.add_argument("--skip", default="", help="comma-separated implementations to leave out: fi, mpi")
    args = ap.parse_args()

    def positive(name, value):
        if value is not None and value < 1:
            ap.error("--%s must be at least 1, got %d" % (name, value))
    positive("reps", args.reps)
    positive("iters", args.iters)
    positive("count", args.count)
    positive("window", args.window)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s]
        rate_sizes = [int(s) for s in args.rate_sizes.split(",") if s]
    except ValueError:
        ap.error("--sizes and --rate-sizes take comma-separated integers, got %r / %r" % (args.sizes, args.rate_sizes))
    if any(s < 0 for s in sizes + rate_sizes):
        ap.error("sizes must not be negative")
    if args.reps is None:
        args.reps = 1 if args.quick else 5
    if args.iters is None:
        args.iters = 500 if args.quick else 10000
    if args.count is None:
        args.count = 5000 if args.quick else 200000
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    if args.out is None:
        args.out = os.path.join("results", "compare-" + stamp)
    os.makedirs(args.out, exist_ok=True)
    args.bin_dir = os.path.abspath(args.bin_dir)

    r = Runner(args)
    for need in ("ferry-bench", "ferryrun"):
        if r.exe(need) is None:
            sys.exit("compare: %s not found in %s (build it, or pass --bin-dir)" % (need, args.bin_dir))

    # Each step: (key, kind, implementation label, size, function returning the metric).
    steps = []
    for size in sizes:
        n = iters_for(size, args.iters)
        steps.append((("latency", size), "ferry", "ferry",
                      lambda tag, s=size, n=n: r.ferry_pingpong(tag, s, n)["half_rtt_us"]))
        if "fi" not in skip:
            steps.append((("latency", size), "fi", "fi_pingpong",
                          lambda tag, s=size, n=n: r.fi_pingpong(tag, s, n)["half_rtt_us"]))
        if "mpi" not in skip:
            steps.append((("latency", size), "mpi", "MPI (MPICH)",
                          lambda tag, s=size, n=n: r.mpi(tag, "mpi_pingpong", "pingpong", "--size", s, "--iters",
                                                         n)["half_rtt_us"]))
    for size in rate_sizes:
        c = args.count
        steps.append((("rate", size), "ferry", "ferry", lambda tag, s=size, c=c: r.ferry_msgrate(tag, s, c)["msgs_per_s"]))
        if "fi" not in skip:
            steps.append((("rate", size), "fi", "raw libfabric",
                          lambda tag, s=size, c=c: r.fi_msgrate(tag, s, c)["msgs_per_s"]))
        if "mpi" not in skip:
            steps.append((("rate", size), "mpi", "MPI (MPICH)",
                          lambda tag, s=size, c=c: r.mpi(tag, "mpi_msgrate", "msgrate", "--size", s, "--count", c,
                                                         "--window", args.window)["msgs_per_s"]))

    missing = {}
    if r.exe("ferry-fi-msgrate") is None:
        missing["fi_rate"] = "ferry-fi-msgrate not built"
    if r.exe("ferry-mpi-pingpong") is None:
        missing["mpi"] = "ferry-mpi-pingpong not built (MPICH not found at configure time)"

    samples = {}   # (kind, size, impl) -> [values]
    errors = {}    # (kind, size, impl) -> [messages]
    labels = {}
    total = len(steps) * args.reps
    done = 0
    log("compare: provider %s, %d repetitions, results in %s" % (args.provider, args.reps, args.out))
    for rep in range(args.reps):
        for (kind, size), impl, label, fn in steps:
            done += 1
            key = (kind, size, impl)
            labels[key] = label
            what = "%-5s %-13s %-7s %7d B" % ("lat" if kind == "latency" else "rate", label, kind, size)
            tag = "%s-%s-%d-rep%d" % (impl, kind, size, rep + 1)
            reason = None
            if impl == "mpi" and "mpi" in missing:
                reason = missing["mpi"]
            elif impl == "fi" and kind == "rate" and "fi_rate" in missing:
                reason = missing["fi_rate"]
            t0 = time.monotonic()
            if reason is not None:
                errors.setdefault(key, []).append(reason)
                log("[%3d/%d] %s  rep %d/%d  skipped: %s" % (done, total, what, rep + 1, args.reps, reason))
                continue
            try:
                value = fn(tag)
                samples.setdefault(key, []).append(value)
                r.raw.write(json.dumps({"implementation": impl, "metric": kind, "size": size, "rep": rep + 1,
                                        "value": value, "tag": tag}) + "\n")
                r.raw.flush()
                log("[%3d/%d] %s  rep %d/%d  %s %s  (%.1f s)" % (
                    done, total, what, rep + 1, args.reps, fmt(value, kind), "us" if kind == "latency" else "msgs/s",
                    time.monotonic() - t0))
            except Exception as e:  # one failed run must not stop the comparison
                errors.setdefault(key, []).append(str(e))
                log("[%3d/%d] %s  rep %d/%d  FAILED: %s  (log: %s)" % (
                    done, total, what, rep + 1, args.reps, e, os.path.join(r.logs, tag + ".*")))
    # The full JSON results of every run, for whoever wants more than the medians.
    for name in sorted(os.listdir(r.logs)):
        if name.endswith(".out"):
            with open(os.path.join(r.logs, name)) as f:
                for j in json_lines(f.read()):
                    r.raw.write(json.dumps({"tag": name[:-4], "result": j}) + "\n")
    r.raw.close()

    def med(key):
        v = samples.get(key)
        return statistics.median(v) if v else None

    rows = []
    for kind, sizes_ in (("latency", sizes), ("rate", rate_sizes)):
        for size in sizes_:
            ferry = med((kind, size, "ferry"))
            for impl in ("fi", "mpi"):
                key = (kind, size, impl)
                if key not in labels:
                    continue
                base = med(key)
                ratio = ferry / base if ferry is not None and base not in (None, 0) else None
                rows.append({
                    "benchmark": "half RTT (us)" if kind == "latency" else "msg rate (msgs/s)",
                    "metric": kind, "size": size, "ferry": ferry, "baseline": labels[key], "baseline_value": base,
                    "ratio": ratio,
                    "ferry_runs": len(samples.get((kind, size, "ferry"), [])),
                    "baseline_runs": len(samples.get(key, [])),
                    "ferry_samples": samples.get((kind, size, "ferry"), []),
                    "baseline_samples": samples.get(key, []),
                    "ferry_errors": errors.get((kind, size, "ferry"), []),
                    "baseline_errors": errors.get(key, []),
                })

    def best(kind, key):
        v = samples.get(key)
        if not v:
            return None
        return min(v) if kind == "latency" else max(v)

    for row in rows:
        kind, size = row["metric"], row["size"]
        fb = best(kind, (kind, size, "ferry"))
        bb = best(kind, (kind, size, [k for k in ("fi", "mpi") if labels.get((kind, size, k)) == row["baseline"]][0]))
        row["ferry_best"], row["baseline_best"] = fb, bb
        row["ratio_best"] = fb / bb if fb is not None and bb not in (None, 0) else None

    def render(title, ferry_field, base_field, ratio_field):
        header = ("benchmark", "size", "ferry", "baseline", "value", "ratio")
        table = [header]
        for row in rows:
            r_ = row[ratio_field]
            ratio = "-" if r_ is None else ("%.2f" % r_ if r_ >= 0.1 else "%.2g" % r_)
            table.append((row["benchmark"], str(row["size"]), fmt(row[ferry_field], row["metric"]), row["baseline"],
                          fmt(row[base_field], row["metric"]), ratio))
        widths = [max(len(t[i]) for t in table) for i in range(len(header))]
        out = ["  ".join(c.ljust(widths[i]) if i in (0, 3) else c.rjust(widths[i]) for i, c in enumerate(t))
               for t in table]
        out.insert(1, "  ".join("-" * w for w in widths))
        return [title] + out

    # On a busy machine most runs can be disturbed; the best run is then the steadier estimate.
    lines = render("median of %d runs" % args.reps, "ferry", "baseline_value", "ratio")
    if args.reps > 1:
        lines += [""] + render("best of %d runs (lowest latency, highest rate)" % args.reps, "ferry_best",
                               "baseline_best", "ratio_best")
    notes = [
        "",
        "provider %s; ratio = ferry / baseline" % args.provider,
        "  latency: ratio > 1 means ferry is slower; rate: ratio < 1 means ferry is slower.",
        "  fi_pingpong times every iteration (no warmup); ferry and MPI skip 100 warmup round trips.",
        "  MPI is MPICH (ch4:ucx), which uses its own transports, not the libfabric provider%s." % (
            " (held to UCX_TLS=tcp,self)" if r.mpi_env.get("UCX_TLS") == "tcp,self" else ""),
    ]
    text = "\n".join(lines + notes) + "\n"
    with open(os.path.join(args.out, "table.txt"), "w") as f:
        f.write(text)
    summary = {
        "timestamp": stamp,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "provider": args.provider,
        "reps": args.reps,
        "iters": args.iters,
        "count": args.count,
        "window": args.window,
        "quick": args.quick,
        "bin_dir": args.bin_dir,
        "rows": rows,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    log("")
    sys.stdout.write(text)
    log("results: %s" % args.out)
    ferry_failed = any(k[2] == "ferry" for k in errors)
    return 1 if ferry_failed else 0


if __name__ == "__main__":
    sys.exit(main())
