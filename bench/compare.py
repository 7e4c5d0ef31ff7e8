#!/usr/bin/python3
"""Compare ferry, on each of its transports, with raw libfabric, MPICH, Open MPI and UCX, 2 ranks
on this machine, in one run.

Measurements (each program's own benchmark where it has one, the same schedule otherwise):

  latency        8 B one-way latency (half round trip), us
  msgrate        8 B message rate, 1 thread and T threads per rank, msgs/s (window W)
  bandwidth      16 KiB and 1 MiB streamed bandwidth (window W), MB/s (10^6 bytes/s)

Implementations:

  ferry <t>      ferry-bench under ferryrun, once per --transports entry: "shm" sets
                 FERRY_TRANSPORT=shm, "ofi:shm" FERRY_TRANSPORT=ofi FERRY_PROVIDER=shm. An entry
                 this ferry cannot run (no such FERRY_TRANSPORT choice, or a failing first run)
                 is skipped, and the table says why.
  raw libfabric  fi_pingpong (latency) and ferry-fi-msgrate (rate, bandwidth) on --provider.
  MPICH          ferry-mpi-pingpong under mpiexec.hydra.
  Open MPI       ferry-mpi-pingpong-openmpi (the same source) under mpirun.openmpi.
  UCX            ucx_perftest, server and client on localhost: ucp_am_lat, ucp_am_bw.
  UCX tag        the same with UCP's tagged messages: tag_lat, tag_bw.
  ferry ucx      (--transports ucx) runs with the UCX_TLS the UCX columns use, so it is held to
                 the same UCX transports.

Every measurement is repeated --reps times, interleaved (each repetition runs every point of
every implementation once, in an order rotated from one repetition to the next), and reported
as the median with min, max and n. Results go to results/bench-<timestamp>/: raw.jsonl (every
run), results.csv, table.md (medians, ratios ferry / best peer), plot.png, summary.json, logs/.

Python standard library; the plot needs matplotlib (Debian: python3-matplotlib, seen by
/usr/bin/python3) and is skipped with a note without it.
"""

import argparse
import csv
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

UNITS = {"latency": "us", "msgrate": "msgs/s", "bandwidth": "MB/s"}
PEERS = ("mpich", "openmpi", "ucx", "ucx-tag")  # "best peer": the best of these (raw libfabric is a floor, not a peer)


class NotApplicable(Exception):
    """This implementation has no such measurement (the reason is the message)."""


class RunFailed(Exception):
    pass


