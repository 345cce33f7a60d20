#!/usr/bin/env python3
"""Core benchmarks of `spillway run` on this machine, against this machine's own ceilings.

Prints the figures and writes them into BENCHMARKS.md between <!-- core:begin --> and
<!-- core:end -->. Measures, in one run:

  * the overhead of `spillway run` for an empty job: setup to teardown (Spillway's own
    "total" line) and the whole command's wall clock, median of 20;
  * stage-in of one 1 GiB file and of a 10,000-file directory, against `cp -a` of the same
    data into the same file system, medians of 3 after a warm-up.

Usage: python3 bench/core_bench.py [--binary bin/spillway] [--runs 20] [--dir DIR] [--no-write]
Needs a built binary (scripts/install-deps builds it). Runs as whoever starts it.
"""
import argparse
import datetime
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks_md import write_section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(binary, home, script, cwd):
    env = dict(os.environ, SPILLWAY_HOME=home)
    t0 = time.perf_counter()
    p = subprocess.run([binary, "run", script], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"spillway run {script} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    phases = {m.group(1): float(m.group(2)) for m in re.finditer(r"\[spillway\] (\w+)\s+([0-9.]+)s", p.stderr)}
    total = float(re.search(r"total ([0-9.]+)s", p.stderr).group(1))
    return wall, total, phases


def timed(cmd):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t0


def write_config(home, capacity="16GiB"):
    os.makedirs(home, exist_ok=True)
    with open(os.path.join(home, "spillway.toml"), "w") as f:
        f.write(f'[agent]\npool = "wlm_pool"\nssd_path = "{home}/ssd"\ncapacity = "{capacity}"\n'
                f'[controller]\nstate_dir = "{home}/state"\nsocket = "{home}/controller.sock"\nmount_root = "{home}/mounts"\n'
                f'[client]\ncontroller = "unix:{home}/controller.sock"\n[stage]\nallow_root = true\n')


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "bin", "spillway"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one under /var/tmp)")
    ap.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    a = ap.parse_args()
    if not os.access(a.binary, os.X_OK):
        sys.exit(f"{a.binary} not found: run scripts/install-deps first")
    work = a.dir or tempfile.mkdtemp(prefix="spillway-bench-", dir="/var/tmp")
    home = os.path.join(work, "home")
    pfs = os.path.join(work, "pfs")
    os.makedirs(pfs, exist_ok=True)
    write_config(home)

    # 1. Empty job overhead.
    empty = os.path.join(work, "empty.sh")
    with open(empty, "w") as f:
        f.write("#!/bin/sh\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\ntrue\n")
    run(a.binary, home, empty, work)  # warm-up: first start creates the home
    walls, totals = [], []
    for _ in range(a.runs):
        w, t, _ = run(a.binary, home, empty, work)
        walls.append(w)
        totals.append(t)

    # 2. Stage-in of one 1 GiB file.
    big = os.path.join(pfs, "big.dat")
    with open(big, "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(1024):
            f.write(chunk)
    big_job = os.path.join(work, "big.sh")
    with open(big_job, "w") as f:
        f.write(f"#!/bin/sh\n#DW jobdw type=scratch access_mode=striped capacity=2GiB\n"
                f"#DW stage_in type=file source={big} destination=$DW_JOB_STRIPED/big.dat\ntrue\n")
    # 3. Stage-in of a 10,000-file directory (4 KiB files in 100 directories).
    tree = os.path.join(pfs, "tree")
    for d in range(100):
        sub = os.path.join(tree, f"d{d:03d}")
        os.makedirs(sub, exist_ok=True)
        for i in range(100):
            with open(os.path.join(sub, f"f{i:03d}"), "wb") as f:
                f.write(os.urandom(4096))
    tree_job = os.path.join(work, "tree.sh")
    with open(tree_job, "w") as f:
        f.write(f"#!/bin/sh\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n"
                f"#DW stage_in type=directory source={tree} destination=$DW_JOB_STRIPED/tree\ntrue\n")

    copy_dst = os.path.join(home, "ssd", "cp-baseline")  # the same file system as the fragments

    def remove(path):
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)

    def cp_baseline(src, flush):
        remove(copy_dst)
        subprocess.run(["sync"], check=True)
        t0 = time.perf_counter()
        subprocess.run(["cp", "-a", src, copy_dst], check=True)
        if flush:  # the stage fsyncs every file, as DataWarp does; cp does not
            subprocess.run(["sync", "-f", copy_dst], check=True)
        t = time.perf_counter() - t0
        remove(copy_dst)
        return t

    results = {}
    for name, src, job in (("1 GiB file", big, big_job), ("10,000-file directory", tree, tree_job)):
        cp_baseline(src, False)
        run(a.binary, home, job, work)  # warm-up
        cps, flushed, stages = [], [], []
        for _ in range(3):
            cps.append(cp_baseline(src, False))
            flushed.append(cp_baseline(src, True))
            subprocess.run(["sync"], check=True)
            stages.append(run(a.binary, home, job, work)[2]["data_in"])
        results[name] = (statistics.median(stages), statistics.median(cps), statistics.median(flushed))

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## Core: `spillway run` and staging",
        "",
        f"Measured {now} on {os.cpu_count()} cores, Linux {platform.release()}, with `python3 bench/core_bench.py` "
        f"(embedded mode; the pool's SSD path and the `cp -a` baseline on the same file system, {work}).",
        "",
        "| figure | Spillway | `cp -a` | ratio | `cp -a` + `sync -f` | ratio |",
        "|---|---:|---:|---:|---:|---:|",
        f"| empty job, setup to teardown (median of {a.runs}) | {statistics.median(totals)*1000:.0f} ms | | | | |",
        f"| empty job, whole `spillway run` command, the home's server already running (median of {a.runs}) | {statistics.median(walls)*1000:.0f} ms | | | | |",
    ]
    for name, (stage_s, cp_s, flush_s) in results.items():
        size = "1 GiB" if "GiB" in name else "10,000 × 4 KiB"
        lines.append(f"| stage_in of a {name} ({size}), data_in phase, median of 3 | {stage_s:.3f} s | {cp_s:.3f} s | {cp_s/stage_s:.2f} | {flush_s:.3f} s | {flush_s/stage_s:.2f} |")
    lines += ["", "Ratio = the baseline's time / Spillway's time (1.00 = as fast as the baseline). The data_in phase includes "
              "the stage worker's start as the job's user, the plan, the capacity reservation, the copy with an fsync of "
              "every file (DataWarp's rule; `cp -a` flushes nothing, hence the second baseline, which flushes the file "
              "system once at the end), and the controller noticing the end."]
    text = "\n".join(lines)
    print(text)
    if not a.no_write:
        write_section("core", text)
    # The home's server outlives the commands (it exits when idle): stop it before the home goes.
    subprocess.run([a.binary, "home", "stop", "--force"], env=dict(os.environ, SPILLWAY_HOME=home),
                   capture_output=True)
    if not a.dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
