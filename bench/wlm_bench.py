#!/usr/bin/env python3
"""Latency of the dw_wlm_cli calls Slurm makes inside slurmctld's locks.

`job_process` runs inside the submit RPC and `paths` inside the scheduler, both under Slurm's
ValidateTimeout (5 s by default); `pools` and `show_*` run every 30 s. This starts a
controller and an agent as separate processes (as a site runs them), drives one job to the
point Slurm calls `paths`, and times each call as a whole process (exec included), median of
50. Figures go to BENCHMARKS.md between <!-- wlm:begin --> and <!-- wlm:end -->.

Usage: python3 bench/wlm_bench.py [--binary bin/spillway] [--runs 50] [--no-write]
Needs root (the agent mounts the instance and chowns namespaces).
"""
import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks_md import write_section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "bin", "spillway"))
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the agent mounts instances")
    d = tempfile.mkdtemp(prefix="spillway-wlm-bench-", dir="/var/tmp")
    cfg = os.path.join(d, "spillway.toml")
    with open(cfg, "w") as f:
        f.write(f'''[controller]
state_dir = "{d}/state"
socket = "{d}/controller.sock"
mount_root = "{d}/mounts"
[stage]
allow_root = true
[agent]
name = "bench1"
pool = "wlm_pool"
ssd_path = "{d}/ssd"
capacity = "4GiB"
listen = "unix:{d}/agent.sock"
controller = "unix:{d}/controller.sock"
heartbeat_interval = "1s"
[client]
controller = "unix:{d}/controller.sock"
''')
    link = os.path.join(d, "dw_wlm_cli")
    os.symlink(os.path.abspath(a.binary), link)
    env = {"PATH": "/usr/bin:/bin", "SPILLWAY_CONFIG": cfg}
    logs = open(os.path.join(d, "daemons.log"), "w")
    daemons = [subprocess.Popen([a.binary, name, "--config", cfg], stdout=logs, stderr=logs) for name in ("controller", "agent")]
    try:
        deadline = time.time() + 20
        while subprocess.run([link, "--function", "pools"], env=env, capture_output=True, text=True).stdout.find('"quantity":4') < 0:
            if time.time() > deadline:
                sys.exit("the daemons did not come up; see " + logs.name)
            time.sleep(0.1)
        script = os.path.join(d, "script")
        with open(script, "w") as f:
            f.write("#!/bin/bash\n#SBATCH -N 1\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n"
                    "#DW stage_in type=file source=/etc/hostname destination=$DW_JOB_STRIPED/h\nsrun app\n\0")

        def call(*args):
            p = subprocess.run([link, "--function", *args], env=env, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"dw_wlm_cli {' '.join(args)}: {p.stdout}{p.stderr}")

        call("setup", "--token", "1", "--caller", "SLURM", "--user", "0", "--groupid", "0", "--capacity", "wlm_pool:1GiB", "--job", script)
        calls = {
            "job_process": ("job_process", "--job", script),
            "paths": ("paths", "--job", script, "--token", "1", "--pathfile", os.path.join(d, "path")),
            "pools": ("pools",),
            "show_sessions": ("show_sessions",),
            "show_instances": ("show_instances",),
            "real_size": ("real_size", "--token", "1"),
        }
        results = {}
        for name, args in calls.items():
            call(*args)  # warm-up
            times = []
            for _ in range(a.runs):
                t0 = time.perf_counter()
                call(*args)
                times.append(time.perf_counter() - t0)
            times.sort()
            results[name] = (statistics.median(times), times[int(len(times) * 0.95) - 1])
        call("teardown", "--token", "1", "--job", script, "--hurry")
    finally:
        for p in daemons:
            p.terminate()
        for p in daemons:
            p.wait(timeout=20)
        shutil.rmtree(d, ignore_errors=True)

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["## dw_wlm_cli latency (what slurmctld waits for)", "",
             f"Measured {now} on {os.cpu_count()} cores with `python3 bench/wlm_bench.py` (controller and agent as separate "
             f"processes on this host; each call is a whole process, exec included; {a.runs} calls each).", "",
             "| function | median | 95th percentile | Slurm's budget |", "|---|---:|---:|---|"]
    budgets = {"job_process": "ValidateTimeout (5 s), inside the submit RPC", "paths": "ValidateTimeout (5 s), inside the scheduler",
               "pools": "OtherTimeout, every 30 s", "show_sessions": "OtherTimeout, every 30 s", "show_instances": "OtherTimeout, every 30 s",
               "real_size": "StageInTimeout"}
    for name, (med, p95) in results.items():
        lines.append(f"| `{name}` | {med*1000:.1f} ms | {p95*1000:.1f} ms | {budgets[name]} |")
    text = "\n".join(lines)
    print(text)
    if not a.no_write:
        write_section("wlm", text)

if __name__ == "__main__":
    main()
