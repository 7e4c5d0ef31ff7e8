#!/usr/bin/env python3
"""The failure detector's monitoring ring against the job's size, simulated: ferry-monitor-sim
(bench/monitor_sim.cpp, the runtime's own RingMonitor with every rank virtual, in one process)
for each job size and failure.

For each size (--ranks) and failure (--kills: one rank's process, --several ranks at once, a
whole host), one run: steady monitoring messages per process per second (sent and received,
mean and max), the time until every survivor knew of every failed rank, and the notices each
survivor sent for it. A run fails (and the script exits 1) when a survivor never learned of a
failure or a survivor was blamed.

  python3 bench/monitor_sim.py --ranks 1000,10000,100000
Results in results/monitor-sim-<stamp>/: raw.jsonl (every run's line), summary.json, table.md,
and plot.png where /usr/bin/python3 has matplotlib.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402

KILLS = ["one", "several", "host"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=lambda t: benchkit.int_list(t, "--ranks", 2), default=[1000, 10000, 100000])
    ap.add_argument("--per-host", type=benchkit.positive, default=64)
    ap.add_argument("--kills", type=benchkit.name_list(KILLS), default=KILLS)
    ap.add_argument("--several", type=benchkit.positive, default=10, help="ranks failed at once for 'several'")
    ap.add_argument("--timeout-ms", type=benchkit.positive, default=4000)
    ap.add_argument("--check-ms", type=benchkit.positive, default=200)
    ap.add_argument("--bin", default=str(benchkit.ROOT / "build" / "bin"))
    ap.add_argument("--out", help="results folder (default results/monitor-sim-<stamp>)")
    args = ap.parse_args()
    bin_dir = Path(args.bin)
    missing = benchkit.missing_program(bin_dir, ["ferry-monitor-sim"], "cmake --build build")
    if missing:
        ap.error(missing)
    out = benchkit.results_dir(args.out, "monitor-sim", "%Y%m%d-%H%M%S")
    rows, bad = [], 0
    with open(out / "raw.jsonl", "w") as raw:
        for n in args.ranks:
            for kill in args.kills:
                cmd = [str(bin_dir / "ferry-monitor-sim"), "--ranks", str(n), "--per-host", str(args.per_host),
                       "--kill", kill, "--kills", str(args.several), "--timeout-ms", str(args.timeout_ms),
                       "--check-ms", str(args.check_ms)]
                p = subprocess.run(cmd, capture_output=True, text=True)
                row = benchkit.last_json(p.stdout, "monitor_sim")
                if row is None:
                    print(f"n={n} {kill}: no result (exit {p.returncode}): {p.stderr[:500]}", file=sys.stderr)
                    bad += 1
                    continue
                row["exit"] = p.returncode
                bad += p.returncode != 0
                raw.write(json.dumps(row) + "\n")
                raw.flush()
                rows.append(row)
                print(f"n={n:<7} {kill:8} failed {row['failed']:3}  all knew {row['all_knew_ms']:8.1f} ms  "
                      f"beats/s/process {row['steady_sent_per_s_mean']:.2f} (max {row['steady_sent_per_s_max']:.0f})  "
                      f"notices/survivor {row['notices_sent_median']:.0f}  links {row['links_max']}  "
                      f"[{row['wall_s']:.1f} s]", flush=True)
    summary = {"timestamp": time.strftime("%Y-%m-%d %H:%M"), "commit": benchkit.git_rev(), "per_host": args.per_host,
               "timeout_ms": args.timeout_ms, "check_ms": args.check_ms, "rows": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [f"# The monitoring ring, simulated ({args.per_host} ranks per host, FERRY_PEER_TIMEOUT_MS="
             f"{args.timeout_ms}, FERRY_PEER_CHECK_MS={args.check_ms})", "",
             "| ranks | failure | failed | first knew (ms) | every survivor knew (ms) | heartbeats sent /s/process "
             "(mean, max) | received (mean, max) | notices per survivor | links per rank | false failures |",
             "|---:|---|---:|---:|---:|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['ranks']} | {r['kill']} | {r['failed']} | {r['first_knew_ms']:.0f} | {r['all_knew_ms']:.0f} | "
                     f"{r['steady_sent_per_s_mean']:.2f}, {r['steady_sent_per_s_max']:.0f} | "
                     f"{r['steady_received_per_s_mean']:.2f}, {r['steady_received_per_s_max']:.0f} | "
                     f"{r['notices_sent_median']:.0f} | {r['links_max']} | {r['false_failures']} |")
    lines += ["", "A process kill is seen first by its host's process watch (one to two check intervals); a host's "
              "ranks, stopped whole, by their guardians' silence (the timeout after the last heartbeat). Notices "
              "carry each failure to every survivor."]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    plot(out, rows)
    print(f"results in {out}")
    return 1 if bad else 0


def plot(out, rows):
    """plot.png through /usr/bin/python3 (Debian's matplotlib), when it is there."""
    script = r"""
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [json.loads(l) for l in open(sys.argv[1])]
fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
for kill in sorted({r["kill"] for r in rows}):
    rs = sorted((r for r in rows if r["kill"] == kill), key=lambda r: r["ranks"])
    a.plot([r["ranks"] for r in rs], [r["all_knew_ms"] for r in rs], "o-", label=kill)
    b.plot([r["ranks"] for r in rs], [r["notices_sent_median"] for r in rs], "o-", label=kill + ": notices / survivor")
rs = sorted((r for r in rows if r["kill"] == "one"), key=lambda r: r["ranks"]) or sorted(rows, key=lambda r: r["ranks"])
b.plot([r["ranks"] for r in rs], [r["steady_sent_per_s_max"] for r in rs], "k--", label="heartbeats / s / process (max)")
for ax in (a, b):
    ax.set_xscale("log")
    ax.set_xlabel("ranks")
    ax.legend()
a.set_ylabel("ms until every survivor knew")
b.set_yscale("log")
b.set_ylabel("messages per process")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
"""
    if not os.path.exists("/usr/bin/python3"):
        return
    subprocess.run(["/usr/bin/python3", "-c", script, str(out / "raw.jsonl"), str(out / "plot.png")],
                   capture_output=True, text=True)


if __name__ == "__main__":
    sys.exit(main())
