#!/usr/bin/env python3
"""Speed benchmark of bbsim (issue 4, deliver item 6). Not a test: it measures and records.

Prints the figures and writes them into BENCHMARKS.md (repository root) between the markers
<!-- bbsim:begin --> and <!-- bbsim:end -->, creating the file or the markers if absent and
leaving every other part of the file as it was.

    python bench/bbsim_speed.py            # needs bbsim installed: pip install ./sim
    python bench/bbsim_speed.py --no-write # print only

Each figure is the median of --repeat runs (default 3) in one warm process (imports done,
machine file parsed once, as in a long-lived planner session); the cold CLI wall time of the
replay, imports included, is reported separately.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks_md import write_section

ROOT = Path(__file__).resolve().parents[1]
SWEEP_NODES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192]


def median_time(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print, do not touch BENCHMARKS.md")
    args = ap.parse_args()

    import darshan
    from bbsim.darshan_ingest import read_darshan
    from bbsim.ior import IorSpec, run_point, sweep
    from bbsim.machine import load_machine
    from bbsim.replay import ReplayJob, place_jobs, replay
    from bbsim.validation import interference_rows

    t = time.perf_counter()
    trinity = load_machine("trinity")
    trinity.topology
    load_s = time.perf_counter() - t
    n_compute, n_bb = len(trinity.compute_nids), len(trinity.bb_nids)

    full_s, full = median_time(lambda: run_point(trinity, IorSpec(nodes=n_compute, servers=None)), args.repeat)
    p8k_s, _ = median_time(lambda: run_point(trinity, IorSpec(nodes=8192, servers=230)), args.repeat)
    sweep_s, pts = median_time(lambda: sweep(trinity, IorSpec(nodes=1, servers=230), SWEEP_NODES), args.repeat)
    inter_s, _ = median_time(interference_rows, args.repeat)

    logs = Path(darshan.__file__).parent / "examples" / "example_logs"
    a_log, b_log = logs / "sample-badost.darshan", logs / "example.darshan"

    def two_log_replay():
        a, b = read_darshan(a_log, 24), read_darshan(b_log, 24)
        nids, servers = place_jobs(trinity, [a.nodes, b.nodes], 32)
        jobs = [ReplayJob(a.name, a.phases, nids[0], servers[0]),
                ReplayJob(b.name, b.phases, nids[1], servers[1], offset=-3.4)]
        return replay(trinity, jobs)
    replay_s, rep = median_time(two_log_replay, args.repeat)

    cmd = [sys.executable, "-m", "bbsim", "replay", str(a_log), str(b_log), "--ranks-per-node", "24",
           "--servers", "32", "--no-matrix", "--json"]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    cli_s = time.perf_counter() - t

    rows = [
        ("one IOR point, full Trinity: {} compute nodes x {} servers, each node striped over all "
         "({} classes, {} nnz)".format(n_compute, n_bb, full["stats"]["classes"], full["stats"]["nnz"]),
         full_s, 2.0),
        ("Trinity sweep: 15 node counts (1-8192) x {write, read}, 230 servers (30 points)", sweep_s, 10.0),
        ("two-log Darshan replay (sample-badost + example, 2048 ranks each, Trinity, 32 servers; "
         "reading both logs included; {} events, {} solves)".format(rep.events, rep.solves), replay_s, 1.0),
        ("one IOR point, 8192 nodes x 230 servers", p8k_s, 0.5),
        ("two-job interference (2048 + 512 nodes, shared and disjoint servers, 3 solves)", inter_s, 0.5),
    ]
    host = f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["## bbsim (burst-buffer simulator)", "",
             f"Measured {stamp} on {host} with `python bench/bbsim_speed.py` "
             f"(median of {args.repeat} runs in a warm process; machine file parse + topology build "
             f"{load_s:.2f} s once, not included).", "",
             "| workload | seconds | target | |", "|---|---:|---:|---|"]
    for name, secs, target in rows:
        lines.append(f"| {name} | {secs:.3f} | ≤ {target:g} | {'ok' if secs <= target else 'MISSED'} |")
    lines += ["", f"Cold command line, imports included: `bbsim replay` of the two logs (no slowdown matrix) "
              f"took {cli_s:.2f} s wall."]
    block = "\n".join(lines)
    print(block)

    if not args.no_write:
        write_section("bbsim", block)
    return 0 if all(secs <= target for _, secs, target in rows[:3]) else 1


if __name__ == "__main__":
    sys.exit(main())
