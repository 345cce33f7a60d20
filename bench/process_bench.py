#!/usr/bin/env python3
"""What one dw_wlm_cli process costs: the full spillway binary against the small dw_wlm_cli.

Slurm runs dw_wlm_cli as a whole process several times per job (job_process, setup, paths,
pre_run, post_run, teardown, ...) and every 30 s for its tables, so a process start is paid
over and over. This times `dw_wlm_cli --help` (start-up alone) and `dw_wlm_cli --function
pools` (a call to a running controller, started here as its own process, as wlm_bench.py
does) run through each binary under the name dw_wlm_cli: CPU (user + system, from the
child's rusage) and wall time per process, median and 95th percentile of --runs runs.
Figures go to BENCHMARKS.md between <!-- process:begin --> and <!-- process:end -->.

Usage: python3 bench/process_bench.py [--binary bin/spillway] [--small bin/dw_wlm_cli]
                                      [--runs 200] [--no-write]
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


def measure(path, args, env, runs):
    """Runs path args runs times (output to /dev/null); returns the CPU and wall seconds of
    each run. The child is reaped with os.wait4, whose rusage is that child's alone."""
    devnull = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)]
    cpu, wall = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        pid = os.posix_spawn(path, [path, *args], env, file_actions=devnull)
        _, status, usage = os.wait4(pid, 0)
        wall.append(time.perf_counter() - t0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"process_bench: {path} {' '.join(args)} failed (exit {os.waitstatus_to_exitcode(status)})")
        cpu.append(usage.ru_utime + usage.ru_stime)
    return cpu, wall


def p95(xs):
    return sorted(xs)[max(0, int(len(xs) * 0.95) - 1)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "bin", "spillway"), help="the full spillway binary")
    ap.add_argument("--small", default=os.path.join(ROOT, "bin", "dw_wlm_cli"), help="the small dw_wlm_cli binary")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    a = ap.parse_args()
    for what, path in (("--binary", a.binary), ("--small", a.small)):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            sys.exit(f"process_bench: {path} is not an executable file: build it (scripts/install-deps builds bin/spillway "
                     f"and bin/dw_wlm_cli) or name it with {what}")
    if a.runs < 1:
        sys.exit("process_bench: --runs must be at least 1")

    d = tempfile.mkdtemp(prefix="spillway-process-bench-")
    cfg = os.path.join(d, "spillway.toml")
    with open(cfg, "w") as f:
        f.write(f'''[controller]
state_dir = "{d}/state"
socket = "{d}/controller.sock"
mount_root = "{d}/mounts"
[client]
controller = "unix:{d}/controller.sock"
''')
    # Both binaries are called dw_wlm_cli, as Slurm calls them: the full one through a link.
    full_dir, small_dir = os.path.join(d, "full"), os.path.join(d, "small")
    os.makedirs(full_dir)
    os.makedirs(small_dir)
    os.symlink(os.path.abspath(a.binary), os.path.join(full_dir, "dw_wlm_cli"))
    os.symlink(os.path.abspath(a.small), os.path.join(small_dir, "dw_wlm_cli"))
    binaries = {"spillway (full)": os.path.join(full_dir, "dw_wlm_cli"), "dw_wlm_cli (small)": os.path.join(small_dir, "dw_wlm_cli")}
    env = {"PATH": "/usr/bin:/bin", "SPILLWAY_CONFIG": cfg}
    log = open(os.path.join(d, "controller.log"), "w")
    controller = subprocess.Popen([a.binary, "controller", "--config", cfg], stdout=log, stderr=log)
    results = {}
    load = os.getloadavg()[0]  # other work on the host shows in the figures: say how much there was
    try:
        deadline = time.time() + 30
        probe = binaries["dw_wlm_cli (small)"]
        while subprocess.run([probe, "--function", "pools"], env=env, capture_output=True).returncode != 0:
            if controller.poll() is not None or time.time() > deadline:
                sys.exit("process_bench: the controller did not answer; see " + log.name)
            time.sleep(0.1)
        commands = {"`dw_wlm_cli --help`": ["--help"], "`dw_wlm_cli --function pools`": ["--function", "pools"]}
        for cmd, args in commands.items():
            outputs = {subprocess.run([path, *args], env=env, capture_output=True).stdout for path in binaries.values()}
            if len(outputs) != 1:
                sys.exit(f"process_bench: the two binaries answer {cmd} differently")
            for name, path in binaries.items():
                measure(path, args, env, 3)  # warm the page cache
                results[(cmd, name)] = measure(path, args, env, a.runs)
    finally:
        controller.terminate()
        controller.wait(timeout=20)
        shutil.rmtree(d, ignore_errors=True)

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["## One dw_wlm_cli process: the full binary and the small one", "",
             f"Measured {now} on {os.cpu_count()} cores (load average {load:.1f} at the start) with `python3 bench/process_bench.py` ({a.runs} processes each, "
             "after 3 to warm the page cache; CPU is user + system time from the child's rusage; `pools` asks a controller "
             "running on this host). Slurm starts dw_wlm_cli as a whole process several times per job: the CPU column is "
             "what each start costs the slurmctld host.", "",
             "| command | binary | CPU median | CPU p95 | wall median | wall p95 |", "|---|---|---:|---:|---:|---:|"]
    for (cmd, name), (cpu, wall) in results.items():
        lines.append(f"| {cmd} | {name} | {statistics.median(cpu)*1000:.2f} ms | {p95(cpu)*1000:.2f} ms | "
                     f"{statistics.median(wall)*1000:.2f} ms | {p95(wall)*1000:.2f} ms |")
    for cmd in dict.fromkeys(c for c, _ in results):
        full, small = (statistics.median(results[(cmd, n)][0]) for n in binaries)
        lines.append("")
        lines.append(f"{cmd}: the small binary costs {small*1000:.2f} ms of CPU per process, the full one {full*1000:.2f} ms "
                     f"({full/small:.1f} times as much)." if small > 0 else f"{cmd}: CPU below the clock's resolution.")
    text = "\n".join(lines)
    print(text)
    if not a.no_write:
        write_section("process", text)


if __name__ == "__main__":
    main()
