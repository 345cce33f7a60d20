#!/usr/bin/env python3
"""The controller under a grown state: dw_wlm_cli as Slurm calls it, at 0 to 10,000 persistent
instances and 0 to 1,000 live job sessions (issue 11).

For each row, a fresh state is seeded with the controller stopped (bench/loadseed: objects as
the lifecycle makes them, written through the store's typed tables; the job sessions are set up
and not yet running), then a controller and an agent start as separate processes and each call
is timed as a whole process (exec included), as slurmctld runs it:

- `job_process`, `paths` (of a set-up job), `pools`, `show_sessions`: median and 99th
  percentile of --runs calls;
- an empty job (`#DW jobdw capacity=` one grain, no stages): setup, paths, pre_run, post_run,
  teardown, one after the other; median of --jobs;
- --clients clients each running setup, paths, teardown in a loop for --seconds: job
  lifecycles completed per second;
- the CPU each of those lifecycles cost the controller, the agent, the `dw_wlm_cli` processes
  (three per lifecycle) and this harness: on 2 cores the rate is CPU-bound, and these columns
  say where it goes;
- the controller's resident memory at the end (VmRSS) and its peak (VmHWM).

`dw_wlm_cli` is --wlm-binary (the small binary, bin/dw_wlm_cli, when it is built; else
--binary). --profile DIR writes each row's controller and agent CPU profiles there
(SPILLWAY_CPUPROFILE).

Usage: python3 bench/load_bench.py [--binary bin/spillway] [--wlm-binary bin/dw_wlm_cli]
       [--rows 0:0,1000:0,10000:0,0:1000,10000:1000] [--runs 100] [--profile DIR] [--label after] [--no-write]
Needs root (the agent mounts the empty job's instance).
"""
import argparse
import datetime
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks_md import write_section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pct(times, p):
    times = sorted(times)
    return times[min(len(times) - 1, int(round(p / 100 * len(times) + 0.5)) - 1)]


def rss(pid):
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) / 1024
    return out