def log(msg):
    print(msg, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    """True once some process listens on TCP `port`. A probe by connect() would use up the
    server's single accept() (fi_pingpong, ucx_perftest), hence /proc."""
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
    for line in (text or "").splitlines():
        i = line.find("{")
        if i < 0:
            continue
        try:
            j = json.loads(line[i:])
        except ValueError:
            continue
        if isinstance(j, dict):
            out.append(j)
    return out


def parse_fi_pingpong(text):
    """The data row under fi_pingpong's header:
    bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
    usec/xfer is elapsed / iterations / 2 on the client, an iteration being a send and a
    receive: the half round trip."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.split()[:2] == ["bytes", "#sent"] and i + 1 < len(lines):
            f = lines[i + 1].split()
            if len(f) < 8:
                break
            if not f[2].startswith("="):
                raise RunFailed("fi_pingpong: sent and acknowledged counts differ: %s %s" % (f[1], f[2]))
            return {"half_rtt_us": float(f[6]), "row": lines[i + 1].strip()}
    raise RunFailed("no result row in fi_pingpong's output")


UCX_CSV_HEADER = "iterations,"


def parse_ucx_perftest(text):
    """ucx_perftest -f -v: a CSV header, then one final line. Single thread (8 fields):
    iterations, percentile latency, average latency, overall latency, average bandwidth,
    overall bandwidth, average message rate, overall message rate. With -T > 1 (4 fields):
    iterations, latency (mean over threads), bandwidth and message rate (summed over threads).
    Latencies are in us and already halved for ping-pong tests; bandwidth is in MiB/s."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    header = None
    for i, line in enumerate(lines):
        if line.startswith(UCX_CSV_HEADER):
            header = i
    if header is None:
        raise RunFailed("no CSV header in ucx_perftest's output (was -v honoured?)")
    rows = []
    for line in lines[header + 1:]:
        fields = line.split(",")
        try:
            rows.append([float(x) for x in fields])
        except ValueError:
            continue
    if not rows:
        raise RunFailed("no result line after ucx_perftest's CSV header")
    f = rows[-1]
    if len(f) == 8:
        return {"iterations": f[0], "latency_percentile_us": f[1], "latency_avg_us": f[2], "latency_overall_us": f[3],
                "bandwidth_overall_mibps": f[5], "msgrate_overall": f[7], "threads_format": 1,
                "row": lines[-1]}
    if len(f) == 4:
        return {"iterations": f[0], "latency_overall_us": f[1], "bandwidth_overall_mibps": f[2], "msgrate_overall": f[3],
                "threads_format": "multi", "row": lines[-1]}
    raise RunFailed("ucx_perftest result line has %d fields, expected 8 or 4: %s" % (len(f), lines[-1]))


def reason(err, out):
    """The line of a failed run's output that says why: the first that names an error, else the
    last (a launcher's own last words, "terminating the other rank", say little)."""
    lines = [l.strip() for l in (err or "").splitlines() + (out or "").splitlines() if l.strip()]
    if not lines:
        return "(no output)"
    for line in lines:
        if re.search(r"error|fail|abort|invalid|not |no |cannot|unknown|denied", line, re.IGNORECASE) and \
                not line.startswith("ferryrun: terminating"):
            return line[:300]
    return lines[-1][:300]


def kill_group(proc):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


class Runner:
    """Runs programs with a timeout each, keeps every run's output under logs/."""

    def __init__(self, args):
        self.args = args
        self.logs = os.path.join(args.out, "logs")
        os.makedirs(self.logs, exist_ok=True)

    def save_log(self, tag, out, err):
        with open(os.path.join(self.logs, tag + ".out"), "w") as f:
            f.write(out or "")
        with open(os.path.join(self.logs, tag + ".err"), "w") as f:
            f.write(err or "")

    def run(self, tag, cmd, env, timeout=None):
        """stdout of cmd, run in its own process group (so that a timeout takes the launcher
        and every rank with it); RunFailed on a non-zero exit or a timeout."""
        timeout = timeout or self.args.timeout
        try:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
        except OSError as e:
            raise RunFailed("cannot start %s: %s" % (cmd[0], e))
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
            self.save_log(tag, out, err)
            raise RunFailed("timed out after %gs" % timeout)
        self.save_log(tag, out, err)
        if proc.returncode != 0:
            raise RunFailed("exit %d: %s" % (proc.returncode, reason(err, out)))
        return out

    def json_result(self, tag, cmd, env, bench):
        results = [j for j in json_lines(self.run(tag, cmd, env)) if j.get("bench") == bench]
        if len(results) != 1:
            raise RunFailed("expected one %s JSON line, got %d" % (bench, len(results)))
        return results[0]

    def server_client(self, tag, server_cmd, client_cmd, env):
        """A server that listens on a TCP port for its control connection, then a client:
        (client stdout, server stdout). The server is waited for, else killed."""
        server = subprocess.Popen(server_cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
        port = self._port_of(server_cmd)
        try:
            deadline = time.monotonic() + 15
            while not listening(port):
                if server.poll() is not None:
                    sout, serr = server.communicate()
                    self.save_log(tag + "-server", sout, serr)
                    raise RunFailed("%s server exited with %d before listening on port %d" % (
                        os.path.basename(server_cmd[0]), server.returncode, port))
                if time.monotonic() > deadline:
                    raise RunFailed("%s server did not listen on port %d within 15 s" % (
                        os.path.basename(server_cmd[0]), port))
                time.sleep(0.02)
            out = self.run(tag + "-client", client_cmd, env)
            try:
                sout, serr = server.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                kill_group(server)
                sout, serr = server.communicate()
            self.save_log(tag + "-server", sout, serr)
            return out, sout
        finally:
            if server.poll() is None:
                kill_group(server)
                server.communicate()

    @staticmethod
    def _port_of(cmd):
        for flag in ("-B", "-p"):
            if flag in cmd:
                return int(cmd[cmd.index(flag) + 1])
        raise ValueError("no port in %r" % cmd)


# --- implementations -----------------------------------------------------------------------
#
# Each has measure(metric, size, threads, count, tag) -> (value, details); details is the
# program's JSON result (or the parsed row of a program without JSON) and goes to raw.jsonl.


class Impl:
    key = ""
    label = ""
    family = ""          # ferry, raw, peer
    env_set = {}         # the variables this implementation's runs set (recorded per row)
    skipped = None       # reason, when the implementation cannot run at all

    def __init__(self, r, args):
        self.r = r
        self.args = args

    def exe(self, name):
        path = os.path.join(self.args.bin_dir, name)
        return path if os.access(path, os.X_OK) else None

    def describe(self):
        return {}


class Ferry(Impl):
    family = "ferry"

    def __init__(self, r, args, entry):
        super().__init__(r, args)
        self.entry = entry
        entry, *suffixes = entry.split("@")
        # "handler": the latency runs use ferry-bench pingpong --inbox handler; "reply": --inbox
        # reply (the Handler answers the message itself).
        self.inbox = next((x for x in suffixes if x in ("handler", "reply")), None)
        # "serialized": FERRY_LOCK_MODEL=serialized (no lock; UCX's worker unlocked too), each
        # thread of a multi-thread rate with a device of its own.
        self.serialized = "serialized" in suffixes
        transport, _, provider = entry.partition(":")
        self.transport = transport
        self.provider_req = provider or None
        self.key = "ferry-" + self.entry.replace(":", "-").replace("@", "-")
        self.label = "ferry " + self.entry
        self.env = {k: v for k, v in os.environ.items() if k not in ("FERRY_TRANSPORT", "FERRY_PROVIDER")}
        self.env_set = {"FERRY_TRANSPORT": transport}
        if provider:
            self.env_set["FERRY_PROVIDER"] = provider
        if self.serialized:
            self.env_set["FERRY_LOCK_MODEL"] = "serialized"
        self.env.update(self.env_set)
        self.seen_provider = None
        self.seen_transport = None
        self.transport_source = None
        self.notes = []

    def ferryrun(self, *args):
        return [self.exe("ferryrun"), "-n", "2", "--no-prefix", "--timeout", str(max(1, int(self.args.timeout) - 5)),
                self.exe("ferry-bench")] + [str(a) for a in args]

    def _check(self, j):
        """Names the transport and provider of the run; a run on another transport than the
        one asked for is not counted as this transport's."""
        self.seen_provider = j.get("provider")
        if "transport" in j:
            self.seen_transport, self.transport_source = j["transport"], "ferry-bench JSON"
            # ferry names the backends it used: "shm", "ofi/<provider>", or "shm+ofi/<provider>".
            used = [t.split("/", 1)[0] for t in j["transport"].split("+")]
            if self.transport != "auto" and used != [self.transport]:
                raise RunFailed("asked for FERRY_TRANSPORT=%s, ferry ran on %s" % (self.transport, j["transport"]))
        else:
            self.seen_transport, self.transport_source = self.transport, "as set by FERRY_TRANSPORT; ferry-bench does not report it"
        # libfabric names layered providers "core;utility" (tcp;ofi_rxm): the core one was asked for.
        seen = str(j.get("provider") or "")
        if self.provider_req and seen and self.provider_req not in (seen, seen.split(";")[0]):
            raise RunFailed("asked for FERRY_PROVIDER=%s, ferry ran on %s" % (self.provider_req, j.get("provider")))

    def probe(self, known_transports):
        """None when this entry can run, else why not. known_transports: the FERRY_TRANSPORT
        choices ferry-info lists ([] when it has no such option, None when unknown)."""
        if known_transports is not None and self.transport not in known_transports:
            if not known_transports and self.transport in ("ofi", "auto"):
                self.notes.append("this ferry has no FERRY_TRANSPORT option: libfabric (ofi) is its only transport")
            elif not known_transports:
                return ("this ferry has no FERRY_TRANSPORT option (ferry-info does not list it), so "
                        "FERRY_TRANSPORT=%s would be ignored and the run would use libfabric" % self.transport)
            else:
                return "FERRY_TRANSPORT=%s is not one of this ferry's choices (%s)" % (
                    self.transport, ", ".join(known_transports))
        try:
            j = self.r.json_result(self.key + "-probe", self.ferryrun("pingpong", "--size", 8, "--iters", 200, "--json"),
                                   self.env, "pingpong")
            self._check(j)
        except RunFailed as e:
            return "its first run failed: %s (log: logs/%s-probe.*)" % (e, self.key)
        return None

    def measure(self, metric, size, threads, count, tag):
        if metric == "latency":
            inbox = ["--inbox", self.inbox] if self.inbox else []
            j = self.r.json_result(tag, self.ferryrun("pingpong", "--size", size, "--iters", count, "--json", *inbox),
                                   self.env, "pingpong")
            self._check(j)
            if self.inbox and j.get("inbox") != self.inbox:
                raise RunFailed("asked for --inbox %s, ferry-bench reports inbox %s" % (self.inbox, j.get("inbox")))
            return j["half_rtt_us"], j
        if self.inbox:
            raise NotApplicable("--inbox is a pingpong option: rates and bandwidths are those of ferry %s" %
                                self.entry.split("@")[0])
        devices = ["--devices", threads] if self.serialized and threads > 1 else []
        j = self.r.json_result(tag, self.ferryrun("msgrate", "--size", size, "--count", count, "--window",
                                                  self.args.window, "--threads", threads, "--json", *devices),
                               self.env, "msgrate")
        self._check(j)
        if j.get("threads") != threads:
            raise RunFailed("ferry-bench ran %s threads, asked for %d" % (j.get("threads"), threads))
        if self.serialized and j.get("lock_model") != "serialized":
            raise RunFailed("asked for FERRY_LOCK_MODEL=serialized, ferry-bench reports %s" % j.get("lock_model"))
        return (j["msgs_per_s"] if metric == "msgrate" else j["mbytes_per_s"]), j

    def describe(self):
        return {"env": self.env_set, "transport": self.seen_transport, "transport_source": self.transport_source,
                "provider": self.seen_provider, "inbox": self.inbox or "queue",
                "lock_model": "serialized" if self.serialized else self.env.get("FERRY_LOCK_MODEL", "lockless (default)")}


class RawLibfabric(Impl):
    key = "libfabric"
    family = "raw"

    def __init__(self, r, args):
        super().__init__(r, args)
        self.label = "raw libfabric " + args.provider
        self.env = dict(os.environ)
        self.env_set = {}
        if not shutil.which(args.fi_pingpong) and self.exe("ferry-fi-msgrate") is None:
            self.skipped = "neither fi_pingpong nor ferry-fi-msgrate found"

    def measure(self, metric, size, threads, count, tag):
        if threads != 1:
            raise NotApplicable("ferry-fi-msgrate is single-threaded")
        if metric == "latency":
            if not shutil.which(self.args.fi_pingpong):
                raise RunFailed("%s not found (libfabric-bin)" % self.args.fi_pingpong)
            port = free_port()
            common = [self.args.fi_pingpong, "-p", self.args.provider, "-e", "rdm", "-S", str(size), "-I", str(count)]
            out, _ = self.r.server_client(tag, common + ["-B", str(port)], common + ["-P", str(port), "127.0.0.1"],
                                          self.env)
            res = parse_fi_pingpong(out)
            res.update({"bench": "fi_pingpong", "size": size, "iters": count, "provider": self.args.provider})
            return res["half_rtt_us"], res
        prog = self.exe("ferry-fi-msgrate")
        if prog is None:
            raise RunFailed("ferry-fi-msgrate not built")
        j = self.r.json_result(tag, [prog, "-p", self.args.provider, "--size", str(size), "--count", str(count),
                                     "--window", str(self.args.window), "--timeout", str(self.args.timeout), "--json"],
                               self.env, "fi_msgrate")
        return (j["msgs_per_s"] if metric == "msgrate" else j["mbytes_per_s"]), j

    def describe(self):
        return {"provider": self.args.provider}


class Mpi(Impl):
    family = "peer"

    def __init__(self, r, args, key, label, launcher, program, env_set):
        super().__init__(r, args)
        self.key, self.label, self.launcher, self.program = key, label, launcher, program
        self.env_set = env_set
        self.env = dict(os.environ)
        self.env.update(env_set)
        self.library = None
        if not shutil.which(launcher[0]):
            self.skipped = "%s not found" % launcher[0]
        elif self.exe(program) is None:
            self.skipped = "%s not built (its MPI was not found at configure time)" % program

    def measure(self, metric, size, threads, count, tag):
        if threads != 1:
            raise NotApplicable("the MPI program is single-threaded")
        cmd = self.launcher + ["-n", "2", self.exe(self.program)]
        if metric == "latency":
            j = self.r.json_result(tag, cmd + ["pingpong", "--size", str(size), "--iters", str(count), "--json"],
                                   self.env, "mpi_pingpong")
            value = j["half_rtt_us"]
        else:
            j = self.r.json_result(tag, cmd + ["msgrate", "--size", str(size), "--count", str(count), "--window",
                                               str(self.args.window), "--json"], self.env, "mpi_msgrate")
            value = j["msgs_per_s"] if metric == "msgrate" else j["mbytes_per_s"]
        self.library = " ".join(str(j.get("mpi_library", "")).split()) or None
        return value, j

    def describe(self):
        return {"env": self.env_set, "mpi_library": self.library, "launcher": " ".join(self.launcher)}


class Ucx(Impl):
    family = "peer"

    def __init__(self, r, args, env_set, api="am"):
        super().__init__(r, args)
        self.api = api
        self.key = "ucx" if api == "am" else "ucx-tag"
        self.label = "UCX" if api == "am" else "UCX tag"
        self.env_set = env_set
        self.env = dict(os.environ)
        self.env.update(env_set)
        if not shutil.which(args.ucx_perftest):
            self.skipped = "%s not found (Debian: ucx-utils)" % args.ucx_perftest

    def measure(self, metric, size, threads, count, tag):
        port = free_port()
        if metric == "latency":
            test = ["-t", "ucp_am_lat" if self.api == "am" else "tag_lat", "-s", str(size), "-n", str(count), "-w", "1000"]
        else:
            # -O: sends outstanding at once, the closest to ferry's window (ucp_am_bw has no
            # acknowledgements); -w: warmup iterations, a window's worth for large messages.
            warmup = "1000" if size <= 4096 else str(2 * self.args.window)
            test = ["-t", "ucp_am_bw" if self.api == "am" else "tag_bw", "-s", str(size), "-n", str(count), "-w", warmup,
                    "-O", str(self.args.window)]
        if threads > 1:
            test += ["-T", str(threads), "-M", "multi"]
        common = [self.args.ucx_perftest, "-p", str(port), "-f", "-v"] + test
        out, sout = self.r.server_client(tag, common, [self.args.ucx_perftest, "127.0.0.1"] + common[1:], self.env)
        res = parse_ucx_perftest(out)
        res.update({"bench": "ucx_perftest", "test": test[1], "size": size, "threads": threads, "args": test})
        if metric == "latency":
            return res["latency_overall_us"], res
        if metric == "msgrate":
            return res["msgrate_overall"], res
        return res["msgrate_overall"] * size / 1e6, res

    def describe(self):
        return {"env": self.env_set, "UCX_TLS": self.env.get("UCX_TLS", "(unset: UCX's default selection)"),
                "tests": "ucp_am_lat, ucp_am_bw" if self.api == "am" else "tag_lat, tag_bw"}


# --- the run -------------------------------------------------------------------------------


def ferry_transport_choices(bin_dir):
    """The FERRY_TRANSPORT choices ferry-info lists: a list, [] when it has no such option,
    None when ferry-info is not there or fails."""
    prog = os.path.join(bin_dir, "ferry-info")
    if not os.access(prog, os.X_OK):
        return None
    try:
        p = subprocess.run([prog], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if p.returncode != 0:
        return None
    lines = p.stdout.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("FERRY_TRANSPORT"):
            for follow in lines[i + 1:i + 4]:
                m = re.search(r"choice:\s*([^;]+)", follow)
                if m:
                    return [c.strip() for c in m.group(1).split(",") if c.strip()]
            return ["auto"]  # listed, choices not shown: only the entry's own run can tell
    return []


def versions(args):
    def first_line(cmd):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
            text = (p.stdout or p.stderr).strip()
            return " ".join(text.splitlines()[0].replace("#", " ").split()) if text else None
        except (OSError, subprocess.SubprocessError):
            return None
    out = {}
    for name, cmd in (("libfabric", ["fi_info", "--version"]), ("mpich", ["mpichversion"]),
                      ("openmpi", ["ompi_info", "--version"]), ("ucx", ["ucx_info", "-v"])):
        v = first_line(cmd)
        if v:
            out[name] = v
    if "ucx" in out:
        # Debian's UCX keeps its assertions, cluster builds drop them, and on the shared-memory
        # path one of them costs a cache-line transfer per message: say which this one is.
        try:
            p = subprocess.run(["ucx_info", "-b"], capture_output=True, text=True, timeout=20)
            on = any(line.split()[:2] == ["#define", "ENABLE_ASSERT"] for line in p.stdout.splitlines())
            out["ucx"] += " (assertions %s)" % ("on" if on else "off")
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def c2c_probe(bin_dir):
    prog = os.path.join(bin_dir, "ferry-c2c")
    if not os.access(prog, os.X_OK) or (os.cpu_count() or 1) < 2:
        return None
    try:
        p = subprocess.run([prog], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    for j in json_lines(p.stdout):
        if j.get("bench") == "c2c":
            return round(j["round_trip_ns"], 1)
    return None


def fmt(value, metric):
    if value is None:
        return "–"
    if metric == "latency":
        return "%.3f" % value if value < 100 else "%.0f" % value
    if metric == "msgrate":
        return "%.3g M" % (value / 1e6) if value >= 1e5 else "%.3g k" % (value / 1e3)
    return "%.0f" % value if value >= 100 else "%.3g" % value


def size_name(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return "%d MiB" % (n >> 20)
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return "%d KiB" % (n >> 10)
    return "%d B" % n


def point_name(metric, size, threads):
    if metric == "latency":
        return "%s one-way latency (µs)" % size_name(size)
    if metric == "msgrate":
        return "%s message rate, %d thread%s (msgs/s)" % (size_name(size), threads, "" if threads == 1 else "s")
    return "%s bandwidth, window W (MB/s)" % size_name(size)


def better(metric, a, b):
    """True when a is better than b."""
    return a < b if metric == "latency" else a > b


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transports", default="shm,shm@handler,ofi:shm,ucx",
                    help="ferry transports, comma-separated: NAME sets FERRY_TRANSPORT=NAME, NAME:PROV also "
                         "FERRY_PROVIDER=PROV; a suffix @handler measures latency only, with the message handed "
                         "to a Handler instead of popped from a CompletionQueue; @reply measures latency only, "
                         "with the Handler posting the answer itself (pingpong --inbox reply); @serialized (combinable "
                         "with either, e.g. ucx@serialized@reply) runs it under "
                         "FERRY_LOCK_MODEL=serialized (no lock; a device per thread in the T-thread rate) "
                         "(default shm,shm@handler,ofi:shm,ucx; e.g. shm,ofi:shm,ofi:tcp,ucx@serialized)")
    ap.add_argument("--provider", default="shm", help="libfabric provider of the raw libfabric baseline (default shm)")
    ap.add_argument("--threads", type=int, default=2, help="T, threads per rank of the T-thread message rate (default 2)")
    ap.add_argument("--reps", type=int, default=None, help="runs of each measurement; medians reported (default 5)")
    ap.add_argument("--iters", type=int, default=None, help="round trips per latency run (default 20000)")
    ap.add_argument("--count", type=int, default=None, help="8 B messages per thread per rate run (default 500000)")
    ap.add_argument("--bw-bytes", type=int, default=None,
                    help="bytes per bandwidth run; count = bytes / size, at least 4 windows (default 1 GiB)")
    ap.add_argument("--bw-sizes", default="16384,1048576", help="bandwidth message sizes (default 16384,1048576)")
    ap.add_argument("--window", type=int, default=64, help="W: messages per window in rate and bandwidth runs (default 64)")
    ap.add_argument("--quick", action="store_true", help="one repetition and small counts: a smoke test of every program")
    ap.add_argument("--timeout", type=float, default=120, help="seconds allowed per program run (default 120)")
    ap.add_argument("--out", default=None, help="results folder (default results/bench-<timestamp>)")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"),
                    help="where ferry-bench, ferryrun and the baselines are (default: <repo>/build/bin)")
    ap.add_argument("--skip", default="", help="comma-separated implementations to leave out: libfabric, mpich, openmpi, ucx")
    ap.add_argument("--fi-pingpong", default="fi_pingpong", help="fi_pingpong executable")
    ap.add_argument("--mpiexec", default="mpiexec.hydra", help="MPICH's launcher (default mpiexec.hydra)")
    ap.add_argument("--mpirun-openmpi", default="mpirun.openmpi", help="Open MPI's launcher (default mpirun.openmpi)")
    ap.add_argument("--ucx-perftest", default="ucx_perftest", help="ucx_perftest executable (Debian: ucx-utils)")
    args = ap.parse_args()

    for name in ("reps", "iters", "count", "bw_bytes", "window", "threads"):
        v = getattr(args, name)
        if v is not None and v < 1:
            ap.error("--%s must be at least 1, got %d" % (name.replace("_", "-"), v))
    if args.threads < 2:
        ap.error("--threads must be at least 2 (the 1-thread rate is always measured), got %d" % args.threads)
    try:
        bw_sizes = [int(s) for s in args.bw_sizes.split(",") if s.strip()]
    except ValueError:
        ap.error("--bw-sizes takes comma-separated integers, got %r" % args.bw_sizes)
    if not bw_sizes or any(s < 1 for s in bw_sizes):
        ap.error("--bw-sizes needs sizes of at least 1 byte, got %r" % args.bw_sizes)
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    def well_formed(t):
        suffixes = t.split("@")[1:]
        return (re.fullmatch(r"[a-z][a-z0-9_]*(:[A-Za-z0-9_;.-]+)?(@(handler|reply|serialized))*", t) is not None and
                len(set(suffixes)) == len(suffixes) and not {"handler", "reply"} <= set(suffixes))
    bad = [t for t in transports if not well_formed(t)]
    if not transports or bad:
        ap.error("--transports: %r: each entry is NAME or NAME:PROVIDER (shm, ofi:shm, ofi:tcp ...), optionally "
                 "with @handler (latency with ferry-bench pingpong --inbox handler) or @reply (--inbox reply), "
                 "and/or @serialized "
                 "(FERRY_LOCK_MODEL=serialized)" % args.transports)
    if len(set(transports)) != len(transports):
        ap.error("--transports lists an entry twice: %r" % args.transports)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = skip - {"libfabric", "mpich", "openmpi", "ucx"}
    if unknown:
        ap.error("--skip: %s: each must be one of libfabric, mpich, openmpi, ucx" % ", ".join(sorted(unknown)))
    if args.reps is None:
        args.reps = 1 if args.quick else 5
    if args.iters is None:
        args.iters = 2000 if args.quick else 20000
    if args.count is None:
        args.count = 20000 if args.quick else 500000
    if args.bw_bytes is None:
        args.bw_bytes = (64 << 20) if args.quick else (1 << 30)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    if args.out is None:
        args.out = os.path.join(ROOT, "results", "bench-" + stamp)
    os.makedirs(args.out, exist_ok=True)
    args.bin_dir = os.path.abspath(args.bin_dir)
    for need in ("ferry-bench", "ferryrun"):
        if not os.access(os.path.join(args.bin_dir, need), os.X_OK):
            sys.exit("compare: %s not found in %s (build it, or pass --bin-dir)" % (need, args.bin_dir))

    r = Runner(args)
    # On tcp the peers are held to TCP too (unless the caller chose their transports), so that
    # every implementation crosses the same loopback stack.
    tcp = args.provider == "tcp"
    ucx_env = {"UCX_TLS": "tcp,self"} if tcp and "UCX_TLS" not in os.environ else {}
    ompi_env = {"OMPI_MCA_btl": "tcp,self", "OMPI_MCA_pml": "ob1"} if tcp and "OMPI_MCA_btl" not in os.environ else {}
    ferries = [Ferry(r, args, t) for t in transports]
    others = []
    if "libfabric" not in skip:
        others.append(RawLibfabric(r, args))
    if "mpich" not in skip:
        others.append(Mpi(r, args, "mpich", "MPICH", [args.mpiexec], "ferry-mpi-pingpong", dict(ucx_env)))
    if "openmpi" not in skip:
        others.append(Mpi(r, args, "openmpi", "Open MPI",
                          [args.mpirun_openmpi, "--allow-run-as-root", "--oversubscribe"],
                          "ferry-mpi-pingpong-openmpi", dict(ompi_env)))
    if "ucx" not in skip:
        others.append(Ucx(r, args, dict(ucx_env)))
        others.append(Ucx(r, args, dict(ucx_env), api="tag"))
    # ferry over UCX uses the UCX transports the UCX columns use.
    for f in ferries:
        if f.transport == "ucx":
            f.env.update(ucx_env)
            f.env_set.update(ucx_env)
    impls = ferries + others

    started = time.time()
    load_start = os.getloadavg()
    c2c = c2c_probe(args.bin_dir)
    log("compare: transports %s, raw libfabric on %s, T=%d, %d repetition(s), results in %s" % (
        ", ".join(transports), args.provider, args.threads, args.reps, args.out))
    log("compare: load average %.2f %.2f %.2f, cache-line round trip %s ns" % (load_start + (c2c,)))

    choices = ferry_transport_choices(args.bin_dir)
    for f in ferries:
        why = f.probe(choices)
        if why:
            f.skipped = why
            log("compare: %s skipped: %s" % (f.label, why))
        else:
            log("compare: %s runs: provider %s, transport %s (%s)" % (
                f.label, f.seen_provider, f.seen_transport, f.transport_source))
    for o in others:
        if o.skipped:
            log("compare: %s skipped: %s" % (o.label, o.skipped))

    def count_for(metric, size):
        if metric == "latency":
            return args.iters
        if metric == "msgrate":
            return args.count
        return max(4 * args.window, args.bw_bytes // size)

    points = [("latency", 8, 1), ("msgrate", 8, 1), ("msgrate", 8, args.threads)] + \
             [("bandwidth", s, 1) for s in bw_sizes]
    runnable = [i for i in impls if not i.skipped]
    samples = {}     # (impl key, metric, size, threads) -> [values]
    failures = {}    # same key -> [messages]
    na = {}          # same key -> reason
    raw = open(os.path.join(args.out, "raw.jsonl"), "w")
    total = len(points) * len(runnable) * args.reps
    done = 0
    for rep in range(args.reps):
        for p_index, (metric, size, threads) in enumerate(points):
            k = (rep + p_index) % max(1, len(runnable))
            order = runnable[k:] + runnable[:k]  # rotated, so no implementation always runs first
            for impl in order:
                done += 1
                key = (impl.key, metric, size, threads)
                if key in na:
                    continue
                n = count_for(metric, size)
                tag = "%s-%s-%d-t%d-rep%d" % (impl.key, metric, size, threads, rep + 1)
                what = "%-22s %-40s" % (impl.label, point_name(metric, size, threads))
                t0 = time.monotonic()
                row = {"rep": rep + 1, "implementation": impl.key, "label": impl.label, "family": impl.family,
                       "metric": metric, "unit": UNITS[metric], "size": size, "threads": threads, "count": n,
                       "window": None if metric == "latency" else args.window, "tag": tag}
                try:
                    value, details = impl.measure(metric, size, threads, n, tag)
                except NotApplicable as e:
                    na[key] = str(e)
                    continue
                except (RunFailed, KeyError, ValueError) as e:
                    failures.setdefault(key, []).append(str(e))
                    row.update({"ok": False, "error": str(e), "seconds": round(time.monotonic() - t0, 2)})
                    row.update(impl.describe())
                    raw.write(json.dumps(row) + "\n")
                    raw.flush()
                    log("[%3d/%d] %s rep %d  FAILED: %s" % (done, total, what, rep + 1, e))
                    continue
                samples.setdefault(key, []).append(value)
                row.update({"ok": True, "value": value, "seconds": round(time.monotonic() - t0, 2)})
                row.update(impl.describe())
                row["result"] = details
                raw.write(json.dumps(row) + "\n")
                raw.flush()
                log("[%3d/%d] %s rep %d  %s %s  (%.1f s)" % (done, total, what, rep + 1, fmt(value, metric),
                                                           UNITS[metric], time.monotonic() - t0))
    raw.close()
    load_end = os.getloadavg()

    # --- aggregation ---------------------------------------------------------------------
    stats = {}
    for key, v in samples.items():
        stats[key] = {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}

    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["implementation", "label", "metric", "unit", "size", "threads", "window", "median", "min", "max",
                    "n", "failed", "transport", "provider", "note"])
        for impl in impls:
            d = impl.describe()
            for metric, size, threads in points:
                key = (impl.key, metric, size, threads)
                s = stats.get(key)
                note = impl.skipped or na.get(key) or ""
                w.writerow([impl.key, impl.label, metric, UNITS[metric], size, threads,
                            "" if metric == "latency" else args.window,
                            *(("%.6g" % s[x]) if s else "" for x in ("median", "min", "max")),
                            s["n"] if s else 0, len(failures.get(key, [])),
                            d.get("transport") or "", d.get("provider") or "", note])

    def best_peer(metric, size, threads):
        best = None
        for impl in others:
            if impl.key not in PEERS:
                continue
            s = stats.get((impl.key, metric, size, threads))
            if s and (best is None or better(metric, s["median"], best[1])):
                best = (impl.label, s["median"])
        return best

    rows = []
    for metric, size, threads in points:
        bp = best_peer(metric, size, threads)
        row = {"metric": metric, "size": size, "threads": threads, "name": point_name(metric, size, threads),
               "best_peer": bp[0] if bp else None, "best_peer_value": bp[1] if bp else None, "values": {},
               "ratios": {}}
        for impl in impls:
            s = stats.get((impl.key, metric, size, threads))
            row["values"][impl.key] = s
            if impl.family == "ferry" and s and bp:
                row["ratios"][impl.key] = s["median"] / bp[1] if bp[1] else None
        rows.append(row)

    # --- table.md ------------------------------------------------------------------------
    def cell(impl, metric, size, threads):
        key = (impl.key, metric, size, threads)
        if impl.skipped:
            return "skipped"
        if key in na:
            return "n/a"
        s = stats.get(key)
        if not s:
            return "failed" if key in failures else "–"
        text = fmt(s["median"], metric)
        if failures.get(key):
            text += " (%d failed)" % len(failures[key])
        return text

    md = ["# ferry beside raw libfabric, MPICH, Open MPI and UCX: 2 ranks on one machine", ""]
    md.append("Run %s on %s (%d CPUs), %d repetition(s)%s, interleaved; medians. Load average %.2f at the start, "
              "%.2f at the end; cache-line round trip between cores 0 and 1: %s ns." % (
                  datetime.datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M"), platform.node(),
                  os.cpu_count() or 0, args.reps, " (--quick)" if args.quick else "", load_start[0], load_end[0],
                  c2c if c2c is not None else "?"))
    md.append("")
    header = ["measurement"] + [i.label for i in impls] + ["best peer"] + ["%s / best peer" % f.label for f in ferries]
    md.append("| " + " | ".join(header) + " |")
    md.append("|" + "---|" * len(header))
    for row in rows:
        metric, size, threads = row["metric"], row["size"], row["threads"]
        cells = [row["name"].replace("window W", "window %d" % args.window)]
        cells += [cell(i, metric, size, threads) for i in impls]
        cells.append("%s %s" % (row["best_peer"], fmt(row["best_peer_value"], metric)) if row["best_peer"] else "–")
        for f in ferries:
            ratio = row["ratios"].get(f.key)
            if ratio is None:
                cells.append("–")
            else:
                ahead = (ratio <= 1) if metric == "latency" else (ratio >= 1)
                cells.append("**%.2f**" % ratio if ahead else "%.2f" % ratio)
        md.append("| " + " | ".join(cells) + " |")
    md.append("")
    md.append("Spread (min–max over the runs, and n = successful runs):")
    md.append("")
    header = ["measurement"] + [i.label for i in impls]
    md.append("| " + " | ".join(header) + " |")
    md.append("|" + "---|" * len(header))
    for row in rows:
        metric, size, threads = row["metric"], row["size"], row["threads"]
        cells = [row["name"].replace("window W", "window %d" % args.window)]
        for i in impls:
            s = stats.get((i.key, metric, size, threads))
            cells.append("%s–%s (%d)" % (fmt(s["min"], metric), fmt(s["max"], metric), s["n"]) if s else cell(
                i, metric, size, threads))
        md.append("| " + " | ".join(cells) + " |")
    md += ["", "How to read it:", "",
           "- Ratio = ferry's median / the best peer's median, the best peer being the best of MPICH, Open MPI and "
           "UCX for that row (raw libfabric is shown as the floor of ferry's ofi transport, not counted as a peer). "
           "Latency: below 1 is ferry ahead; rate and bandwidth: above 1 is ferry ahead. Ahead is in **bold**.",
           "- Latency is the half round trip of an 8 B ping-pong: ferry-bench and the MPI program take the median "
           "of 5 chunks of the round trips, after 100 warmup round trips; fi_pingpong and ucx_perftest "
           "(its `overall` column) the mean of all round trips (fi_pingpong without warmup, ucx_perftest after "
           "1000).",
           "- Message rate and bandwidth: rank 0 sends windows of W = %d messages, rank 1 acknowledges each window "
           "with 8 bytes (ferry-bench msgrate, ferry-fi-msgrate, the MPI program: MPI_Isend into pre-posted "
           "MPI_Irecv). ucx_perftest ucp_am_bw has no acknowledgements: it keeps at most W sends outstanding "
           "(`-O %d`). MB/s is 10^6 bytes/s (ucx_perftest prints MiB/s; converted from its message rate)." % (
               args.window, args.window),
           "- T-thread rate (T = %d): ferry-bench `--threads %d`, each thread its own stream to its own inbox on "
           "one device (a device each for the @serialized entries: `--devices T`), rates summed; UCX `ucx_perftest -T %d -M multi`, rates summed over its threads. The MPI "
           "program and ferry-fi-msgrate are single-threaded: n/a. With 2 ranks × T threads on %d cores the "
           "threads share cores." % (args.threads, args.threads, args.threads, os.cpu_count() or 0),
           "- Counts per run: %d round trips; %d messages per thread at 8 B; %s bytes per bandwidth run "
           "(at least 4 windows)." % (args.iters, args.count, "{:,}".format(args.bw_bytes)),
           ""]
    md.append("Implementations:")
    md.append("")
    for impl in impls:
        d = impl.describe()
        if impl.family == "ferry":
            text = "ferry-bench under ferryrun with %s" % " ".join("%s=%s" % kv for kv in impl.env_set.items())
            if not impl.skipped:
                text += "; provider reported: %s; transport: %s (%s)" % (d.get("provider"), d.get("transport"),
                                                                         d.get("transport_source"))
            if impl.inbox == "handler":
                text += ("; latency only, with `pingpong --inbox handler`: each message is handed to a Handler run "
                         "inside progress, not pushed to a CompletionQueue the thread pops")
            elif impl.inbox == "reply":
                text += ("; latency only, with `pingpong --inbox reply`: each message's Handler, run inside "
                         "progress, posts the answer itself (rank 1 the reply, rank 0 the next ping), as "
                         "active-message code answering from its handler does")
            text += "".join("; " + n for n in impl.notes)
        elif impl.key == "libfabric":
            text = "fi_pingpong -p %s -e rdm; ferry-fi-msgrate -p %s" % (args.provider, args.provider)
        elif impl.key == "mpich":
            text = "ferry-mpi-pingpong under %s (%s)" % (args.mpiexec, d.get("mpi_library") or "library not seen")
            if impl.env_set:
                text += ", with %s" % " ".join("%s=%s" % kv for kv in impl.env_set.items())
        elif impl.key == "openmpi":
            text = "ferry-mpi-pingpong-openmpi under %s --allow-run-as-root --oversubscribe (%s), its default " \
                   "component selection" % (args.mpirun_openmpi, d.get("mpi_library") or "library not seen")
            if impl.env_set:
                text += ", with %s" % " ".join("%s=%s" % kv for kv in impl.env_set.items())
        else:
            text = "ucx_perftest server and client on 127.0.0.1 (%s), UCX_TLS %s" % (d.get("tests"), d.get("UCX_TLS"))
        if impl.skipped:
            text += " — **skipped: %s**" % impl.skipped
        md.append("- **%s**: %s" % (impl.label, text))
    fail_lines = []
    for (key, metric, size, threads), msgs in sorted(failures.items()):
        label = next(i.label for i in impls if i.key == key)
        fail_lines.append("- %s, %s: %d failed run(s), last: %s" % (label, point_name(metric, size, threads),
                                                                    len(msgs), msgs[-1]))
    if fail_lines:
        md += ["", "Failed runs (their logs are under logs/):", ""] + fail_lines
    vers = versions(args)
    if vers:
        md += ["", "Versions: " + "; ".join("%s: %s" % kv for kv in vers.items())]
    md += ["", "Files: raw.jsonl (every run, with the program's JSON or parsed row), results.csv (median, min, "
           "max, n per implementation × measurement), plot.png, summary.json, logs/.", ""]
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(md))

    summary = {"timestamp": stamp, "host": platform.node(), "cpus": os.cpu_count(), "load_start": load_start,
               "load_end": load_end, "c2c_round_trip_ns": c2c, "reps": args.reps, "quick": args.quick,
               "threads": args.threads, "window": args.window, "iters": args.iters, "count": args.count,
               "bw_bytes": args.bw_bytes, "provider": args.provider, "transports": transports,
               "ferry_transport_choices": choices, "versions": vers,
               "implementations": [dict(key=i.key, label=i.label, family=i.family, skipped=i.skipped, **i.describe())
                                   for i in impls],
               "rows": rows, "not_applicable": {"%s/%s/%d/%d" % k: v for k, v in na.items()},
               "failures": {"%s/%s/%d/%d" % k: v for k, v in failures.items()}}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")

    plot(args, impls, points, stats)

    log("")
    with open(os.path.join(args.out, "table.md")) as f:
        sys.stdout.write(f.read())
    log("results: %s" % args.out)

    # Exit 1 when ferry produced nothing, or a transport that passed its first run failed later.
    ferry_ok = [f for f in ferries if not f.skipped and any(k[0] == f.key for k in samples)]
    later = [k for k in failures if any(f.key == k[0] and not f.skipped for f in ferries)]
    if not ferry_ok:
        log("compare: no ferry transport produced a result")
        return 1
    if later:
        log("compare: ferry runs failed: %s" % ", ".join("%s %s %d" % k[:3] for k in later))
        return 1
    return 0


def plot(args, impls, points, stats):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("compare: matplotlib is missing (Debian: python3-matplotlib, seen by /usr/bin/python3); no plot")
        return
    panels = [("latency", "8 B one-way latency (µs, lower is better)", [p for p in points if p[0] == "latency"]),
              ("msgrate", "8 B message rate (M msgs/s)", [p for p in points if p[0] == "msgrate"]),
              ("bandwidth", "streamed bandwidth, window %d (GB/s)" % args.window,
               [p for p in points if p[0] == "bandwidth"])]
    scale = {"latency": 1.0, "msgrate": 1e-6, "bandwidth": 1e-3}
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (metric, title, pts) in zip(axes, panels):
        groups = [("%d thread%s" % (p[2], "" if p[2] == 1 else "s")) if metric == "msgrate" else
                  size_name(p[1]) for p in pts]
        width = 0.8 / max(1, len(impls))
        for n, impl in enumerate(impls):
            xs, ys, lo, hi = [], [], [], []
            for g, p in enumerate(pts):
                s = stats.get((impl.key,) + p)
                if not s:
                    continue
                k = scale[metric]
                xs.append(g + (n - (len(impls) - 1) / 2) * width)
                ys.append(s["median"] * k)
                lo.append((s["median"] - s["min"]) * k)
                hi.append((s["max"] - s["median"]) * k)
            if xs:
                ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=impl.label, color=colors[n % len(colors)],
                       hatch="//" if impl.family == "ferry" else None, edgecolor="black", linewidth=0.4)
        tops = [s["max"] for s in (stats.get((i.key,) + p) for i in impls for p in pts) if s]
        bottoms = [s["min"] for s in (stats.get((i.key,) + p) for i in impls for p in pts) if s and s["min"] > 0]
        if tops and bottoms and max(tops) / min(bottoms) > 30:
            ax.set_yscale("log")  # one disturbed run or a slow transport would flatten every other bar
            title += ", log scale"
        ax.set_xticks(range(len(pts)))
        ax.set_xticklabels(groups)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("2 ranks, one machine: median of %d run(s), bars span min–max" % args.reps, fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "plot.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
