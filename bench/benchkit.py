"""Pieces every benchmark driver shares (fig3.py, factor_study.py, microbench.py, lock_evidence.py).

Python standard library only, so /usr/bin/python3 runs it without a package index.
"""

import argparse
import datetime
import json
import os
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def positive(text):
    """argparse type: an integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer")
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def int_list(text, what=None, minimum=0):
    """A comma-separated list of integers >= minimum; `what` names the option in the message."""
    name = f"{what}: " if what else ""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}'{text}' is not a comma-separated list of integers")
    if not values or any(v < minimum for v in values):
        raise argparse.ArgumentTypeError(f"{name}'{text}' needs one or more integers >= {minimum}")
    return values


def name_list(allowed):
    """argparse type: a comma-separated list of names, each one of `allowed`."""
    def parse(text):
        values = [x.strip() for x in text.split(",") if x.strip()]
        bad = [v for v in values if v not in allowed]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"'{text}': each must be one of {', '.join(allowed)}")
        return values
    return parse


def check_env(parser, pairs):
    """Rejects an --env entry that is not KEY=VALUE, naming it."""
    for kv in pairs:
        if "=" not in kv or kv.startswith("="):
            parser.error(f"argument --env: '{kv}' is not KEY=VALUE")


def run_in_group(cmd, env, timeout, cwd=None):
    """Runs cmd in its own session; (exit code, stdout, stderr, wall seconds), exit code None
    when it was killed after `timeout` seconds. The launcher's own timeout (ferryrun --timeout,
    MPIEXEC_TIMEOUT) should fire first and clean up; this is the backstop, and it takes the whole
    process group (launcher and every rank), so nothing is left holding shared memory."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True, cwd=cwd)
    except OSError as e:
        return 127, "", str(e), 0.0
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        out, err = "", ""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = proc.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        return None, out or "", (err or "") + f"\n(killed after {timeout} s)", time.monotonic() - t0


def all_json(out, bench, key="bench"):
    """Every JSON object in `out`, one per line, whose `key` ("bench" by default; the proxy
    applications say "app") is `bench` (a launcher's "[0] " prefix is tolerated), in order."""
    found = []
    for line in (out or "").splitlines():
        i = line.find("{")
        if i < 0:
            continue
        try:
            j = json.loads(line[i:])
        except json.JSONDecodeError:
            continue
        if isinstance(j, dict) and j.get(key) == bench:
            found.append(j)
    return found


def last_json(out, bench, key="bench"):
    """The last of all_json(out, bench, key), or None."""
    found = all_json(out, bench, key)
    return found[-1] if found else None


def run_chains(cmd, env, timeout):
    """One ferry-chains job: (status, exit code, wall seconds, result, stderr); status is ok,
    failed or timeout. `timeout` is the launcher's; the backstop waits 15 s longer."""
    rc, out, err, wall = run_in_group(cmd, env, timeout + 15)
    result = last_json(out, "chains")
    if rc is None or rc == 124:  # 124: ferryrun's exit code for --timeout (hydra's too)
        status = "timeout"
    elif rc != 0 or result is None or result.get("errors", 0) != 0:
        status = "failed"
    else:
        status = "ok"
    return status, rc, wall, result, (err or "").strip()


def missing_program(bin_dir, programs, script):
    """None when every program is in bin_dir, else the message that names the first missing one
    and the script that builds it."""
    for prog in programs:
        if not (Path(bin_dir) / prog).exists():
            return f"{Path(bin_dir) / prog} is missing; build it first ({script} does)"
    return None


def results_dir(out, name, stamp_format):
    """The run's results folder, created: --out if given, else results/<name>-<stamp>."""
    stamp = datetime.datetime.now().strftime(stamp_format)
    d = (Path(out) if out else ROOT / "results" / f"{name}-{stamp}").resolve()
    d.mkdir(parents=True, exist_ok=True)
    return d


def c2c_probe(bin_dir, timeout=10):
    """The cache-line round trip between cores 0 and 1 in ns (ferry-c2c), or None when the
    probe is not built, the machine has one core, or it fails. On a virtual machine this moves
    when the host moves the guest's cores, and shared-memory rates move with it: the drivers
    log it next to every run (see ferry-c2c's header)."""
    prog = Path(bin_dir) / "ferry-c2c"
    if not prog.exists() or (os.cpu_count() or 1) < 2:
        return None
    try:
        out = subprocess.run([str(prog)], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    j = last_json(out.stdout, "c2c")
    return round(j["round_trip_ns"], 1) if out.returncode == 0 and j else None


def c2c_summary(values):
    """One line for a results summary: how the probe read over the runs."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return "core-to-core cache-line round trip: not measured (ferry-c2c not built)"
    slow = sum(1 for x in v if x > 150)
    return (f"core-to-core cache-line round trip before each run (ferry-c2c): median {v[len(v) // 2]:.0f} ns, "
            f"{v[0]:.0f}..{v[-1]:.0f}; {slow} of {len(v)} runs above 150 ns (the host had placed the two "
            f"cores apart: shared-memory rates drop, ferry's most)")


def git_rev():
    """The commit that ran, with "-dirty" if the tree had uncommitted changes; "unknown"
    outside a git checkout."""
    try:
        return subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