def cpu_seconds(pid):
    """user + system CPU time of a running process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def own_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def spawn_cpu(argv, runs=40):
    """The median CPU (ms) one process of argv costs, as the harness starts it: the machine's
    own speed at starting processes, to compare runs on different days."""
    times = []
    for _ in range(runs):
        before = children_cpu()
        subprocess.run(argv, capture_output=True)
        times.append((children_cpu() - before) * 1000)
    return statistics.median(times)


def run_row(a, persistent, jobs):
    d = tempfile.mkdtemp(prefix="spillway-load-bench-", dir="/var/tmp")
    cfg = os.path.join(d, "spillway.toml")
    capacity = 16 << 30
    with open(cfg, "w") as f:
        f.write(f'''[controller]
state_dir = "{d}/state"
socket = "{d}/controller.sock"
mount_root = "{d}/mounts"
[[pool]]
name = "wlm_pool"
granularity = "1MiB"
[stage]
allow_root = true
[agent]
name = "bench1"
pool = "wlm_pool"
ssd_path = "{d}/ssd"
capacity = "{capacity}"
listen = "unix:{d}/agent.sock"
controller = "unix:{d}/controller.sock"
[client]
controller = "unix:{d}/controller.sock"
''')
    seeded = subprocess.run([a.seed, "--config", cfg, "--persistent", str(persistent), "--jobs", str(jobs),
                             "--node", "bench1", "--capacity", str(capacity)], capture_output=True, text=True)
    if seeded.returncode != 0:
        sys.exit(f"seeding: {seeded.stdout}{seeded.stderr}")
    print(f"  {seeded.stdout.strip()}", flush=True)
    link = os.path.join(d, "dw_wlm_cli")
    os.symlink(os.path.abspath(a.wlm_binary), link)
    env = {"PATH": "/usr/bin:/bin", "SPILLWAY_CONFIG": cfg}
    logs = open(os.path.join(d, "daemons.log"), "w")
    daemons = []
    for name in ("controller", "agent"):
        denv = dict(os.environ)
        if a.profile:
            os.makedirs(a.profile, exist_ok=True)
            denv["SPILLWAY_CPUPROFILE"] = os.path.join(os.path.abspath(a.profile), f"{name}-{persistent}-{jobs}.pprof")
        daemons.append(subprocess.Popen([a.binary, name, "--config", cfg], stdout=logs, stderr=logs, env=denv))
    result = {}
    try:
        deadline = time.time() + 120
        while subprocess.run([link, "--function", "pools"], env=env, capture_output=True, text=True).stdout.find('"quantity":16384') < 0:
            if time.time() > deadline:
                sys.exit("the daemons did not come up; see " + logs.name)
            time.sleep(0.2)
        script = os.path.join(d, "script")
        with open(script, "w") as f:
            f.write("#!/bin/bash\n#SBATCH -N 1\n#DW jobdw type=scratch access_mode=striped capacity=1MiB\nsrun app\n\0")
        nodefile = os.path.join(d, "nodes")
        with open(nodefile, "w") as f:
            f.write("bench1\n")

        def call(*args):
            p = subprocess.run([link, "--function", *args], env=env, capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"dw_wlm_cli {' '.join(args)}: {p.stdout}{p.stderr}")

        def timed(*args):
            t0 = time.perf_counter()
            call(*args)
            return time.perf_counter() - t0

        def setup(token):
            call("setup", "--token", token, "--caller", "SLURM", "--user", "0", "--groupid", "0", "--capacity", "wlm_pool:1MiB", "--job", script)

        setup("1")
        calls = {
            "job_process": ("job_process", "--job", script),
            "paths": ("paths", "--job", script, "--token", "1", "--pathfile", os.path.join(d, "path")),
            "pools": ("pools",),
            "show_sessions": ("show_sessions",),
            "show_instances": ("show_instances",),
            "show_configurations": ("show_configurations",),
        }
        for name, args in calls.items():
            call(*args)
            times = [timed(*args) for _ in range(a.runs)]
            result[name] = (statistics.median(times), pct(times, 99))
        call("teardown", "--token", "1", "--job", script, "--hurry")

        def empty_job(token):
            t0 = time.perf_counter()
            setup(token)
            call("paths", "--job", script, "--token", token, "--pathfile", os.path.join(d, "path" + token))
            call("pre_run", "--token", token, "--job", script, "--nodehostnamefile", nodefile)
            call("post_run", "--token", token, "--job", script)
            call("teardown", "--token", token, "--job", script)
            return time.perf_counter() - t0

        result["empty_job"] = statistics.median([empty_job(str(100 + i)) for i in range(a.jobs)])

        done, errors, stop = [0], [], time.time() + a.seconds
        lock = threading.Lock()

        def client(c):
            i = 0
            while time.time() < stop:
                token = str(1000000 + c * 100000 + i)
                i += 1
                try:
                    setup(token)
                    call("paths", "--job", script, "--token", token, "--pathfile", os.path.join(d, "p" + token))
                    call("teardown", "--token", token, "--job", script)
                except RuntimeError as e:
                    with lock:
                        errors.append(str(e))
                    return
                with lock:
                    done[0] += 1

        cpu0 = [cpu_seconds(p.pid) for p in daemons] + [children_cpu(), own_cpu()]
        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result["rate"] = done[0] / (time.perf_counter() - t0)
        cpu1 = [cpu_seconds(p.pid) for p in daemons] + [children_cpu(), own_cpu()]
        # CPU per lifecycle, in ms: controller, agent, dw_wlm_cli processes, this harness
        result["cpu"] = [(after - before) * 1000 / max(done[0], 1) for before, after in zip(cpu0, cpu1)]
        if errors:
            print(f"  {len(errors)} clients stopped on an error, the first: {errors[0][:300]}")
        result["mem"] = rss(daemons[0].pid)
    finally:
        for p in daemons:
            p.terminate()
        for p in daemons:
            p.wait(timeout=60)
        subprocess.run(["umount", "-l", "-R", f"{d}/mounts"], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "bin", "spillway"))
    ap.add_argument("--wlm-binary", default="", help="the dw_wlm_cli run as Slurm runs it (default: bin/dw_wlm_cli if built, else --binary)")
    ap.add_argument("--profile", default="", help="write the daemons' CPU profiles into this directory")
    ap.add_argument("--seed", default=os.path.join(ROOT, "bin", "loadseed"), help="bench/loadseed built (go build -o bin/loadseed ./bench/loadseed)")
    ap.add_argument("--rows", default="0:0,1000:0,10000:0,0:1000,10000:1000", help="persistent:jobs,...")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--label", default="", help="a word naming the build measured (before/after)")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    if not a.wlm_binary:
        small = os.path.join(ROOT, "bin", "dw_wlm_cli")
        a.wlm_binary = small if os.path.exists(small) else a.binary
    if os.geteuid() != 0:
        sys.exit("run as root: the agent mounts instances")
    calibration = (spawn_cpu(["/bin/true"]), spawn_cpu([a.wlm_binary, "--help"]))
    print(f"this machine: /bin/true costs {calibration[0]:.2f} ms of CPU per process, `{os.path.basename(a.wlm_binary)} --help` {calibration[1]:.2f} ms", flush=True)
    rows = []
    for spec in a.rows.split(","):
        persistent, jobs = (int(x) for x in spec.split(":"))
        print(f"{persistent} persistent instances, {jobs} live job sessions", flush=True)
        r = run_row(a, persistent, jobs)
        rows.append((persistent, jobs, r))
        print(f"  {r}", flush=True)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ms = lambda s: f"{s*1000:.0f}" if s >= 0.1 else f"{s*1000:.1f}"
    label = f" ({a.label})" if a.label else ""
    lines = [f"## The controller under a grown state{label}", "",
             f"Measured {now} on {os.cpu_count()} cores with `python3 bench/load_bench.py --runs {a.runs} --jobs {a.jobs} "
             f"--clients {a.clients} --seconds {a.seconds:g}` (SQLite; state seeded by bench/loadseed; controller and agent as separate "
             f"processes; each call a whole dw_wlm_cli process). Times in ms, median / 99th percentile; the empty job is "
             f"setup, paths, pre_run, post_run, teardown (median of {a.jobs}); the rate is setup, paths, teardown lifecycles "
             f"per second over {a.clients} concurrent clients, and the CPU milliseconds each of them cost the controller, "
             f"the agent, the three `{os.path.basename(a.wlm_binary)}` processes and the harness. This machine's speed at "
             f"starting processes, measured in the same run: `/bin/true` costs {calibration[0]:.2f} ms of CPU, "
             f"`{os.path.basename(a.wlm_binary)} --help` {calibration[1]:.2f} ms.", "",
             "| persistent | live jobs | `job_process` | `paths` | `pools` | `show_sessions` | `show_instances` | `show_configurations` | empty job | lifecycles/s | CPU ms per lifecycle: controller / agent / dw_wlm_cli / harness | controller RSS / peak (MiB) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for persistent, jobs, r in rows:
        cells = [f"{ms(r[n][0])} / {ms(r[n][1])}" for n in ("job_process", "paths", "pools", "show_sessions", "show_instances", "show_configurations")]
        cpu = " / ".join(f"{x:.1f}" for x in r["cpu"])
        lines.append(f"| {persistent:,} | {jobs:,} | " + " | ".join(cells) +
                     f" | {ms(r['empty_job'])} | {r['rate']:.1f} | {cpu} | {r['mem']['VmRSS']:.0f} / {r['mem']['VmHWM']:.0f} |")
    text = "\n".join(lines)
    print(text)
    if not a.no_write:
        write_section("load" + ("-" + a.label if a.label else ""), text)


if __name__ == "__main__":
    main()
